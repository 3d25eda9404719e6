"""Every generated kernel computes in its own dtype, checked without a GPU: each spec's kernels compiled for
sm_90 by Triton's own compiler (as ``isa_count.py`` does), in float64 and in float32, their PTX read.

A float64 kernel fails where its PTX holds
- floating-point arithmetic or a conversion in float32 (any instruction with an ``f32`` type) that computes
  a value of the kernel; libdevice's float64 functions compare the high word of a double as a float32 to
  pick a range, and its erf finds a range reduction's integer k in float32 and scales by 2 ** k, which is
  exact: those are told apart by where their results go (``_float32_uses``);
- a constant that is a literal of the generated source rounded to float32 (0.9 as 0.8999999761581421: what
  Triton 3.6 made of a Python number passed to ``tl.fma``, ``tl.minimum`` or ``tl.maximum``).
A float32 kernel fails where its PTX holds any ``.f64`` instruction (a slow path: float64 runs at a
fraction of float32's rate).

Each failure names the kernel, the line of generated source the instruction comes from (PTX ``.loc``) and
the instruction. Run by ``tests/test_dtype_check.py`` on every zoo spec; the compiler's rules change
between Triton versions (3.6 rounded those constants, 3.9 does not), so CI runs it under the oldest Triton
the package supports as well as the installed one. `--delays` checks the delay layers' kernels too, `--plastic
SYNAPSE NEURON` PlasticLinear's fused kernel of a synapse spec driving a neuron.

    python benchmarks/dtype_check.py neurons/*.yaml [--dtype float64 float32] [--delays] [--plastic SYN NEURON]
"""
from __future__ import annotations

import argparse
import os
import re
import struct
import sys
from pathlib import Path
from typing import Callable

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target, before flexsn_dsl or triton is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what an unset knob means in Triton 3.9, without its warning

import triton  # noqa: E402
import triton.language as tl  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isa_count import GPUTarget, compile_for_sm  # noqa: E402

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
FILE = re.compile(r'^\s*\.file\s+(\d+)\s+"([^"]*)"', re.M)
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


def _readers(instructions: list[tuple[str, str, list[str]]]) -> dict[str, list[int]]:
    """The instructions that read each register."""
    readers: dict[str, list[int]] = {}
    for i, (_, _, registers) in enumerate(instructions):
        for register in registers[1:]:
            readers.setdefault(register, []).append(i)
    return readers


def _harmless(instructions: list[tuple[str, str, list[str]]], other: str, exact: set[str],
              ends: Callable[[str, list[str]], bool]) -> set[int]:
    """The instructions with an ``other`` type that compute no value of the kernel: a comparison, a
    conversion that ``ends`` (an exact one), or an instruction whose every use is such (recursively);
    ``exact`` holds the registers whose values are exact in either type."""
    readers, memo = _readers(instructions), {}

    def harmless(i: int) -> bool:
        if i not in memo:
            memo[i] = False  # (a loop back to itself computes a value)
            op, _, registers = instructions[i]
            if op.startswith(NO_VALUE) or ends(op, registers):
                memo[i] = True
            elif registers and registers[0] in exact or op.startswith("cvt.rni."):
                uses = readers.get(registers[0], [])
                memo[i] = bool(uses) and all(harmless(j) for j in uses)
            else:
                uses = readers.get(registers[0], []) if registers else []
                memo[i] = bool(uses) and all(harmless(j) and not instructions[j][0].startswith(("st.", "cvt.f"))
                                             or instructions[j][0].startswith("cvt.rni.") for j in uses)
        return memo[i]

    return {i for i, (op, _, _) in enumerate(instructions) if other in op.split(".") and harmless(i)}


def _exact_float32(instructions) -> set[str]:
    """Float32 registers holding integers (``cvt.rni``) or powers of two of them (``ex2``)."""
    exact: set[str] = set()
    for op, _, registers in instructions:
        if op.startswith("cvt.rni.") or (op.startswith("ex2.") and registers[1:2] and registers[1] in exact):
            exact.add(registers[0])
    return exact


