"""A whole training step of a conv SNN captured in one CUDA graph, replayed, and checked against eager.

Forward, loss, backward and the optimizer step of a small conv SNN (conv-BN-LIF twice, pooling,
a linear read-out; every spiking layer is neurons/lif.yaml on the Triton backend) are captured
with ``torch.cuda.graph`` and replayed on new batches copied into static input tensors: one
launch of the graph per step, none of the per-call Python. The same steps run eagerly on a copy
of the network, and the losses and final parameters of both are compared.

What capture needs from the neurons: ``reset()`` before the forward inside the captured step
(the states restart from the spec's constants, read by no tensor, so every replay starts from
them too), warm-up steps on a side stream first (they compile the kernels and create the
optimizer's momentum buffers), and no ``FLEXSN_DSL_AUTOTUNE`` (autotuning times kernels, which
cannot happen during capture).

    python examples/cuda_graph_step.py              # needs a CUDA GPU
    python examples/cuda_graph_step.py --steps 50 --batch 128
"""
from __future__ import annotations

import argparse
import copy
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl import PerStep

SPEC = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"
WARMUP = 3  # eager steps on a side stream before capture


class ConvSNN(nn.Module):
    def __init__(self, width: int, steps: int):
        super().__init__()
        self.steps = steps
        self.features = nn.Sequential(
            PerStep(nn.Conv2d(3, width, 3, padding=1, bias=False), nn.BatchNorm2d(width)),
            flexsn_dsl.load(SPEC, backend="triton"),
            PerStep(nn.MaxPool2d(2), nn.Conv2d(width, 2 * width, 3, padding=1, bias=False), nn.BatchNorm2d(2 * width)),
            flexsn_dsl.load(SPEC, backend="triton"),
            PerStep(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(2 * width, 10)),
        )

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        flexsn_dsl.reset_net(self)  # every sequence starts from the initial states
        return self.features(images.expand(self.steps, *images.shape)).mean(0)


def batches(n: int, batch: int, size: int, device: torch.device, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return [(torch.randn(batch, 3, size, size, generator=g, device="cpu").to(device),
             torch.randint(0, 10, (batch,), generator=g, device="cpu").to(device)) for _ in range(n)]


def train_step(model: nn.Module, optimizer: torch.optim.Optimizer, images, labels) -> torch.Tensor:
    optimizer.zero_grad(set_to_none=True)
    loss = nn.functional.cross_entropy(model(images), labels)
    loss.backward()
    optimizer.step()
    return loss


def run(steps: int = 20, batch: int = 32, size: int = 16, width: int = 16, T: int = 4, seed: int = 0) -> dict:
    """Train two copies of one network on the same batches, eagerly and by CUDA-graph replay;
    returns the losses of both, the largest parameter difference at the end and ms per step."""
    if not torch.cuda.is_available():
        raise SystemExit("examples/cuda_graph_step.py needs a CUDA GPU (CUDA graphs are a CUDA feature)")
    with torch.backends.cudnn.flags(enabled=True, benchmark=False, deterministic=True):  # the same sums both ways
        return _run(steps, batch, size, width, T, seed)


def _run(steps: int, batch: int, size: int, width: int, T: int, seed: int) -> dict:
    device = torch.device("cuda")
    torch.manual_seed(seed)
    eager = ConvSNN(width, T).to(device)
    graphed = copy.deepcopy(eager)
    data = batches(steps, batch, size, device, seed)
    make_optimizer = lambda m: torch.optim.SGD(m.parameters(), lr=0.05, momentum=0.9)  # noqa: E731
    opt_eager, opt_graphed = make_optimizer(eager), make_optimizer(graphed)

    torch.cuda.synchronize()
    start = time.perf_counter()
    eager_losses = [train_step(eager, opt_eager, x, y).item() for x, y in data]
    eager_ms = (time.perf_counter() - start) / steps * 1e3

    # warm-up on a side stream (kernels compiled, momentum buffers created): real training steps
    graph_losses = []
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for x, y in data[:WARMUP]:
            graph_losses.append(train_step(graphed, opt_graphed, x, y).item())
    torch.cuda.current_stream().wait_stream(side)

    static_x, static_y = torch.empty_like(data[0][0]), torch.empty_like(data[0][1])
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):  # recorded, not run: the first replay is the next step
        static_loss = train_step(graphed, opt_graphed, static_x, static_y)
    torch.cuda.synchronize()
    start = time.perf_counter()
    for x, y in data[WARMUP:]:
        static_x.copy_(x)
        static_y.copy_(y)
        graph.replay()
        graph_losses.append(static_loss.item())
    graph_ms = (time.perf_counter() - start) / max(steps - WARMUP, 1) * 1e3
    diff = max((a - b).abs().max().item() for a, b in zip(eager.parameters(), graphed.parameters()))
    return {"eager_losses": eager_losses, "graph_losses": graph_losses, "max_param_diff": diff,
            "eager_ms": eager_ms, "graph_ms": graph_ms}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--steps", type=int, default=20, help=f"training steps (the first {WARMUP} eager)")
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--size", type=int, default=16, help="image side")
    parser.add_argument("--width", type=int, default=16, help="channels of the first conv")
    parser.add_argument("-T", type=int, default=4, help="time steps")
    args = parser.parse_args(argv)
    if args.steps <= WARMUP:
        parser.error(f"--steps must be more than the {WARMUP} warm-up steps")
    result = run(args.steps, args.batch, args.size, args.width, args.T)
    for k, (a, b) in enumerate(zip(result["eager_losses"], result["graph_losses"])):
        print(f"step {k:3d}: loss eager {a:.6f}  {'graph' if k >= WARMUP else 'warm-up'} {b:.6f}")
    worst = max(abs(a - b) for a, b in zip(result["eager_losses"], result["graph_losses"]))
    print(f"largest loss difference {worst:.2e}; largest parameter difference at the end "
          f"{result['max_param_diff']:.2e}")
    print(f"ms per step (host clock, loss read back each step): eager {result['eager_ms']:.2f}, "
          f"CUDA graph {result['graph_ms']:.2f}")
    return result


if __name__ == "__main__":
    main()
