"""Registers and spills of the kernels the built-in launch choices compile, without a GPU: each spec's
kernels compiled for an H200 (sm_90a, 132 SMs) by Triton with the keywords of each launch of a training
and an inference call's plan (``triton_plan.Plan``: block, warps, time tile, flags) for each shape,
their resource usage read by ``cuobjdump``. A kernel that spills keeps part of a time tile in local
memory (a stack frame) instead of registers: slower than its tile promises. Needs a Triton with its
CUDA backend (the pip wheel bundles ``cuobjdump`` and ``nvdisasm``); no driver. Exits 1 when a kernel's
time loop touches its stack more than once every LOCAL_STEPS steps: ptxas may also keep a loop invariant
(the stride ``_N``) there and reload it once a tile, an L1 hit that no step waits on (reported, not counted).

    python benchmarks/register_check.py                          # the zoo's lif, li, hh, adex
    python benchmarks/register_check.py neurons/lif.yaml -n 40000 -T 4096
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # (compile for the GPU, not the interpreter: before Triton is imported)
import torch  # noqa: E402
import triton  # noqa: E402

from flexsn_dsl import triton_plan  # noqa: E402
from flexsn_dsl.compiler import compile_spec  # noqa: E402
from flexsn_dsl.triton_settings import COMPILE_OPTIONS, launch_settings  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from isa_count import compile_for_sm, loop_instructions, resource_usage  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SMS = 132  # an H200's SMs
SHAPES = [(256, 1000), (1024, 4096), (4096, 4096), (8192, 1000), (20_000, 2048), (40_000, 4096), (65_536, 500)]
LOCAL_STEPS = 8  # a time loop's stack accesses (local loads and stores) count as a spill above one per this many steps


def registers(kernel, keywords: dict, pointer: str) -> tuple[int, int, int]:
    """(registers, stack bytes a thread: spilled values, local loads and stores in one pass of the time loop)
    of ``kernel`` compiled for sm_90a with a launch's ``keywords`` (its constexprs and warps), its sequences
    of ``pointer`` type."""
    given = {k: v for k, v in keywords.items() if k not in ("num_warps", *COMPILE_OPTIONS)}
    compiled = compile_for_sm(kernel, given, keywords.get("num_warps", 4), pointer=pointer, aligned=False,
                              options=COMPILE_OPTIONS)
    regs, stack = resource_usage(compiled.asm["cubin"])
    local = sum(op.startswith(("LDL", "STL")) for _, op, _ in loop_instructions(compiled.asm["cubin"])) if stack else 0
    return regs, stack, local


def launches(plan: triton_plan.Plan) -> list[tuple[str, object, dict]]:
    """The kernels a training call and an inference call of ``plan`` launch, each with its keywords (state
    sequences stored, constant initial states, a final-state gradient; not the tiled backward of learnable
    shaped parameters, whose launch works out its own)."""
    found = []
    for training in (False, True):
        variant, keywords = plan.forwards[training, True, True]
        found.append((variant, plan.kernels[variant], keywords))
    if not plan.tiled:
        found.append(("backward", plan.kernels["backward"], plan.backward_flags[False, True, True]))
    flags = {"scan_summary": plan.summary_flags, "scan_carry": plan.carry_flags[True],
             "scan_adjoint_summary": plan.adjoint_summary_flags[False], "scan_adjoint_carry": plan.adjoint_carry_flags[True]}
    found += [(v, kernel, flags[v]) for v, (kernel, _) in plan.chunk_kernels.items()]
    return found


def check(spec: Path, shapes: list[tuple[int, int]], dtype: torch.dtype) -> int:
    """Print each kernel's registers and spills at each shape's launch plan; the number that spill."""
    triton_plan._sm_count = lambda: SMS  # (the GPU's choice, worked out here)
    kernels = triton_plan.Kernels(compile_spec(spec), torch.device("cuda"))
    pointer = "*fp64" if dtype == torch.float64 else "*fp32"
    spilled, seen = 0, {}
    for n, T in shapes:
        plan = kernels.plan(torch.Size([T, n]), dtype, launch_settings())
        for variant, kernel, keywords in launches(plan):
            key = (variant, repr(sorted(keywords.items())))
            if key not in seen:
                seen[key] = registers(kernel, keywords, pointer)
            regs, stack, local = seen[key]
            spills = local * LOCAL_STEPS > keywords.get("_TC", 1)
            spilled += spills
            name = kernel.fn.__name__ if hasattr(kernel, "fn") else variant
            print(f"  {name:36} n={n:<7} T={T:<6} block {keywords['_BLOCK']:4} warps {keywords.get('num_warps', 4)} "
                  f"tile {keywords.get('_TC', '-'):>3}  {regs:3} registers"
                  + (f"  {'SPILLS' if spills else 'stack'}: {stack} bytes, {local} local loads and stores a pass "
                     f"of the time loop" if stack else ""), flush=True)
    return spilled


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", type=Path,
                        default=[ROOT / "neurons" / f"{s}.yaml" for s in ("lif", "li", "hh", "adex")])
    parser.add_argument("-n", "--neurons", type=int, nargs="+")
    parser.add_argument("-T", "--steps", type=int, nargs="+")
    parser.add_argument("--dtype", choices=["float32", "float64"], default="float32",
                        help="the inputs' dtype (float64 halves the time tiles)")
    args = parser.parse_args(argv)
    shapes = [(n, T) for n in args.neurons for T in args.steps] if args.neurons and args.steps else SHAPES
    print(f"triton {triton.__version__}, sm_90a, {SMS} SMs, {args.dtype}")
    spilled = sum(check(spec, shapes, getattr(torch, args.dtype)) for spec in args.specs)
    print(f"{spilled} kernel launches spill")
    return 1 if spilled else 0


if __name__ == "__main__":
    sys.exit(main())
