"""Instructions per neuron-step of a spec's training kernels, compiled offline (no GPU needed).

The forward (training) and backward kernels are compiled for an NVIDIA target with Triton's own
toolchain (its bundled ptxas and nvdisasm); the instructions of the time loop (the largest loop of
the SASS: the loop over time tiles) are counted by kind and divided by the neuron-steps one thread
handles per iteration (its neurons times the steps of a tile, ``--tile``). From the
counts, an ALU floor: every instruction issues at one warp instruction per clock per SM sub-partition
(4 per SM), MUFU (exp2, reciprocal) at 16 lanes per clock per SM; the larger of the two bounds a kernel.

    python benchmarks/isa_count.py neurons/hh.yaml [-T 64] [-n 1048576] [--block 1024 --warps 4] [--tile 1]
        [--variants inference forward backward]
    python benchmarks/isa_count.py --delays

``--delays`` counts DelayLinear's dense kernels instead (``flexsn_dsl/delay_kernels.py``, float32, at the
tiles and warps the host functions launch): instructions and loads per synapse-step (both taps of one synapse
at one step and batch row), and the issue floor of one training step at the SHD setting of
``benchmarks/delay_bench.py`` (700 -> 256 -> 256 -> 20, T = 1127, B = 256; the first layer's input needs no
gradient).

Each kernel's dependent chain is the longest run of instructions in one pass of its time loop that
each wait on the one before, per step: with few neurons (batch-1 streaming) a program waits on it at every
step (``--block 16 --warps 1 --tile 64 --variants inference``: LIF's is 3 instructions, fma, compare, select).

Defaults: the H200 (sm_90, 132 SMs, 1.98 GHz) and the launch the runtime picks for a large
population (1024-neuron blocks of 4 warps, 2 pipelining stages, no time tiles). A benchmark, not a test.
"""
from __future__ import annotations

import argparse
import collections
import math
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

os.environ["TRITON_INTERPRET"] = "0"  # compile for the GPU target, before flexsn_dsl or triton is imported
os.environ.setdefault("TRITON_DEFAULT_FP_FUSION", "1")  # what an unset knob means in Triton 3.9, without its warning

import triton  # noqa: E402
import triton.language as tl  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402

from flexsn_dsl.compiler import compile_spec  # noqa: E402
from flexsn_dsl.names import kernel_name  # noqa: E402

TOOLS = Path(triton.__file__).parent / "backends" / "nvidia" / "bin"
FLAGS = {"_CONST_INIT": True, "_HAS_STATE_GRADS": False, "_HAS_FINAL_GRADS": False, "_WRITE_INIT_GRADS": False,
         "_CARRY_SUMS": False}
INTEGERS = ("_T", "_N", "_L", "_C", "_P", "_B")  # and names ending in these (shaped parameters' sizes):
SIZES = ("__inner", "__size", "__split")


