"""The Open Neuromorphic SNN library benchmark's workload, with the peers in the same process.

The workload (open-neuromorphic.github.io, "Spiking Neural Network (SNN) Library Benchmarks", 2023-24): one
``Linear(n, n)`` and one LIF layer, batch 16, T = 500 steps, n neurons; the time of a forward pass, of a
backward pass of ``output.sum()``, and the peak memory of both. Each library gets the input in its own layout
(made once, outside the timing) and its own LIF (the neuron models differ in details: decay, reset, surrogate;
the workload is the same).

Variants: ``linear`` (the Linear layer alone: the cost of everything but the neuron), ``ours`` (flexsn-dsl
``neurons/lif.yaml``: Triton kernels on CUDA, the torch backend on a CPU), ``ours-recompute`` (the same with
``recompute=True``), and where installed ``sj`` (SpikingJelly ``LIFNode``, multi-step: it picks its fastest
backend itself),
``snntorch`` (``Leaky`` stepped in a loop), ``norse`` (``LIFBox`` over the sequence), ``sinabs`` /
``sinabs-exodus`` (``LIF``), ``rockpool`` / ``rockpool-exodus`` (``LIFTorch`` / ``LIFExodus`` after a
``LinearTorch``). A variant that cannot be built or run here says why in its row; nothing is left out silently.

Method: forward = median of ``triton.testing.do_bench`` over forward calls (autograd recording, as in
training); training = the same over forward + backward calls (gradients set to None first); backward = their
difference; peak = ``torch.cuda.max_memory_allocated`` over one forward + backward, beyond what was allocated
before it (the model and its input). ``neuron`` = a variant's training time less ``linear``'s. Before timing,
``ours`` is checked against a hand-written torch loop of the same LIF on the same weights (the fraction of
spikes that differ, and the weight gradient): the ``check`` field. ``linear`` and ours never skip: their
failure is an error.

Usage: ``python benchmarks/open_neuromorphic.py [-n 512 4096 16384] [--variants ...] [--json FILE]``;
``--device cpu --quick`` runs tiny shapes on the CPU (a smoke test, no numbers to keep).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Callable

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl.bench import _peak, _timer
from torch_cpu import hand_lif  # (benchmarks/ is on sys.path when run)

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("linear", "ours", "ours-recompute", "sj", "snntorch", "norse", "sinabs",
            "sinabs-exodus", "rockpool", "rockpool-exodus")
OURS = ("linear", "ours", "ours-recompute")  # never skipped: a failure of these is an error
BATCH_FIRST = {"sinabs", "sinabs-exodus", "rockpool", "rockpool-exodus"}  # their input is [B, T, n]


class Layer(nn.Module):
    """``Linear(n, n)`` then ``neuron`` over a [T, B, n] (or batch-first) sequence; ``first`` picks the
    spikes from what the neuron returns."""

    def __init__(self, n: int, neuron: nn.Module | None, first: bool = False, reset: Callable | None = None):
        super().__init__()
        self.fc, self.neuron, self.first, self.reset_fn = nn.Linear(n, n), neuron, first, reset

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reset_fn is not None:
            self.reset_fn(self)
        y = self.fc(x)
        if self.neuron is None:
            return y
        out = self.neuron(y)
        return out[0] if self.first else out


class OursLIF(nn.Module):
    """flexsn-dsl's LIF from reset states at each call."""

    def __init__(self, backend: str, recompute: bool):
        super().__init__()
        self.lif = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend=backend, recompute=recompute)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.lif.reset()
        return self.lif(x)


class SnnTorchLIF(nn.Module):
    """snnTorch ``Leaky`` (beta 0.5: tau = 2), hard reset to zero, stepped over T."""

    def __init__(self):
        super().__init__()
        import snntorch
        from snntorch import surrogate
        self.cell = snntorch.Leaky(beta=0.5, threshold=1.0, reset_mechanism="zero",
                                   spike_grad=surrogate.sigmoid(slope=4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mem = torch.zeros_like(x[0])
        out = []
        for t in range(x.shape[0]):
            spk, mem = self.cell(x[t], mem)
            out.append(spk)
        return torch.stack(out)


def neuron_of(variant: str, n: int, device: str) -> tuple[nn.Module | None, bool, Callable | None]:
    """The neuron layer of ``variant`` over n neurons, whether its output is a tuple (spikes first), and how
    to reset it before a call (None: it starts from reset states by itself)."""
    if variant == "linear":
        return None, False, None
    if variant in ("ours", "ours-recompute"):
        return OursLIF("triton" if device == "cuda" else "torch", variant == "ours-recompute"), False, None
    if variant == "sj":
        from spikingjelly.activation_based import functional, neuron, surrogate
        node = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), detach_reset=False,
                              step_mode="m")
        return node, False, lambda layer: functional.reset_net(layer)
    if variant == "snntorch":
        return SnnTorchLIF(), False, None
    if variant == "norse":
        from norse.torch import LIFBox, LIFBoxParameters
        value = lambda v: torch.tensor([v], device=device)  # noqa: E731  (a tuple of tensors: not moved by .to)
        p = LIFBoxParameters(tau_mem_inv=value(500.0), v_leak=value(0.0), v_th=value(1.0), v_reset=value(0.0))
        return LIFBox(p), True, None  # (dt 1 ms: the membrane keeps 1 - dt * tau_mem_inv = 0.5 a step)
    if variant in ("sinabs", "sinabs-exodus"):
        import sinabs
        if variant == "sinabs":
            from sinabs.layers import LIF
        else:
            from sinabs.exodus.layers import LIF
        return LIF(tau_mem=torch.tensor(2.0)), False, lambda layer: sinabs.reset_states(layer)
    if variant in ("rockpool", "rockpool-exodus"):
        from rockpool.nn.modules import LIFExodus, LIFTorch
        return (LIFTorch if variant == "rockpool" else LIFExodus)((n,), tau_mem=2e-3, dt=1e-3), True, None
    raise ValueError(f"unknown variant {variant!r}")


