"""Train a small spiking network on scikit-learn's handwritten digits (offline, CPU, about a minute).

8x8 images (1,797 of them, bundled with scikit-learn) are fed as a constant input current for
T = 8 steps: Linear(64 -> 256) -> parametric LIF (neurons/plif.yaml, a learnable time constant)
-> Linear(256 -> 10), and the class scores are the readout averaged over the steps. Trained with
surrogate gradients through time (Adam, cross-entropy). Prints the loss per epoch and the test
accuracy on a held-out 25 %.

    python examples/digits.py                  # needs scikit-learn: pip install -e ".[dev]"
    python examples/digits.py --epochs 3       # a quicker, rougher run
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl

SPEC = Path(__file__).resolve().parents[1] / "neurons" / "plif.yaml"


class DigitsSNN(nn.Module):
    def __init__(self, hidden: int, steps: int, backend: str):
        super().__init__()
        self.steps = steps
        self.encode = nn.Linear(64, hidden)
        self.neurons = flexsn_dsl.load(SPEC, backend=backend)   # inputs [T, batch, hidden]
        self.readout = nn.Linear(hidden, 10)

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        current = self.encode(images)                                  # [batch, hidden]
        spikes = self.neurons(current.expand(self.steps, *current.shape))  # [T, batch, hidden]
        self.neurons.reset()                                           # each batch starts at rest
        return self.readout(spikes).mean(0)                            # [batch, 10]


def load_data(seed: int):
    try:
        from sklearn.datasets import load_digits
        from sklearn.model_selection import train_test_split
    except ImportError:
        raise SystemExit("this example needs scikit-learn: pip install scikit-learn (or -e '.[dev]')") from None
    digits = load_digits()
    x = torch.tensor(digits.data, dtype=torch.float32) / 16.0
    y = torch.tensor(digits.target)
    train_idx, test_idx = train_test_split(range(len(y)), test_size=0.25, random_state=seed, stratify=y)
    return x[train_idx], y[train_idx], x[test_idx], y[test_idx]


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--steps", type=int, default=8, help="time steps T")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU threads for torch (default 1: the tensors are small, and more threads on a busy "
                        "machine are many times slower)")
    args = parser.parse_args(argv)

    torch.set_num_threads(args.threads)
    torch.manual_seed(args.seed)
    x_train, y_train, x_test, y_test = load_data(args.seed)
    model = DigitsSNN(args.hidden, args.steps, args.backend)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, max(args.epochs, 1))
    print(f"digits: {len(y_train)} training and {len(y_test)} test images, T={args.steps}, "
          f"neuron {model.neurons.spec.name} ({SPEC.name})")
    for epoch in range(1, args.epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(len(y_train))
        total, correct = 0.0, 0
        for i in range(0, len(order), args.batch):
            batch = order[i:i + args.batch]
            scores = model(x_train[batch])
            loss = nn.functional.cross_entropy(scores, y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
            correct += int((scores.argmax(1) == y_train[batch]).sum())
        schedule.step()
        print(f"epoch {epoch:2d}: loss {total / len(order):.4f}, train accuracy {correct / len(order):.3f} "
              f"({time.perf_counter() - start:.1f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        accuracy = float((model(x_test).argmax(1) == y_test).float().mean())
    print(f"test accuracy: {accuracy:.4f}")
    return accuracy


if __name__ == "__main__":
    main()
