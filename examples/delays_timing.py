"""Why delays matter: classes that differ only in the timing between channels (offline, CPU, under a minute).

Each sample has ``C`` channels that spike once each; class ``n`` fires channel ``i`` at ``start + offset[n, i]``
(a fixed random pattern per class, ``start`` random per sample). Every sample thus holds the same spikes, one per
channel, and only their relative timing tells the class. The network is DelayLinear(C -> H) -> LIF with
``tau = 1`` (no memory from step to step: ``neurons/lif.yaml``) -> Linear(H -> classes), read out as the
spike counts. Without delays (the same network with nn.Linear) a hidden neuron sees one channel's spike at a
time, so its spike count is the same for every class: chance accuracy. With learned delays a hidden neuron
lines the spikes of one class's pattern up and fires on their coincidence.

    python examples/delays_timing.py              # both networks, a few seconds on one CPU core
"""
from __future__ import annotations

import argparse
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl

SPEC = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"


def make_data(n: int, classes: int, channels: int, spread: int, steps: int, patterns: torch.Tensor,
              generator: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """``x [steps, n, channels]`` (one spike per channel) and the labels ``[n]``."""
    labels = torch.randint(classes, (n,), generator=generator)
    start = torch.randint(steps - spread, (n, 1), generator=generator)
    x = torch.zeros(steps, n, channels)
    x.scatter_(0, (start + patterns[labels]).unsqueeze(0), 1.0)
    return x, labels


class TimingSNN(nn.Module):
    def __init__(self, channels: int, hidden: int, classes: int, max_delay: int, delays: bool):
        super().__init__()
        self.synapses = (flexsn_dsl.DelayLinear(channels, hidden, max_delay) if delays
                         else nn.Linear(channels, hidden))
        self.neurons = flexsn_dsl.load(SPEC, params={"tau": 1.0})  # memoryless: the spike needs a coincidence
        self.readout = nn.Linear(hidden, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spikes = self.neurons(self.synapses(x))
        self.neurons.reset()
        return self.readout(spikes.sum(0))


def train(delays: bool, args: argparse.Namespace) -> float:
    """Trains one network and returns its test accuracy."""
    torch.manual_seed(args.seed)
    g = torch.Generator().manual_seed(args.seed)
    patterns = torch.stack([torch.randperm(args.spread, generator=g)[:args.channels] for _ in range(args.classes)])
    train_x, train_y = make_data(2048, args.classes, args.channels, args.spread, args.steps, patterns, g)
    test_x, test_y = make_data(1024, args.classes, args.channels, args.spread, args.steps, patterns, g)
    net = TimingSNN(args.channels, args.hidden, args.classes, args.spread, delays)
    optimiser = torch.optim.Adam(net.parameters(), lr=args.lr)
    for epoch in range(args.epochs):
        for i in range(0, len(train_y), 128):
            loss = nn.functional.cross_entropy(net(train_x[:, i:i + 128]), train_y[i:i + 128])
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
    with torch.no_grad():
        return (net(test_x).argmax(1) == test_y).float().mean().item()


def main(argv: list[str] | None = None) -> dict[str, float]:
    """Trains both networks, prints and returns their test accuracies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--channels", type=int, default=6)
    parser.add_argument("--classes", type=int, default=4)
    parser.add_argument("--spread", type=int, default=8, help="offsets of a pattern lie in [0, spread)")
    parser.add_argument("--steps", type=int, default=24)
    parser.add_argument("--hidden", type=int, default=32)
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--lr", type=float, default=0.02)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(1)  # small tensors: more threads on a busy machine are slower
    accuracies = {}
    for name, delays in (("without delays", False), ("with learned delays", True)):
        accuracies[name] = train(delays, args)
        print(f"{name:19}: test accuracy {accuracies[name]:.3f} (chance {1 / args.classes:.3f})")
    return accuracies


if __name__ == "__main__":
    main()
