"""Torch backend on CPU: multi-step forward + backward of LIF vs a hand-written torch loop.

The issue's done-when: with T=16 and 65,536 neurons in float32 on the CPU, the torch
backend's forward+backward is within 1.3x of an idiomatic hand-written loop.

    python benchmarks/torch_cpu.py [--T 16] [--n 65536] [--threads 2] [--rounds 30]

Method: all sides get the same input (``[T, n]``, requires_grad) and run
``forward -> (out * w).sum() -> backward``; after a warm-up they are timed in
alternation (A B C A B C ...) with ``time.perf_counter`` (and ``time.process_time``) and
the medians compared, so that drifts of the machine hit all alike. The hand-written loop
is SpikingJelly's LIFNode written out; a second one has the constants folded as the
generated step has them (to separate the loop's overhead from the arithmetic). ``torch.set_num_threads`` is fixed. This is a
benchmark, not a timed test: it prints numbers and never fails on them.
"""
from __future__ import annotations

import argparse
import os
import platform
import statistics
import time
from pathlib import Path

import torch

import flexsn_dsl

ROOT = Path(__file__).resolve().parents[1]


class SigmoidSpike(torch.autograd.Function):
    """Heaviside forward; SpikingJelly's sigmoid surrogate backward (alpha=4)."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        sg = torch.sigmoid(4.0 * x)
        return grad * (1.0 - sg) * sg * 4.0


def hand_lif(x_seq: torch.Tensor, tau: float = 2.0, v_th: float = 1.0, v_reset: float = 0.0) -> torch.Tensor:
    """SpikingJelly's LIFNode (decay_input, hard reset) written out: charge, fire, reset."""
    v = torch.full_like(x_seq[0], v_reset)
    spikes = []
    for t in range(x_seq.shape[0]):
        h = v + (x_seq[t] - (v - v_reset)) / tau
        s = SigmoidSpike.apply(h - v_th)
        v = h * (1.0 - s) + v_reset * s
        spikes.append(s)
    return torch.stack(spikes)


def hand_lif_lean(x_seq: torch.Tensor) -> torch.Tensor:
    """The same neuron with the constants folded by hand (v_reset=0, 1/tau=0.5), as
    flexsn-dsl's generated step has them: the loop's overhead with the same arithmetic."""
    v = torch.zeros_like(x_seq[0])
    spikes = []
    for t in range(x_seq.shape[0]):
        h = 0.5 * v + 0.5 * x_seq[t]
        s = SigmoidSpike.apply(h - 1.0)
        v = h * (1.0 - s)
        spikes.append(s)
    return torch.stack(spikes)


def _time(fn, x, w) -> tuple[float, float]:
    """(wall seconds, process CPU seconds) of one forward+backward."""
    x.grad = None
    c0, t0 = time.process_time(), time.perf_counter()
    y = fn(x)
    (y * w).sum().backward()
    return time.perf_counter() - t0, time.process_time() - c0


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--T", type=int, default=16)
    ap.add_argument("--n", type=int, default=65536)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)

    lif = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="torch")

    def ours(x):
        lif.reset()
        return lif(x)

    x = (torch.rand(args.T, args.n) * 2.5).requires_grad_(True)
    w = torch.randn(args.T, args.n)

    # the two compute the same function and gradient
    x1, x2 = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    y1, y2 = ours(x1), hand_lif(x2)
    (y1 * w).sum().backward()
    (y2 * w).sum().backward()
    assert torch.equal(y1, y2), "outputs differ"
    torch.testing.assert_close(x1.grad, x2.grad, rtol=1e-5, atol=1e-6)
    assert torch.equal(hand_lif_lean(x.detach()), y2)

    for _ in range(args.warmup):
        for fn in (ours, hand_lif, hand_lif_lean):
            _time(fn, x, w)
    ours_name, hand_name, lean_name = "flexsn_dsl (torch backend)", "hand-written loop", "hand-written, folded consts"
    runs = {ours_name: ours, hand_name: hand_lif, lean_name: hand_lif_lean}
    times = {name: [] for name in runs}
    for _ in range(args.rounds):
        for name, fn in runs.items():
            times[name].append(_time(fn, x, w))

    print(f"LIF forward+backward, T={args.T}, n={args.n}, float32, CPU ({_cpu_name()}, {os.cpu_count()} cores), "
          f"{torch.get_num_threads()} threads, torch {torch.__version__}, Python {platform.python_version()}; "
          f"{args.rounds} alternating rounds after {args.warmup} warm-up")
    stats = {}
    for name, ts in times.items():
        wall, cpu = [t for t, _ in ts], [c for _, c in ts]
        q = statistics.quantiles(wall, n=4)
        stats[name] = (statistics.median(wall), min(wall), statistics.median(cpu))
        print(f"  {name:28s} wall median {stats[name][0] * 1e3:8.2f} ms (IQR {q[0] * 1e3:.2f}-{q[2] * 1e3:.2f}, "
              f"min {stats[name][1] * 1e3:.2f})  CPU-time median {stats[name][2] * 1e3:8.2f} ms")
    ratios = [a / b for a, b in zip(stats[ours_name], stats[hand_name])]
    print(f"  ratio flexsn_dsl / hand-written: wall median {ratios[0]:.3f}x, wall min {ratios[1]:.3f}x, "
          f"CPU-time median {ratios[2]:.3f}x  (target <= 1.3x: {'met' if ratios[0] <= 1.3 else 'NOT met'})")
    lean = [a / b for a, b in zip(stats[ours_name], stats[lean_name])]
    print(f"  ratio flexsn_dsl / hand-written with folded constants: wall median {lean[0]:.3f}x, "
          f"wall min {lean[1]:.3f}x, CPU-time median {lean[2]:.3f}x")
    if q[2] > 1.5 * q[0]:  # q: the spread of the last row
        print("  (wide spread: the machine was busy; the min and CPU-time ratios are the steadier figures)")


def _cpu_name() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


if __name__ == "__main__":
    main()
