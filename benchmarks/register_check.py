"""Registers and spills of the kernels the built-in launch choices compile, without a GPU: each spec's
kernels compiled for an H200 (sm_90a, 132 SMs) by Triton, at the meta-parameters
``triton_runtime.Kernels.config`` (sequential) and ``scan_config`` (time-parallel specs) give for each
shape (its resource usage from ``cuobjdump``). A kernel that spills keeps part of a time tile in
local memory (a stack frame) instead of registers: slower than its tile promises. Needs a Triton with
its CUDA backend (the pip wheel bundles ``ptxas`` and ``cuobjdump``); no driver. Exits 1 when a kernel spills.

    python benchmarks/register_check.py                          # the zoo's lif, li, hh, adex
    python benchmarks/register_check.py neurons/lif.yaml -n 40000 -T 4096
"""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # (compile for the GPU, not the interpreter: before Triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from flexsn_dsl import triton_runtime  # noqa: E402
from flexsn_dsl.compiler import compile_spec  # noqa: E402
from flexsn_dsl.names import kernel_name, scan_variant  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMS = 132  # an H200's SMs
SHAPES = [(256, 1000), (1024, 4096), (4096, 4096), (8192, 1000), (20_000, 2048), (40_000, 4096), (65_536, 500)]
FLAGS = {"_CONST_INIT": True, "_HAS_STATE_GRADS": False, "_HAS_FINAL_GRADS": True, "_WRITE_INIT_GRADS": True,
         "_CARRY_SUMS": False}


def _cuobjdump() -> str:
    found = list((Path(triton.__file__).parent / "backends" / "nvidia" / "bin").glob("cuobjdump"))
    if not found:
        sys.exit("register_check.py: this Triton has no bundled cuobjdump (its CUDA backend)")
    return str(found[0])


def registers(kernel, meta: dict) -> tuple[int, int]:
    """(registers, stack bytes a thread: spilled values) of ``kernel`` compiled with ``meta`` for sm_90a."""
    given = {"_DTYPE": tl.float32, **FLAGS, **{k: v for k, v in meta.items() if k != "num_warps"}}
    ints = ("_T", "_N", "_L", "_C", "_P")
    signature = {a: "constexpr" if a in given else "i32" if a in ints or a.endswith(("__inner", "__size", "__split"))
                 else "*i64" if a == "_seed" else "*fp32" for a in kernel.arg_names}
    compiled = triton.compile(triton.compiler.ASTSource(kernel, signature, {a: given[a] for a in kernel.arg_names
                                                                          if a in given}),
                              target=GPUTarget("cuda", 90, 32), options={"num_warps": meta.get("num_warps", 1)})
    with tempfile.NamedTemporaryFile("wb", suffix=".cubin", delete=False) as f:
        f.write(compiled.asm["cubin"])
    report = subprocess.run([_cuobjdump(), "--dump-resource-usage", f.name], capture_output=True, text=True).stdout
    os.unlink(f.name)
    usage = re.search(r"REG:(\d+) STACK:(\d+)", report)
    if not usage:
        sys.exit(f"register_check.py: cuobjdump said no resource usage:\n{report}")
    return int(usage.group(1)), int(usage.group(2))


def check(spec: Path, shapes: list[tuple[int, int]]) -> int:
    """Print each kernel's registers and spills at each shape's launch choices; the number that spill."""
    compiled = compile_spec(spec)
    triton_runtime._sm_count = lambda: SMS  # (the GPU's choice, worked out here)
    kernels = triton_runtime.Kernels(compiled, torch.device("cuda"))
    settings = triton_runtime.launch_settings()
    module, name, spilled, seen = kernels.module, kernels.name, 0, {}
    for n, T in shapes:
        plan = []
        if kernels.scans:
            meta, chunk, backward_tile = kernels.scan_config(n, T, settings)
            chunked = chunk < T
            for v in ("inference", "forward"):
                plan.append((scan_variant(v) if chunked else v, meta))
            if "backward" in kernels.scans:
                plan.append((scan_variant("backward") if chunked else "backward", {**meta, "_TC": backward_tile}))
            if chunked:
                plan += [("scan_summary", meta), ("scan_adjoint_summary", {**meta, "_TC": backward_tile})]
        else:
            meta = kernels.config(n, T, settings)
            plan = [("inference", meta), ("forward", meta),
                    ("backward", {**meta, "_TC": kernels.config(n, T, settings, "backward")["_TC"]})]
        for variant, meta in plan:
            if compiled.triton_module() is None or not hasattr(module, kernel_name(name, variant)):
                continue
            meta = {k: v for k, v in meta.items() if k in ("_BLOCK", "_TC", "_STAGES", "num_warps")}
            key = (variant, tuple(sorted(meta.items())))
            if key not in seen:
                seen[key] = registers(getattr(module, kernel_name(name, variant)), meta)
            regs, spill = seen[key]
            spilled += spill > 0
            print(f"  {name:10} n={n:<7} T={T:<6} {variant:24} block {meta['_BLOCK']:4} warps {meta.get('num_warps', 1)} "
                  f"tile {meta['_TC']:3}  {regs:3} registers" + (f"  SPILLS: {spill} bytes of stack" if spill else ""), flush=True)
    return spilled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path,
                        default=[ROOT / "neurons" / f"{s}.yaml" for s in ("lif", "li", "hh", "adex")])
    parser.add_argument("-n", "--neurons", type=int, nargs="+")
    parser.add_argument("-T", "--steps", type=int, nargs="+")
    args = parser.parse_args(argv)
    shapes = [(n, T) for n in args.neurons for T in args.steps] if args.neurons and args.steps else SHAPES
    print(f"triton {triton.__version__}, sm_90a, {SMS} SMs")
    spilled = sum(check(spec, shapes) for spec in args.specs)
    print(f"{spilled} kernel launches spill")
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