def _integral_float64(instructions) -> set[str]:
    """Float64 registers whose values come from integers and constants alone (libdevice's float32 sin and cos
    reduce a huge argument with its mantissa's bits as an integer times pi / 2 ** 64 in float64)."""
    found: set[str] = set()
    for op, _, registers in instructions:
        if "f64" in op.split(".") and registers and (
                re.match(r"cvt\.\w+\.f64\.[su](32|64)", op) or all(r in found for r in registers[1:])):
            found.add(registers[0])
    return found


def problems(ptx: str, dtype: str, literals: dict[str, str]) -> list[str]:
    """What in ``ptx`` (a kernel compiled with ``dtype`` tensors) computes in the other dtype, one line each:
    the generated source line it comes from and the instruction."""
    sources, where = _sources(ptx), ""
    instructions, places = [], []
    for line in ptx.splitlines():
        if loc := LOC.match(line):
            name, text = sources.get(loc.group(1), ("?", []))
            number = int(loc.group(2))
            where = f"{name}:{number}" + (f" `{text[number - 1].strip()}`" if 0 < number <= len(text) else "")
        elif match := INSTRUCTION.match(line):
            op, operands = match.groups()
            instructions.append((op, operands, re.findall(r"%[a-z]+\d+", operands)))
            places.append(f"{where}: {line.strip()}")
    if dtype == "float64":  # a float32 value widened only where exact
        exact = _exact_float32(instructions)
        harmless = _harmless(instructions, "f32", exact,
                             lambda op, r: op.startswith("cvt.f64.f32") and r[1] in exact)
    else:  # a float64 value narrowed where it comes from integers alone
        integral = _integral_float64(instructions)
        harmless = _harmless(instructions, "f64", integral,
                             lambda op, r: op.startswith("cvt.rn.f32.f64") and r[1] in integral)
    found = []
    for i, (op, operands, _) in enumerate(instructions):
        parts = op.split(".")
        if dtype == "float64":
            constants = [literals[c] for c in re.findall(r"0d[0-9A-F]{16}", operands) if c in literals]
            if constants:
                found.append(f"{places[i]}  (the literal {constants[0]} rounded to float32)")
            elif "f32" in parts and i not in harmless:
                found.append(places[i])
        elif "f64" in parts and i not in harmless:
            found.append(places[i])
    return found


def kernels(module) -> list:
    """The multi-step kernels of a generated module (not the cores they call), by name; not the final-state
    variants, which are their kernel's steps with one more store, nor the inference kernels, which are the
    training forward's steps with fewer stores."""
    names = vars(module)
    return [fn for name, fn in sorted(names.items()) if name.endswith("_kernel") and hasattr(fn, "arg_names")
            and not name.endswith("_final_state_kernel")
            and not (name.endswith("_inference_kernel") and name.replace("_inference_", "_forward_") in names)]


def check(spec: Path, dtype: str, tile: int = 2) -> list[str]:
    """Every problem of every kernel of ``spec`` compiled for ``dtype``, each prefixed with the kernel."""
    compiled = compile_spec(spec)
    module = compiled.triton_module()
    literals = _float32_rounded(compiled.triton_source) if dtype == "float64" else {}
    tl_dtype, pointer = DTYPES[dtype]
    found = []
    for fn in kernels(module):
        # float32: the steps once (tiles of one step): a float64 instruction would be in every copy of a step
        given = {**GIVEN, "_DTYPE": tl_dtype, "_DOT_DTYPE": tl_dtype, "_TC": tile if dtype == "float64" else 1}
        given = {k: v for k, v in given.items() if k in fn.arg_names}
        ptx = compile_for_sm(fn, given, warps=1, pointer=pointer).asm["ptx"]
        found += [f"{spec.name} {fn.__name__} ({dtype}), {p}" for p in problems(ptx, dtype, literals)]
    return found


# the delay kernels' integer arguments
DELAY_SIZES = {"T", "B", "I", "J", "P", "L", "C", "N", "M", "R", "Q", "W", "TG", "before"}
DELAY_INDICES = {"k", "o", "start", "s_of", "i_of", "b_of", "by_step", "by_input", "step_s", "step_i", "input_b",
                 "input_s"}  # their int32 arrays: steps, offsets, the events' groups and indices
