"""Ways to keep many steps' loads in flight when a program walks few neurons through many steps
(issue 27, part 1), measured on LIF inference written by hand (x -> s, one state), CUDA-graph medians
against the memory floor (8 bytes a neuron-step / the copy bandwidth):

- ``seq``: one step an iteration, Triton's pipeliner ``num_stages`` deep (the kernels for many neurons);
- ``tile``: the generated kernels' time tiles today: a tile's loads issued together, then its steps;
- ``prefetch``: the same tiles, the next tile's loads issued before this tile's steps (registers twice
  a tile: a tile's loads in flight while the steps of the one before run);
- ``split``: a tile loaded as one ``[TC, BLOCK]`` block, its rows taken apart in registers (``tl.trans``,
  ``tl.reshape``, ``tl.split``), the next tile's block loaded before this one's steps.

Each kernel's spikes are compared with ``seq``'s, and its first call (compilation) is timed. ``--core
select`` writes the step with a shorter chain of dependent instructions (:data:`CORES`).

    python benchmarks/tile_patterns.py            # on a GPU
    python benchmarks/tile_patterns.py --core select --tiles 64
    python benchmarks/tile_patterns.py --quick    # small shapes: runs anywhere (CPU: Triton's interpreter)
"""
from __future__ import annotations

import argparse
import importlib.util
import os
import tempfile
import time
from pathlib import Path

import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")  # (before Triton is imported)
import triton  # noqa: E402

# The step, two ways: as the generated core writes it, and with a shorter chain of dependent instructions
# from v to the next v (compiled for sm_90a: FMUL FFMA FADD FSET FADD FMUL, against FFMA FADD FSETP FSEL;
# the same values for finite inputs). Streaming (few neurons, many steps) waits on that chain.
CORES = {
    "plain": """    h = 0.5 * v + 0.5 * x
    s = (h - 1.0 >= 0.0).to(tl.float32)
    return s, h * (1.0 - s)""",
    "select": """    h = tl.fma(v, 0.5, 0.5 * x)
    fired = h - 1.0 >= 0.0
    return tl.where(fired, 1.0, 0.0), tl.where(fired, 0.0, h)""",
}
HEADER = '''import triton
import triton.language as tl


@triton.jit
def core(x, v):
{core}


@triton.jit
def seq(x_ptr, s_ptr, T, N, BLOCK: tl.constexpr, STAGES: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    v = tl.zeros([BLOCK], tl.float32)
    for t in tl.range(0, T, num_stages=STAGES):
        s, v = core(tl.load(x_ptr + t * N + offs, mask=mask, other=0.0), v)
        tl.store(s_ptr + t * N + offs, s, mask=mask)
'''


def _kernel(name: str, tc: int, body: list[str]) -> str:
    """A kernel walking T in whole tiles of tc steps (``body``: the lines of that loop and what comes before
    it, from ``xp``, ``sp`` and ``tiled``), then the last T % tc steps one at a time."""
    lines = ["", "", "@triton.jit", f"def {name}{tc}(x_ptr, s_ptr, T, N, BLOCK: tl.constexpr, STAGES: tl.constexpr):",
             "    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)",
             "    mask = offs < N",
             "    v = tl.zeros([BLOCK], tl.float32)",
             "    xp = x_ptr + offs",
             "    sp = s_ptr + offs",
             f"    tiled = T - T % {tc}",
             *body,
             "    for t in tl.range(tiled, T):",
             "        s, v = core(tl.load(x_ptr + t * N + offs, mask=mask, other=0.0), v)",
             "        tl.store(s_ptr + t * N + offs, s, mask=mask)"]
    return "\n".join(lines) + "\n"


def _steps(values: list[str]) -> list[str]:
    """A tile's steps from its values in order, each step's spikes stored."""
    return [line for k, x in enumerate(values)
            for line in (f"        s, v = core({x}, v)", f"        tl.store(sp + {k} * N, s, mask=mask)")]


def _advance(tc: int) -> list[str]:
    return [f"        xp += {tc} * N", f"        sp += {tc} * N"]


def _tile(tc: int) -> str:
    """Today's time tiles: a tile's loads, then its steps; the last T % TC steps one at a time."""
    return _kernel("tile", tc, [f"    for t0 in tl.range(0, tiled, {tc}, num_stages=STAGES):",
                                *(f"        x{k} = tl.load(xp + {k} * N, mask=mask, other=0.0)" for k in range(tc)),
                                *_steps([f"x{k}" for k in range(tc)]), *_advance(tc)])


def _prefetch(tc: int) -> str:
    """Tiles whose next tile's loads go out before this tile's steps run."""
    return _kernel("prefetch", tc, [
        "    first = offs < tl.where(tiled > 0, N, 0)  # (whole tiles are loaded or none of a tile)",
        *(f"    x{k} = tl.load(xp + {k} * N, mask=first, other=0.0)" for k in range(tc)),
        f"    for t0 in tl.range(0, tiled, {tc}, num_stages=1):",
        f"        more = offs < tl.where(t0 + {tc} < tiled, N, 0)",
        *(f"        n{k} = tl.load(xp + {tc + k} * N, mask=more, other=0.0)" for k in range(tc)),
        *_steps([f"x{k}" for k in range(tc)]),
        *(f"        x{k} = n{k}" for k in range(tc)), *_advance(tc)])