def build(variant: str, n: int, device: str) -> Layer:
    """The Linear + LIF layer of ``variant`` on ``device``, its Linear initialised from seed 0."""
    neuron, first, reset = neuron_of(variant, n, device)
    torch.manual_seed(0)
    return Layer(n, neuron, first, reset).to(device)


def check_ours(n: int, T: int, B: int, device: str) -> dict:
    """ours against a hand-written torch loop of the same LIF (``benchmarks/torch_cpu.py``'s ``hand_lif``) on
    the same weights and input: the fraction of spikes that differ (a GPU's rounding can move a membrane
    across the threshold), and the largest difference of the weight gradient relative to its largest value."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(T, B, n, generator=gen) + 0.5).to(device)
    results = []
    for impl in ("ours", "loop"):
        layer = build("ours" if impl == "ours" else "linear", n, device)
        y = layer(x) if impl == "ours" else hand_lif(layer(x))
        y.sum().backward()
        results.append((y.detach(), layer.fc.weight.grad))
    (y0, g0), (y1, g1) = results
    return {"spikes_differing": float((y0 != y1).double().mean()),
            "weight_grad": float((g0 - g1).abs().max() / g1.abs().max().clamp_min(1e-30))}


def measure(variant: str, n: int, args) -> dict:
    """One row: forward, backward and training ms, peak MiB; or why the variant did not run."""
    row: dict = {"variant": variant, "n": n, "T": args.T, "B": args.B}
    try:
        layer = build(variant, n, args.device)
        shape = (args.B, args.T, n) if variant in BATCH_FIRST else (args.T, args.B, n)
        x = torch.randn(shape, generator=torch.Generator().manual_seed(0)).to(args.device)

        def forward():
            return layer(x)

        def train():
            layer.zero_grad(set_to_none=True)
            layer(x).sum().backward()
        train()  # (builds and compiles what it needs, before any timing)
        device = torch.device(args.device)
        timer = _timer(device, repeats=args.repeats, warmup_ms=25, rep_ms=args.rep_ms)
        row["forward_ms"], row["training_ms"] = timer(forward), timer(train)
        row["backward_ms"] = row["training_ms"] - row["forward_ms"]
        row["peak_mib"] = _peak(device, train)  # (None off CUDA)
    except Exception as exc:  # a peer that is missing or fails here: its row says so (ours: an error)
        if variant in OURS:
            raise
        row["skipped"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:160]
    return row


def print_row(row: dict, linear_ms: float | None) -> None:
    head = f"n={row['n']:<6d} {row['variant']:16s}"
    if "skipped" in row:
        print(f"{head} skipped: {row['skipped']}", flush=True)
        return
    peak = "-" if row["peak_mib"] is None else f"{row['peak_mib']:9.1f}"
    neuron = "" if linear_ms is None or row["variant"] == "linear" else \
        f"  neuron {row['training_ms'] - linear_ms:9.3f} ms"
    print(f"{head} forward {row['forward_ms']:9.3f} ms  backward {row['backward_ms']:9.3f} ms  "
          f"training {row['training_ms']:9.3f} ms  peak {peak} MiB{neuron}", flush=True)


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, nargs="+", default=[512, 4096, 16384], help="neurons (default as the blog)")
    parser.add_argument("-T", type=int, default=500)
    parser.add_argument("-B", type=int, default=16)
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--quick", action="store_true", help="tiny shapes (n=32, T=20, B=2): a CPU smoke test")
    parser.add_argument("--repeats", type=int, default=3, help="timed calls off CUDA")
    parser.add_argument("--rep-ms", type=int, default=200, help="do_bench's timed milliseconds on CUDA")
    parser.add_argument("--json", type=Path, help="append the rows to this JSON file")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.T, args.B = [32], 20, 2
    return args


def run(args: argparse.Namespace) -> list[dict]:
    rows = []
    name = torch.cuda.get_device_name() if args.device == "cuda" else "cpu"
    print(f"device {name}; Linear(n, n) + LIF, T={args.T}, batch {args.B}; torch {torch.__version__}", flush=True)
    for n in args.n:
        check = check_ours(n, min(args.T, 64), args.B, args.device) if "ours" in args.variants else None
        if check is not None:
            print(f"n={n:<6d} check against a torch loop of the same LIF: {check['spikes_differing']:.1e} of the "
                  f"spikes differ, the weight gradient within {check['weight_grad']:.1e}")
        linear_ms = None
        for variant in args.variants:
            row = measure(variant, n, args)
            row["check"] = check if variant.startswith("ours") else None
            if variant == "linear" and "skipped" not in row:
                linear_ms = row["training_ms"]
            print_row(row, linear_ms)
            rows.append(row)
    if args.json:
        earlier = json.loads(args.json.read_text()) if args.json.exists() else []
        args.json.write_text(json.dumps(earlier + [{"device": name, "rows": rows}], indent=1))
    return rows


if __name__ == "__main__":
    sys.exit(0 if run(parse()) else 1)