DELAY_CONSTANTS = {"HAS_BIAS": True, "SHIFT": 1, "STEP_LIST": True, "INPUT_LIST": True}  # (and BLOCK_*, CHUNK: 16)


def check_delays(dtype: str) -> list[str]:
    """Every problem of the delay layers' kernels (``flexsn_dsl/delay_kernels.py``) compiled for ``dtype``."""
    from flexsn_dsl import delay_kernels
    _, pointer = DTYPES[dtype]
    found = []
    for name, fn in sorted(vars(delay_kernels).items()):
        kernel = name.startswith(("_linear_", "_channel_", "_delayed_", "_time_major_")) and hasattr(fn, "arg_names")
        if not kernel:
            continue
        signature, constants = {}, {}
        for arg in fn.arg_names:
            if arg.startswith("BLOCK_") or arg in DELAY_CONSTANTS or arg == "CHUNK":
                signature[arg], constants[arg] = "constexpr", DELAY_CONSTANTS.get(arg, 16)
            else:
                signature[arg] = "i32" if arg in DELAY_SIZES else "*i32" if arg in DELAY_INDICES else pointer
        source = triton.compiler.ASTSource(fn, signature, constants)
        ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
        found += [f"delay_kernels {name} ({dtype}), {p}" for p in problems(ptx, dtype, {})]
    return found


PLASTIC_SIZES = ("T", "G", "R", "n_pre", "n_post")  # the plastic kernel's integer arguments


def check_plastic(synapse: Path, neuron: Path, dtype: str) -> list[str]:
    """Every problem of PlasticLinear's fused kernel (``flexsn_dsl/plastic_kernels.py``) of ``synapse`` driving
    ``neuron``, compiled for ``dtype``."""
    from flexsn_dsl import plastic_kernels
    from flexsn_dsl.synapse import read_synapse
    model, compiled = read_synapse(synapse), compile_spec(neuron)
    fn = plastic_kernels.plastic_module(model, compiled)
    tl_dtype, pointer = DTYPES[dtype]
    signature = {a: "i32" if a in PLASTIC_SIZES else pointer for a in fn.arg_names}
    constants = {"_DTYPE": tl_dtype, "_BP": 16, "_BK": 64}
    signature.update({k: "constexpr" for k in constants})
    source = triton.compiler.ASTSource(fn, signature, constants)
    ptx = triton.compile(source, target=GPUTarget("cuda", 90, 32), options={"num_warps": 4}).asm["ptx"]
    text = plastic_kernels.plastic_source(model, compiled)
    literals = _float32_rounded(text) if dtype == "float64" else {}
    return [f"{synapse.name} driving {neuron.name} ({dtype}), {p}" for p in problems(ptx, dtype, literals)]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path)
    parser.add_argument("--dtype", nargs="+", choices=list(DTYPES), default=list(DTYPES))
    parser.add_argument("--tile", type=int, default=2,
                        help="steps of a time tile in the float64 kernels (2: the tiled loop and the steps after it; "
                             "1: the steps once)")
    parser.add_argument("--delays", action="store_true", help="also the delay layers' kernels")
    parser.add_argument("--plastic", nargs=2, action="append", default=[], metavar=("SYNAPSE", "NEURON"), type=Path,
                        help="also PlasticLinear's fused kernel of a synapse spec driving a neuron spec (repeatable)")
    args = parser.parse_args(argv)
    from triton.backends.nvidia.compiler import CUDABackend  # noqa: PLC0415 (the guard's run alone)
    # the guard reads PTX alone: the last stage, ptxas's machine code, is left empty (about a seventh of a compile)
    CUDABackend.make_cubin = lambda self, *args: b""
    print(f"triton {triton.__version__}, sm_90")
    found = [p for spec in args.specs for dtype in args.dtype for p in check(spec, dtype, args.tile)]
    if args.delays:
        found += [p for dtype in args.dtype for p in check_delays(dtype)]
    found += [p for synapse, neuron in args.plastic for dtype in args.dtype for p in check_plastic(synapse, neuron, dtype)]
    what = f"{len(args.specs)} specs" + (" and the delay kernels" if args.delays else "") + \
        (f" and {len(args.plastic)} plastic kernels" if args.plastic else "")
    print("\n".join(found) if found else f"{what}: every kernel computes in its dtype")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