def _rows(name: str, tc: int, indent: str) -> tuple[list[str], list[str]]:
    """Lines that take a ``[BLOCK, tc]`` tensor ``name`` apart into its tc columns, and the columns' names
    in order of t: each level splits the last axis into pairs (t = 2 i + j) and keeps j apart."""
    lines, parts = [], [(name, list(range(tc)))]
    while len(parts[0][1]) > 1:
        nxt = []
        for var, ts in parts:
            half = len(ts) // 2
            a, b = f"{var}e", f"{var}o"
            lines.append(f"{indent}{a}, {b} = tl.split(tl.reshape({var}, [BLOCK, {half}, 2]))")
            nxt += [(a, ts[0::2]), (b, ts[1::2])]
        parts = nxt
    cols = [""] * tc
    for var, (t,) in parts:
        cols[t] = var
    lines += [f"{indent}c{t} = tl.reshape({cols[t]}, [BLOCK])" for t in range(tc)]
    return lines, [f"c{t}" for t in range(tc)]


def _split(tc: int) -> str:
    """Tiles loaded as one block each, the next block's loads out before this tile's steps."""
    take, cols = _rows("a", tc, "        ")
    return _kernel("split", tc, [
        f"    tt = tl.arange(0, {tc})",
        "    block = tl.load(xp[None, :] + tt[:, None] * N, mask=mask[None, :] & (tt[:, None] < tiled), other=0.0)",
        f"    for t0 in tl.range(0, tiled, {tc}, num_stages=1):",
        f"        nxt = tl.load(xp[None, :] + ({tc} + tt[:, None]) * N,",
        f"                      mask=mask[None, :] & (t0 + {tc} + tt[:, None] < tiled), other=0.0)",
        "        a = tl.trans(block)", *take, *_steps(cols),
        "        block = nxt", *_advance(tc)])


def build(tiles: list[int], core: str = "plain"):
    """The kernels as a module: seq, tile{tc}, prefetch{tc}, split{tc} for each tc of ``tiles``, each step
    the ``core`` of :data:`CORES`."""
    source = HEADER.replace("{core}", CORES[core]) + "".join(_tile(tc) + _prefetch(tc) + _split(tc) for tc in tiles)
    path = Path(tempfile.mkdtemp(prefix="tile_patterns_")) / "tile_pattern_kernels.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small shapes and tiles (CPU: the interpreter)")
    parser.add_argument("--tiles", type=int, nargs="+", default=[16, 32, 64])
    parser.add_argument("--stages", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--core", choices=sorted(CORES), default="plain",
                        help="the step: as generated (plain), or with a shorter dependent chain (select)")
    args = parser.parse_args(argv)
    cuda = torch.cuda.is_available()
    device = torch.device("cuda" if cuda else "cpu")
    shapes = [(37, 64), (8, 40)] if args.quick else [(500, 8192), (1000, 8192), (4096, 4096), (1000, 256)]
    tiles = [4, 8] if args.quick else args.tiles
    stages = [1] if args.quick else args.stages
    mod = build(tiles, args.core)
    if cuda:
        from flexsn_dsl.bench import copy_bandwidth, graph_replay_ms
        bw = copy_bandwidth(device)
        print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}, triton {triton.__version__}, "
              f"copy bandwidth {bw / 1e12:.3f} TB/s")
    kernels = [(f"seq stages={st}", mod.seq, st) for st in stages]
    kernels += [(f"{kind}{tc}", getattr(mod, f"{kind}{tc}"), st) for tc in tiles
                for kind in ("tile", "prefetch", "split") for st in ((1, 2) if kind == "tile" else (1,))]
    for T, N in shapes:
        x = torch.rand(T, N, device=device) * 1.5
        ref = None
        print(f"\nT={T} N={N}" + (f"  floor {8 * T * N / bw * 1e6:.2f} us" if cuda else ""))
        for block in ((32,) if N >= 1024 or args.quick else (32, 16)):
            grid = (triton.cdiv(N, block),)
            for label, kernel, st in kernels:
                s = torch.full_like(x, -1.0)
                launch = lambda: kernel[grid](x, s, T, N, BLOCK=block, STAGES=st, num_warps=1)
                start = time.perf_counter()
                try:
                    launch()
                    if cuda:
                        torch.cuda.synchronize()
                except Exception as error:  # (a pattern this Triton cannot compile: say so, go on)
                    print(f"  BLOCK={block:3d} {label:18s} failed: {type(error).__name__}: {str(error)[:200]}")
                    continue
                first = time.perf_counter() - start
                if ref is None:
                    ref = s.clone()
                wrong = (s != ref).float().mean().item()
                line = (f"  BLOCK={block:3d} {label:18s} stages={st}  first call {first:6.2f} s  "
                        f"spikes differing {wrong:.1e}")
                if cuda:
                    ms = graph_replay_ms(launch)
                    line += f"  {ms * 1e3:8.2f} us  {ms / (8 * T * N / bw * 1e3):5.2f}x floor"
                print(line, flush=True)


if __name__ == "__main__":
    main()
