"""A convolutional spiking network on CIFAR-shaped data, for the GPU (the data are SYNTHETIC).

The data are not CIFAR-10: this example makes 10 classes of random 3x32x32 images (a fixed
random template per class, blurred, plus noise), so it runs anywhere without a download and
shows the shapes and speed of a conv SNN training step, not CIFAR accuracy. Swap
`synthetic_cifar` for torchvision's CIFAR10 to train on the real thing.

Network (T steps, the image as a constant input current; every spiking layer is
neurons/lif.yaml on inputs [T, B, C, H, W], fused Triton kernels on a GPU):
conv3x3(3->w)-BN-LIF-maxpool, conv3x3(w->2w)-BN-LIF-maxpool, conv3x3(2w->4w)-BN-LIF-avgpool,
linear(4w->10), scores averaged over T.

    python examples/cifar_conv.py              # GPU: 10,000 images, 5 epochs, T=4
    python examples/cifar_conv.py --quick      # CPU-sized: 512 images of 16x16, 3 epochs
"""
from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl import PerStep

SPEC = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"


def synthetic_cifar(n: int, size: int, seed: int, noise: float = 0.6):
    """n images [n, 3, size, size] in 10 classes: a smooth random template per class plus noise."""
    g = torch.Generator().manual_seed(seed)
    templates = nn.functional.avg_pool2d(torch.randn(10, 3, size, size, generator=g), 5, stride=1, padding=2)
    templates = templates / templates.std()
    labels = torch.randint(0, 10, (n,), generator=g)
    images = templates[labels] + noise * torch.randn(n, 3, size, size, generator=g)
    return images, labels


def lif(backend: str) -> nn.Module:
    return flexsn_dsl.load(SPEC, backend=backend)


class ConvSNN(nn.Module):
    def __init__(self, width: int, steps: int, backend: str):
        super().__init__()
        self.steps = steps
        w = width
        self.features = nn.Sequential(
            PerStep(nn.Conv2d(3, w, 3, padding=1, bias=False), nn.BatchNorm2d(w)), lif(backend),
            PerStep(nn.MaxPool2d(2), nn.Conv2d(w, 2 * w, 3, padding=1, bias=False), nn.BatchNorm2d(2 * w)),
            lif(backend),
            PerStep(nn.MaxPool2d(2), nn.Conv2d(2 * w, 4 * w, 3, padding=1, bias=False), nn.BatchNorm2d(4 * w)),
            lif(backend),
            PerStep(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4 * w, 10)),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        scores = self.features(images.expand(self.steps, *images.shape)).mean(0)
        flexsn_dsl.reset_net(self)
        return scores


def main(argv=None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes that run on a CPU in about a minute")
    parser.add_argument("--images", type=int, help="training images (default 10,000; --quick 512)")
    parser.add_argument("--epochs", type=int, help="default 5 (--quick 3)")
    parser.add_argument("--width", type=int, help="channels of the first conv (default 64; --quick 8)")
    parser.add_argument("--steps", type=int, default=4, help="time steps T")
    parser.add_argument("--batch", type=int, help="default 128 (--quick 32)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--backend", default="auto", choices=("auto", "torch", "triton"))
    args = parser.parse_args(argv)
    images = args.images or (512 if args.quick else 10_000)
    epochs = args.epochs or (3 if args.quick else 5)
    width = args.width or (8 if args.quick else 64)
    size = 16 if args.quick else 32
    args.batch = args.batch or (32 if args.quick else 128)
    if args.device == "cpu":
        torch.set_num_threads(1)  # small tensors: more threads on a busy machine are slower

    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    x, y = synthetic_cifar(images + images // 5, size, args.seed)
    x_train, y_train = x[:images].to(device), y[:images].to(device)
    x_test, y_test = x[images:].to(device), y[images:].to(device)
    model = ConvSNN(width, args.steps, args.backend).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
    print(f"SYNTHETIC CIFAR-shaped data (not CIFAR-10): {images} training and {len(y_test)} test images "
          f"3x{size}x{size}, T={args.steps}, width {width}, device {device}")
    for epoch in range(1, epochs + 1):
        start = time.perf_counter()
        model.train()
        order = torch.randperm(images, device=device)
        total = 0.0
        for i in range(0, images, args.batch):
            batch = order[i:i + args.batch]
            loss = nn.functional.cross_entropy(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item() * len(batch)
        if device.type == "cuda":
            torch.cuda.synchronize()
        print(f"epoch {epoch}: loss {total / images:.4f} ({time.perf_counter() - start:.1f} s)", flush=True)
    model.eval()
    with torch.no_grad():
        correct = sum(int((model(x_test[i:i + args.batch]).argmax(1) == y_test[i:i + args.batch]).sum())
                      for i in range(0, len(y_test), args.batch))
    accuracy = correct / len(y_test)
    print(f"test accuracy: {accuracy:.4f} (synthetic data)")
    return accuracy


if __name__ == "__main__":
    main()
