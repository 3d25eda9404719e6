"""Train a recurrent SNN on SHD-shaped data: [T=100, B, 700] spikes -> 256 recurrent LIF -> 20 classes.

The data are SYNTHETIC (no download): each of the 20 classes is a random pattern of firing
rates over the 700 input channels that drifts across time, and every sample draws Bernoulli
spikes from its class's rates (plus background noise), so a network must integrate over time
to classify. The shape matches the Spiking Heidelberg Digits (SHD) after binning to 100 steps.

Training prints the loss every ``--log-every`` steps; the end reports the accuracy on
held-out samples (``--test-samples``, drawn from the same classes, never trained on).

The hidden layer is ``neurons/rlif.yaml``: its spikes feed back through the learnable
``r_weight`` [256, 256] inside the fused time loop (``backend="auto"``: the Triton kernel on a
GPU, the torch loop on the CPU). The readout is a linear layer on the time-averaged spikes.

Usage: ``python examples/shd_recurrent.py [--steps 200] [--device cuda] [--bf16] [--compile]``;
``--quick`` trains a small network on short sequences for a few steps (a CI smoke test).
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl

ROOT = Path(__file__).resolve().parent.parent


def synthetic_shd(n: int, T: int, channels: int, classes: int, seed: int = 0):
    """``n`` samples [T, n, channels] of Bernoulli spikes from class rate patterns, and labels [n]."""
    with torch.device("cpu"):  # drawn on the CPU: the same data whatever the default device
        gen = torch.Generator().manual_seed(seed)
        start = torch.rand(classes, channels, generator=gen) ** 4 * 0.3  # sparse, a few strong channels
        end = torch.rand(classes, channels, generator=gen) ** 4 * 0.3
        ramp = torch.linspace(0, 1, T)[:, None, None]
        rates = (1 - ramp) * start + ramp * end  # [T, classes, channels]
        labels = torch.randint(0, classes, (n,), generator=gen)
        spikes = (torch.rand(T, n, channels, generator=gen) < rates[:, labels] + 0.01).float()
    return spikes, labels


class RecurrentSNN(nn.Module):
    """700 -> Linear -> recurrent LIF (N neurons) -> time-averaged spikes -> Linear -> classes."""

    def __init__(self, channels: int, hidden: int, classes: int, backend: str = "auto"):
        super().__init__()
        self.fc_in = nn.Linear(channels, hidden)
        self.rlif = flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", sizes={"N": hidden}, backend=backend)
        self.fc_out = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rlif.reset()  # each batch starts from rest
        return self.fc_out(self.rlif(self.fc_in(x)).mean(0))


def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device, batch: int, bf16: bool) -> float:
    """Accuracy on held-out samples ``x`` [T, n, channels], in batches, without gradients."""
    correct = 0
    with torch.no_grad(), torch.autocast(device.type, dtype=torch.bfloat16, enabled=bf16):
        for i in range(0, x.shape[1], batch):
            logits = model(x[:, i:i + batch].to(device))
            correct += int((logits.argmax(1) == y[i:i + batch].to(device)).sum())
    return correct / x.shape[1]


def train(args) -> tuple[float, float, float]:
    """Train; returns (loss of the first step, mean loss of the last 5 steps, held-out test accuracy)."""
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    x_data, y_data = synthetic_shd(args.samples + args.test_samples, args.T, args.channels, args.classes, args.seed)
    x_all, y_all = x_data[:, :args.samples], y_data[:args.samples]  # training samples
    x_test, y_test = x_data[:, args.samples:], y_data[args.samples:]  # held out: the same classes, other samples
    with torch.device(device):
        model = RecurrentSNN(args.channels, args.hidden, args.classes, args.backend)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    forward = torch.compile(model, fullgraph=True) if args.compile else model
    losses = []
    for step in range(args.steps):
        idx = torch.randint(0, args.samples, (args.batch,), device="cpu")
        x, y = x_all[:, idx].to(device), y_all[idx].to(device)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=args.bf16):
            logits = forward(x)
        loss = nn.functional.cross_entropy(logits.float(), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        acc = float((logits.argmax(1) == y).float().mean())
        if step % args.log_every == 0 or step == args.steps - 1:
            print(f"step {step:4d}/{args.steps}  loss {losses[-1]:.3f}  batch accuracy {acc:.2f}", flush=True)
    test_accuracy = evaluate(forward, x_test, y_test, device, args.batch, args.bf16)
    return losses[0], sum(losses[-5:]) / len(losses[-5:]), test_accuracy


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--quick", action="store_true", help="small settings for CI (T=20, 64 channels, 32 neurons)")
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--channels", type=int, default=700)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--classes", type=int, default=20)
    p.add_argument("--samples", type=int, default=4096, help="training samples")
    p.add_argument("--test-samples", type=int, default=1024, help="held-out samples for the test accuracy")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    p.add_argument("--bf16", action="store_true", help="autocast to bfloat16")
    p.add_argument("--compile", action="store_true", help="torch.compile(fullgraph=True) the network")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--log-every", type=int, default=20)
    args = p.parse_args(argv)
    if args.quick:
        args.steps, args.T, args.batch, args.channels, args.hidden = 40, 20, 32, 64, 32
        args.classes, args.samples, args.test_samples, args.lr, args.log_every = 4, 256, 128, 1e-2, 10
    return args


def main(argv=None) -> int:
    args = parse(argv)
    print(f"synthetic SHD-shaped data: T={args.T}, {args.channels} channels, {args.classes} classes "
          f"(not the real SHD); {args.hidden} recurrent LIF neurons, backend={args.backend}, device={args.device}")
    first, last, acc = train(args)
    print(f"loss {first:.3f} -> {last:.3f}, test accuracy {acc:.3f} (held-out samples)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