def compile_for_sm(fn, given: dict, warps: int, arch: int = 90, pointer: str = "*fp32", aligned: bool = True,
                   options: dict | None = None):
    """A generated kernel ``fn`` compiled for sm_<arch>: the constexprs of ``given`` that it takes, integers,
    the seed as int64 and every other argument a ``pointer``; ``aligned``: pointers and ``_N`` divisible by 16
    (as Triton specializes most launches)."""
    signature, constants, attrs = {}, {}, {}
    for i, arg in enumerate(fn.arg_names):
        if arg in given:
            signature[arg], constants[arg] = "constexpr", given[arg]
        elif arg in INTEGERS or arg.endswith(SIZES):
            signature[arg] = "i32"
        elif arg == "_seed":  # a noisy spec's seed and first step
            signature[arg] = "*i64"
        else:
            signature[arg] = pointer
        if aligned and (signature[arg] == pointer or arg == "_N"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    source = triton.compiler.ASTSource(fn, signature, constants, attrs)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": warps, **(options or {})})


def compile_kernel(module, variant: str, arch: int, block: int, warps: int, stages: int, tile: int = 1):
    """One kernel variant of a generated module, compiled for sm_<arch> with float32 tensors."""
    # the tiled backward (learnable shaped parameters) walks tiles of _ROWS x _COLS = block neurons
    given = {"_BLOCK": block, "_DTYPE": tl.float32, "_STAGES": stages, "_TC": tile, "_ROWS": block // 32, "_COLS": 32,
             **FLAGS}
    return compile_for_sm(getattr(module, kernel_name(module.INFO.neuron, variant)), given, warps, arch)


def _tool(name: str, flag: str, cubin: bytes) -> str:
    """A CUDA tool Triton bundles (cuobjdump, nvdisasm) run on ``cubin``: its output."""
    tool = TOOLS / name
    if not tool.exists():
        sys.exit(f"{Path(sys.argv[0]).name}: this Triton has no bundled {name} (its CUDA backend)")
    with tempfile.NamedTemporaryFile(suffix=".cubin") as f:
        f.write(cubin)
        f.flush()
        return subprocess.run([str(tool), flag, f.name], capture_output=True, text=True, check=True).stdout


def resource_usage(cubin: bytes) -> tuple[int, int]:
    """(registers a thread, stack bytes a thread: spills or local arrays) of a compiled kernel."""
    found = re.search(r"REG:(\d+) STACK:(\d+)", _tool("cuobjdump", "-res-usage", cubin))
    if not found:
        sys.exit(f"{Path(sys.argv[0]).name}: cuobjdump said no resource usage")
    return int(found.group(1)), int(found.group(2))


def registers(cubin: bytes) -> str:
    """Registers per thread and stack bytes (spills) of the kernel."""
    return "{} registers, {} B stack".format(*resource_usage(cubin))


INSTRUCTION = re.compile(r"\s*/\*[0-9a-f]+\*/\s*(@!?U?P[T0-9]+\s+)?([A-Z0-9_]+(?:\.[A-Z0-9_.]+)?)\s*([^;]*);")
NO_DESTINATION = {"STG", "STS", "STL", "ST", "RED", "REDG", "BRA", "EXIT", "BAR", "RET", "CALL", "NOP", "BSSY", "BSYNC",
                  "WARPSYNC", "DEPBAR"}


def loop_instructions(cubin: bytes) -> list[tuple[str, str, str]]:
    """The largest loop of the SASS (the time loop): each instruction's guard predicate, opcode (with
    modifiers) and operands."""
    lines = _tool("nvdisasm", "-c", cubin).splitlines()
    labels = {line[:-1]: i for i, line in enumerate(lines) if re.fullmatch(r"\.L_x_\d+:", line)}
    loops = [(labels[m.group(1)], i) for i, line in enumerate(lines)
             if (m := re.search(r"BRA\s+`\((\.L_x_\d+)\)", line)) and labels.get(m.group(1), i) < i]
    first, last = max(loops, key=lambda span: span[1] - span[0])
    return [(m.group(1) or "", m.group(2), m.group(3)) for line in lines[first:last + 1]
            if (m := INSTRUCTION.match(line))]


def loop_counts(cubin: bytes) -> collections.Counter:
    """Instructions of the time loop, by opcode with modifiers."""
    return collections.Counter(op for _, op, _ in loop_instructions(cubin))


def longest_chain(cubin: bytes) -> int:
    """The most instructions of one pass of the time loop that each wait on the one before (through
    registers and predicates): with a tile of steps unrolled, about the tile's steps times one step's
    chain from its states to the next step's, which a program with few neurons waits on at every step."""
    depth: dict[str, int] = {}
    for guard, op, operands in loop_instructions(cubin):
        registers = [re.findall(r"\bU?[RP](?:\d+|T|Z)\b", part) for part in operands.split(",")]
        base = op.split(".")[0]
        writes = 0 if base in NO_DESTINATION else 2 if base.endswith("SETP") else 1
        written = [r for part in registers[:writes] for r in part]
        read = [r for part in registers[writes:] for r in part] + re.findall(r"U?P\d+", guard)
        d = 1 + max((depth.get(r, 0) for r in read if r not in ("RZ", "PT", "URZ", "UPT")), default=0)
        depth.update((r, d) for r in written)
    return max(depth.values(), default=0)


def kinds(counts: collections.Counter) -> dict[str, int]:
    """Counts grouped: MUFU by function, the float pipes by opcode, memory, everything else."""
    groups = collections.Counter()
    for op, n in counts.items():
        base = op.split(".")[0]
        if base == "MUFU":
            groups[op] += n
        elif base in ("FFMA", "FMUL", "FADD", "FSEL", "FSETP", "FMNMX"):
            groups[base] += n
        elif base in ("LDG", "STG", "LDGSTS", "LDS"):
            groups["memory"] += n
        else:
            groups["other"] += n
    return dict(sorted(groups.items(), key=lambda kv: -kv[1]))


def delay_counts(arch: int, sms: int, ghz: float) -> None:
    """DelayLinear's dense kernels: per synapse-step counts and the issue floor at the SHD setting."""
    from flexsn_dsl import delay_kernels as dk
    sizes, steps = (700, 256, 256, 20), 1127 * 256
    synapses = [i * j for i, j in zip(sizes, sizes[1:])]
    dense = {"BLOCK_Q": dk.SYNAPSES, "BLOCK_U": dk.STEPS}
    kernels = [("forward", dk._delayed_sum, {"SHIFT": 1, "HAS_BIAS": True, **dense}, sum(synapses)),
               ("input's gradient", dk._delayed_sum, {"SHIFT": -1, "HAS_BIAS": False, **dense}, sum(synapses[1:])),
               ("taps' gradients", dk._linear_grad_taps, {"BLOCK_I": dk.TAP_SYNAPSES, "BLOCK_V": dk.STEPS},
                sum(synapses))]
    total = 0.0
    for name, fn, constants, layer_synapses in kernels:
        signature = {arg: "constexpr" if arg in constants else "*i32" if arg == "o" else
                     "i32" if arg.isupper() else "*fp32" for arg in fn.arg_names}
        source = triton.compiler.ASTSource(fn, signature, constants)
        cubin = triton.compile(source, target=GPUTarget("cuda", arch, 32), options={"num_warps": 1}).asm["cubin"]
        counts = loop_counts(cubin)
        # (one warp a program)
        per_thread = math.prod(v for key, v in constants.items() if key.startswith("BLOCK")) / 32
        per_step = sum(counts.values()) / per_thread
        loads = sum(n for op, n in counts.items() if op.startswith(("LDG", "LDS"))) / per_thread
        issue_ms = steps * layer_synapses * per_step / (sms * 4 * 32 * ghz * 1e9) * 1e3
        total += issue_ms
        print(f"{name:>17}: {per_step:5.2f} instructions, {loads:4.2f} loads per synapse-step; {registers(cubin)}; "
              f"issue floor {issue_ms:.2f} ms")
    print(f"issue floor of a training step's dense delay kernels: {total:.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?")
    parser.add_argument("--delays", action="store_true", help="DelayLinear's dense kernels instead of a spec's")
    parser.add_argument("-T", type=int, default=64)
    parser.add_argument("-n", type=int, default=1 << 20)
    parser.add_argument("--arch", type=int, default=90, help="compute capability, e.g. 90 for the H100/H200")
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--ghz", type=float, default=1.98)
    parser.add_argument("--block", type=int, default=1024)
    parser.add_argument("--warps", type=int, default=4)
    parser.add_argument("--stages", type=int, default=2)
    parser.add_argument("--tile", type=int, default=1, help="steps per time tile (_TC)")
    parser.add_argument("--variants", nargs="+", default=["forward", "backward"],
                        choices=["inference", "forward", "backward"], help="kernels to count (default: training's)")
    args = parser.parse_args()
    if args.delays:
        return delay_counts(args.arch, args.sms, args.ghz)
    if not args.spec:
        parser.error("a spec, or --delays")
    module = compile_spec(args.spec).triton_module()
    per_thread = max(args.block // (32 * args.warps), 1) * args.tile  # neuron-steps per thread and iteration
    steps = args.T * args.n
    total = 0.0
    for variant in args.variants:
        kernel = compile_kernel(module, variant, args.arch, args.block, args.warps, args.stages, args.tile)
        counts = loop_counts(kernel.asm["cubin"])
        chain = longest_chain(kernel.asm["cubin"]) / args.tile
        per_step = sum(counts.values()) / per_thread
        mufu = sum(n for op, n in counts.items() if op.startswith("MUFU")) / per_thread
        issue_ms = steps * per_step / (args.sms * 4 * 32 * args.ghz * 1e9) * 1e3
        mufu_ms = steps * mufu / (args.sms * 16 * args.ghz * 1e9) * 1e3
        total += max(issue_ms, mufu_ms)
        detail = ", ".join(f"{k} {v / per_thread:.1f}" for k, v in kinds(counts).items())
        print(f"{variant:>9}: {per_step:6.1f} instructions per neuron-step ({detail}); "
              f"{registers(kernel.asm['cubin'])}")
        print(f"{'':>11}ALU floor at T={args.T}, n={args.n}: issue {issue_ms:.3f} ms, MUFU {mufu_ms:.3f} ms; "
              f"dependent chain {chain:.1f} instructions per step")
    print(f"ALU floor ({' + '.join(args.variants)}): {total:.3f} ms")


if __name__ == "__main__":
    main()
