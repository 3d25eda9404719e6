"""Time-parallel (scan) kernels against the sequential ones on the same spec (issue 27, part 3).

Target (on the H200): B·N = 1024 neurons, T = 4096, training at least 10x faster than the
sequential kernel. For each spec and shape: the scan results are first checked against the
sequential kernels' (float64 and float32: outputs, input and parameter gradients, relative to the
largest value), then both are timed per training and inference call, CUDA-graph medians
(``flexsn_dsl.bench.graph_replay_ms``), and the scan kernels again with each ``--tiles`` setting of
(neurons per program, steps per tile, warps) instead of the built-in choice
(``triton_plan.Kernels.scan_config``) and each ``--chunks`` setting (``FLEXSN_DSL_SCAN_CHUNK``), to
tune them; ``--profile`` prints each kernel's time in a training call of the built-in choices.

    python benchmarks/scan_bench.py                            # neurons/li.yaml, N=1024, T=4096
    python benchmarks/scan_bench.py -n 1024 8192 -T 1000 4096 --tiles 32x8x1 64x16x2 --chunks 64 256
    python benchmarks/scan_bench.py --quick                    # small shapes: runs anywhere (CPU: interpreter)

`flexsn-dsl bench` compares the two paths as well: the scan kernels are the default, and
``FLEXSN_DSL_TIME_PARALLEL=0`` runs the sequential ones.
"""
from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import torch

import flexsn_dsl
from flexsn_dsl import triton_plan
from flexsn_dsl.bench import _timer, graph_replay_ms

ROOT = Path(__file__).resolve().parents[1]


def _module(spec: str, parallel: bool, dtype: torch.dtype, device: torch.device) -> flexsn_dsl.FlexSN:
    os.environ["FLEXSN_DSL_TIME_PARALLEL"] = "1" if parallel else "0"
    triton_plan._kernels.cache_clear()  # fresh launch plans: the setting and the tiles of this run
    return flexsn_dsl.load(spec, backend="triton").to(device=device, dtype=dtype)


def _call(module, xs, training: bool):
    def run():
        module.reset()
        if not training:
            with torch.no_grad():
                return module(*xs)
        ys = module(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        sum(y.float().sum() for y in ys).backward()
    return run


def _results(module, xs) -> list[torch.Tensor]:
    for x in xs:
        x.grad = None
    module.zero_grad(set_to_none=True)
    module.reset()
    ys = module(*xs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    sum((y * torch.linspace(0, 1, y.shape[-1], device=y.device, dtype=y.dtype)).sum() for y in ys).backward()
    return [y.detach() for y in ys] + [x.grad for x in xs] + [p.grad for p in module.parameters() if p.grad is not None]


def check(spec: str, T: int, n: int, device: torch.device) -> None:
    for dtype in (torch.float64, torch.float32):
        xs = [torch.rand(T, n, device=device, dtype=dtype, generator=torch.Generator(device).manual_seed(k))
              .requires_grad_() for k in range(len(flexsn_dsl.load(spec).spec.inputs))]
        scan, sequential = (_results(_module(spec, p, dtype, device), xs) for p in (True, False))
        worst = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30)) for a, b in zip(scan, sequential))
        print(f"  check {str(dtype)[6:]:8} largest relative difference {worst:.1e}", flush=True)


def _time(fn) -> tuple[float, str]:
    if torch.cuda.is_available():
        try:
            return graph_replay_ms(fn), "graph"
        except Exception as exc:  # noqa: BLE001 - report and time eagerly
            print(f"    (no CUDA graph: {type(exc).__name__}: {exc})"[:200])
    return _timer(torch.device("cuda" if torch.cuda.is_available() else "cpu"))(fn), "eager"


def bench(spec: str, T: int, n: int, tiles: list[tuple[int, int, int]], chunks: list[int], device: torch.device,
          profile: bool) -> None:
    xs = [torch.rand(T, n, device=device).requires_grad_() for _ in flexsn_dsl.load(spec).spec.inputs]
    rows = [("sequential", False, {}), ("scan", True, {})]
    rows += [(f"scan {b}x{t}x{w}", True, {"FLEXSN_DSL_BLOCK": b, "FLEXSN_DSL_TIME_TILE": t, "FLEXSN_DSL_WARPS": w})
             for b, t, w in tiles]
    rows += [(f"scan chunk {c}", True, {"FLEXSN_DSL_SCAN_CHUNK": c}) for c in chunks]
    base, saved = {}, {k: os.environ.get(k) for _, _, env in rows for k in env}
    for label, parallel, env in rows:
        os.environ.update({k: str(v) for k, v in env.items()})
        try:
            module = _module(spec, parallel, torch.float32, device)
            for mode in ("training", "inference"):
                fn = _call(module, xs, mode == "training")
                fn()
                ms, how = _time(fn)
                base.setdefault(mode, ms)
                print(f"  {label:20} {mode:9} {ms:9.4f} ms ({how})  {base[mode] / ms:6.2f}x the sequential kernel",
                      flush=True)
                if profile and not env and mode == "training":
                    _profile(fn)
        except Exception as exc:  # noqa: BLE001 - a setting that does not compile: say so, go on
            print(f"  {label:20} failed: {type(exc).__name__}: {exc}"[:200], flush=True)
        finally:
            for k in env:  # (the caller's settings, for the next row, spec and shape)
                os.environ.pop(k) if saved[k] is None else os.environ.update({k: saved[k]})


def _profile(fn) -> None:
    """Each kernel's share of a call, from torch.profiler (device time, 20 calls after warm-up)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(20):
            fn()
        torch.cuda.synchronize()
    for event in sorted(prof.key_averages(), key=lambda e: -e.device_time_total)[:12]:
        print(f"      {event.device_time_total / 20:9.1f} us a call  {event.count // 20:3d}x  {event.key[:90]}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("specs", nargs="*", default=[str(ROOT / "neurons" / "li.yaml")])
    parser.add_argument("-T", "--steps", type=int, nargs="+", default=[4096])
    parser.add_argument("-n", "--neurons", type=int, nargs="+", default=[1024])
    parser.add_argument("--tiles", nargs="*", default=["32x8x1", "64x8x1", "128x8x1", "128x8x4", "32x16x1", "32x4x1"],
                        help="scan settings to time besides the built-in one: BLOCKxTCxWARPS (FLEXSN_DSL_BLOCK, "
                             "FLEXSN_DSL_TIME_TILE, FLEXSN_DSL_WARPS)")
    parser.add_argument("--chunks", type=int, nargs="*", default=[32, 64, 128, 256, 512],
                        help="steps per chunk to time besides the built-in choice (FLEXSN_DSL_SCAN_CHUNK)")
    parser.add_argument("--quick", action="store_true", help="T=40, 64 neurons, no tile or chunk settings")
    parser.add_argument("--profile", action="store_true", help="each kernel's time in a training call (GPU)")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    steps, neurons = ([40], [64]) if args.quick else (args.steps, args.neurons)
    tiles = [] if args.quick else [tuple(map(int, t.split("x"))) for t in args.tiles]
    chunks = [] if args.quick else args.chunks
    for spec in args.specs:
        for T in steps:
            for n in neurons:
                print(f"{Path(spec).name} T={T} N={n} on {device}", flush=True)
                check(spec, T, n, device)
                bench(spec, T, n, tiles, chunks, device, args.profile and device.type == "cuda")
    return 0


if __name__ == "__main__":
    sys.exit(main())
