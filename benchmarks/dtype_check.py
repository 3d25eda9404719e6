"""Every generated kernel computes in its own dtype, checked without a GPU: each spec's kernels compiled for
sm_90 by Triton's own compiler (as ``isa_count.py`` does), in float64 and in float32, their PTX read.

A float64 kernel fails where its PTX holds
- floating-point arithmetic in float32 (any ``.f32`` instruction but a comparison: libdevice's float64
  functions compare the high word of a double as a float32 to pick a range, ``abs.f32`` and ``setp.f32``
  on it, which computes no value);
- a conversion from or to float32 (``cvt`` with an ``f32`` side);
- a constant that is a literal of the generated source rounded to float32 (0.9 as 0.8999999761581421: what
  Triton 3.6 made of a Python number passed to ``tl.fma``, ``tl.minimum`` or ``tl.maximum``).
A float32 kernel fails where its PTX holds any ``.f64`` instruction (a slow path: float64 runs at a
fraction of float32's rate), but in the tail of libdevice's ``sinf``/``cosf`` range reduction for huge
arguments (|x| > 105615, Payne-Hanek: a 64-bit integer product scaled as a double), a branch that
``tl.randn4x``'s Box-Muller angles, in [0, 2 pi), never take.

Each failure names the kernel, the line of generated source the instruction comes from (PTX ``.loc``) and
the instruction. Run by ``tests/test_dtype_check.py`` on every zoo spec; the compiler's rules change
between Triton versions (3.6 rounded those constants, 3.9 does not), so CI runs it under the oldest Triton
the package supports as well as the installed one.

    python benchmarks/dtype_check.py neurons/*.yaml [--dtype float64 float32]
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target, before flexsn_dsl or triton is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what an unset knob means in Triton 3.9, without its warning

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isa_count import compile_for_sm  # noqa: E402

from flexsn_dsl.compiler import compile_spec  # noqa: E402

# one value for each constexpr a generated kernel may take: every flag on, so that every branch compiles;
# small blocks and tiles of two steps (the tiled loop and the steps after it)
GIVEN = {"_BLOCK": 32, "_STAGES": 1, "_TC": 2, "_CONST_INIT": True, "_HAS_STATE_GRADS": True, "_HAS_FINAL_GRADS": True,
         "_WRITE_INIT_GRADS": True, "_CARRY_SUMS": True, "_ROWS": 1, "_COLS": 32, "_CP": 4, "_NP": 16, "_BLOCK_B": 16,
         "_BLOCK_K": 16, "_PRECISION": "ieee", "_TRAIN": True}
DTYPES = {"float64": (tl.float64, "*fp64"), "float32": (tl.float32, "*fp32")}
NO_VALUE = ("setp.", "abs.")  # float32 instructions that compute no value a float64 kernel uses (see above)
INSTRUCTION = re.compile(r"^\s*(?:@!?%p\d+\s+)?([a-z][\w.]*)\s+([^;]*);")
LOC = re.compile(r"^\s*\.loc\s+(\d+)\s+(\d+)\s+\d+")
LABEL = re.compile(r"^\$L__BB\w*:\s*(?://\s*(\S*))?")  # a basic block, with its LLVM name if any
TRIG_SLOW_PATH = "__internal_trig_reduction_slowpath.exit"  # from there to the next block: its tail
FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"')
LITERAL = re.compile(r"(?<![\w.])(\d+\.\d*(?:e[-+]?\d+)?|\d+e[-+]?\d+)")


def _float32_rounded(source: str) -> dict[str, str]:
    """The PTX spelling (``0d...``) of each literal of ``source`` rounded to float32, where that rounding
    changes it: such a constant in a float64 kernel is that literal taken as float32."""
    found = {}
    for text in set(LITERAL.findall(source)):
        value = float(text)
        rounded = struct.unpack("<f", struct.pack("<f", value))[0] if abs(value) < 3.4e38 else value
        if rounded != value:
            for v in (rounded, -rounded):
                found["0d" + struct.pack(">d", v).hex().upper()] = text
    return found


def _sources(ptx: str) -> dict[str, tuple[str, list[str]]]:
    """Each source file a PTX ``.file`` names: its short name (``generated`` for the spec's module) and its
    lines (none where it cannot be read)."""
    found = {}
    for index, path in FILE.findall(ptx):
        generated = path.startswith("<flexsn-dsl kernels ")
        path = path.removeprefix("<flexsn-dsl kernels ").removesuffix(">")
        found[index] = ("generated" if generated else Path(path).name,
                        Path(path).read_text().splitlines() if os.path.isfile(path) else [])
    return found


def problems(ptx: str, dtype: str, literals: dict[str, str]) -> list[str]:
    """What in ``ptx`` (a kernel compiled with ``dtype`` tensors) computes in the other dtype, one line each:
    the generated source line it comes from and the instruction."""
    sources, where, found, trig_slow_path = _sources(ptx), "", [], False
    for line in ptx.splitlines():
        if label := LABEL.match(line):
            trig_slow_path = TRIG_SLOW_PATH in (label.group(1) or "")
            continue
        if loc := LOC.match(line):
            name, text = sources.get(loc.group(1), ("?", []))
            number = int(loc.group(2))
            where = f"{name}:{number}" + (f" `{text[number - 1].strip()}`" if 0 < number <= len(text) else "")
            continue
        match = INSTRUCTION.match(line)
        if not match:
            continue
        op, operands = match.groups()
        parts = op.split(".")
        if dtype == "float64":
            wrong = ("f32" in parts and not op.startswith(NO_VALUE)) or (parts[0] == "cvt" and "f32" in parts)
            constants = [literals[c] for c in re.findall(r"0d[0-9A-F]{16}", operands) if c in literals]
            if constants:
                found.append(f"{where}: {line.strip()}  (the literal {constants[0]} rounded to float32)")
                continue
        else:
            wrong = "f64" in parts and not trig_slow_path
        if wrong:
            found.append(f"{where}: {line.strip()}")
    return found


def kernels(module) -> list:
    """The multi-step kernels of a generated module (not the cores they call), by name."""
    return [fn for name, fn in sorted(vars(module).items()) if name.endswith("_kernel") and hasattr(fn, "arg_names")]


def check(spec: Path, dtype: str) -> list[str]:
    """Every problem of every kernel of ``spec`` compiled for ``dtype``, each prefixed with the kernel."""
    compiled = compile_spec(spec)
    module = compiled.triton_module()
    literals = _float32_rounded(compiled.triton_source) if dtype == "float64" else {}
    tl_dtype, pointer = DTYPES[dtype]
    found = []
    for fn in kernels(module):
        given = {k: v for k, v in {**GIVEN, "_DTYPE": tl_dtype, "_DOT_DTYPE": tl_dtype}.items() if k in fn.arg_names}
        ptx = compile_for_sm(fn, given, warps=1, pointer=pointer).asm["ptx"]
        found += [f"{spec.name} {fn.__name__} ({dtype}), {p}" for p in problems(ptx, dtype, literals)]
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="+", type=Path)
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    args = parser.parse_args(argv)
    print(f"triton {triton.__version__}, sm_90")
    found = [p for spec in args.specs for dtype in args.dtype for p in check(spec, dtype)]
    print("\n".join(found) if found else f"{len(args.specs)} specs: every kernel computes in its dtype")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
