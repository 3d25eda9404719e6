"""Host time of one call on the CPU with the kernel launches stubbed out: flexsn-dsl's module
against the host floor (``flexsn_dsl.bench.minimal_runner``: a bare autograd.Function launching
the same kernels), so that what is measured is the Python and autograd work around a launch.

CPU time of this thread per call (other processes on a shared machine do not count), the best
of many batches; small tensors, so that the CPU allocator is cheap (the CUDA caching allocator
is). ``--layers L``: also a chain of L layers (each after ``x * 1.1``), ours against ReLU, eager
and under ``torch.compile(fullgraph=True)``: the host time one layer adds either way.
``--autocast``: also calls on bfloat16 inputs whose forward runs inside ``torch.autocast("cpu",
dtype=torch.bfloat16)``, entered at every call, the backward outside (as in a training step), ours and
the floor alike.

Usage: python benchmarks/host_cpu.py [spec] [-T 4] [-n 1024] [--rounds 5] [--layers 4] [--autocast]
"""
from __future__ import annotations

import argparse
import functools
import os
import time
from pathlib import Path
from typing import Callable

os.environ.setdefault("TRITON_INTERPRET", "1")

import torch  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl.bench import _runner, minimal_runner  # noqa: E402
from flexsn_dsl.triton_plan import _kernels  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class _NoLaunch:
    """A kernel whose launch does nothing: ``kernel[grid](*args, **meta)``."""

    def __getitem__(self, grid):
        return self

    def __call__(self, *args, **kwargs):
        return None


class _Stubbed:
    """A kernel module whose kernels launch nothing."""

    def __init__(self, real):
        self.INFO = real.INFO

    def __getattr__(self, name):
        return _NoLaunch()


def per_call_us(fn, batches: int, calls: int = 50) -> float:
    for _ in range(calls):
        fn()
    best = float("inf")
    for _ in range(batches):
        start = time.thread_time_ns()
        for _ in range(calls):
            fn()
        best = min(best, (time.thread_time_ns() - start) / calls / 1e3)
    return best


def best_of(runs: dict[str, Callable], rounds: int, batches: int, calls: int = 50) -> dict[str, float]:
    """The best :func:`per_call_us` of each run over ``rounds`` rounds, each run in turn in a round."""
    best = {name: float("inf") for name in runs}
    for _ in range(rounds):
        for name, fn in runs.items():
            best[name] = min(best[name], per_call_us(fn, batches, calls))
    return best


class Chain(torch.nn.Module):
    """L layers, each after an elementwise op; the neurons reset at the start of a call."""

    def __init__(self, layers: list[torch.nn.Module]):
        super().__init__()
        self.layers = torch.nn.ModuleList(layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer in self.layers:
            if isinstance(layer, flexsn_dsl.FlexSN):
                layer.reset()
        for layer in self.layers:
            x = layer(x * 1.1)
        return x


def chain_rows(spec: str, x: torch.Tensor, layers: int, rounds: int) -> dict[str, float]:
    """Host us per training call of a chain of ReLUs and of our neurons, eager and compiled."""
    grad = torch.randn_like(x)
    runs = {}
    for kind in ("relu", "flexsn-dsl"):
        net = Chain([flexsn_dsl.load(spec, backend="triton") if kind == "flexsn-dsl" else torch.nn.ReLU()
                     for _ in range(layers)])
        compiled = torch.compile(net, fullgraph=True)
        runs[f"{kind} eager"] = lambda net=net: torch.autograd.grad(net(x), [x], grad)
        runs[f"{kind} compiled"] = lambda net=compiled: torch.autograd.grad(net(x), [x], grad)
    return best_of(runs, rounds, batches=10, calls=20)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("spec", nargs="?", default=str(ROOT / "neurons" / "lif.yaml"))
    parser.add_argument("-T", type=int, default=4)
    parser.add_argument("-n", type=int, default=1024)
    parser.add_argument("--rounds", type=int, default=5, help="rounds, each variant in turn (default 5)")
    parser.add_argument("--layers", type=int, default=0, help="also time a chain of this many layers, eager and "
                        "compiled (default: no chain)")
    parser.add_argument("--autocast", action="store_true", help="also calls on bfloat16 inputs under autocast")
    args = parser.parse_args()
    torch.set_num_threads(1)  # the compiled chain's elementwise kernels: no OpenMP threads on a shared machine
    m = flexsn_dsl.load(args.spec, backend="triton")
    kernels = _kernels(m._compiled, "cpu")  # shared by every module of this spec
    kernels.module = _Stubbed(kernels.module)  # before any launch plan is built
    x = torch.rand(args.T, args.n, requires_grad=True)
    xs = [x] * len(m.spec.inputs)
    cases = {mode: (xs, None) for mode in ("inference", "training")}
    if args.autocast:
        xs16 = [x.detach().bfloat16().requires_grad_()] * len(xs)
        autocast = functools.partial(torch.autocast, "cpu", dtype=torch.bfloat16)
        cases.update({f"{mode} autocast": (xs16, autocast) for mode in ("inference", "training")})
    runs = {}
    for case, (inputs, forward_in) in cases.items():
        for impl, make in (("flexsn-dsl", _runner), ("minimal", minimal_runner)):
            run = make(m, inputs, case.split()[0], forward_in)
            if run is not None:  # (no floor for a spec whose kernels take parameters)
                runs[f"{impl} {case}"] = run
    best = best_of(runs, args.rounds, batches=20)
    print(f"{m.spec.name}, T={args.T}, n={args.n}, launches stubbed; host us per call (best of {args.rounds} rounds)")
    for case in cases:
        ours, floor = best[f"flexsn-dsl {case}"], best.get(f"minimal {case}")
        print(f"{case:19s} flexsn-dsl {ours:7.1f} us   " + (f"minimal Function {floor:7.1f} us   ratio {ours / floor:5.2f}x"
                                                         if floor else "minimal Function: none (runtime parameters)"))
    if args.layers:
        chain = chain_rows(args.spec, x, args.layers, args.rounds)
        print(f"chain of {args.layers} layers, training call, host us: " +
              ", ".join(f"{name} {us:.1f}" for name, us in chain.items()))
        for column in ("eager", "compiled"):
            added = (chain[f"flexsn-dsl {column}"] - chain[f"relu {column}"]) / args.layers
            print(f"one layer of ours adds {added:7.1f} us over ReLU ({column})")


if __name__ == "__main__":
    main()
