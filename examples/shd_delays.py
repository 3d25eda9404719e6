"""Train learnable delays on the Spiking Heidelberg Digits (SHD), as DCLS-Delays and mlGeNN do, and print each
epoch's time: 700 -> 256 -> 256 -> 20, a ``DelayLinear`` (one learned delay per synapse) per layer, LIF neurons
in the hidden layers and leaky integrators read out as logits (``--readout spikes``: LIF and spike counts, the
network ``benchmarks/delay_bench.py`` times).

With ``--data DIR`` it reads ``shd_train.h5`` and ``shd_test.h5`` from DIR (the files of Cramer et al. 2020,
https://zenkelab.org/resources/spiking-heidelberg-datasets-shd/; reading them needs ``pip install h5py``), bins
every sample's spikes into ``--steps`` steps of ``--dt`` seconds (a spike at time t into step floor(t / dt);
later ones are dropped) and reports the test accuracy after each epoch. Without it, it trains on RANDOM spikes
of SHD's shapes (8,156 training samples, random labels: the accuracy means nothing there, the epoch time does),
which is how the GPU benchmark runs it where the data set cannot be downloaded.

    python examples/shd_delays.py --data ~/data/shd --epochs 30 --max-delay 250    # the real data
    python examples/shd_delays.py --epochs 1 --max-delay 64                          # random data, epoch time
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl

LIF = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"
CHANNELS, CLASSES, TRAIN_SAMPLES = 700, 20, 8156


class DelayNet(nn.Module):
    """``sizes[0] -> ... -> sizes[-1]``: a DelayLinear and LIF neurons per layer. The logits: the last layer's
    spike counts (``readout="spikes"``), or with ``readout="li"`` its neurons are leaky integrators
    (neurons/li.yaml) and the logits their mean membrane potential over time, as DCLS-Delays reads SHD out."""

    def __init__(self, sizes: tuple[int, ...], max_delay: int, backend: str = "auto", readout: str = "spikes"):
        super().__init__()
        self.layers = nn.ModuleList(flexsn_dsl.DelayLinear(a, b, max_delay, backend=backend)
                                    for a, b in zip(sizes, sizes[1:]))
        specs = [LIF] * (len(self.layers) - 1) + [LIF if readout == "spikes" else LIF.with_name("li.yaml")]
        self.neurons = nn.ModuleList(flexsn_dsl.load(spec, backend=backend) for spec in specs)
        self.readout = readout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, neuron in zip(self.layers, self.neurons):
            x = layer(x)  # (a statement apart: nothing holds the layer's input while its neurons run)
            x = neuron(x)
            neuron.reset()
        return x.sum(0) if self.readout == "spikes" else x.mean(0)


def bin_events(times: list, units: list, steps: int, dt: float, device: torch.device) -> torch.Tensor:
    """Spike events of a batch (per sample: times in seconds, channels) as ``[steps, B, 700]`` counts capped at 1."""
    x = torch.zeros(steps, len(times), CHANNELS, device=device)
    for b, (t, u) in enumerate(zip(times, units)):
        step = torch.as_tensor(t, dtype=torch.float64).div(dt).floor().long()
        keep = step < steps
        x[step[keep].to(device), b, torch.as_tensor(u, dtype=torch.long)[keep].to(device)] = 1.0
    return x


def read_shd(path: Path) -> tuple[list, list, torch.Tensor]:
    """An SHD file's spike times, channels and labels."""
    try:
        import h5py  # noqa: PLC0415 (only for the real data)
    except ImportError:
        sys.exit("reading SHD's .h5 files needs h5py: pip install h5py")
    with h5py.File(path, "r") as f:
        return list(f["spikes"]["times"]), list(f["spikes"]["units"]), torch.as_tensor(f["labels"][:]).long()


def random_shd(samples: int, steps: int, dt: float, rate: float, seed: int) -> tuple[list, list, torch.Tensor]:
    """Random events of SHD's shapes: each channel spikes at ``rate`` Hz over the ``steps`` steps; random labels.
    Made on the CPU, as the events read from SHD's files are, whatever torch's default device."""
    g = torch.Generator().manual_seed(seed)
    times, units = [], []
    with torch.device("cpu"):
        for _ in range(samples):
            n = int(torch.poisson(torch.tensor(rate * steps * dt * CHANNELS), generator=g))
            times.append(torch.rand(n, generator=g, dtype=torch.float64) * steps * dt)
            units.append(torch.randint(CHANNELS, (n,), generator=g))
        return times, units, torch.randint(CLASSES, (samples,), generator=g)


def run_epoch(net: nn.Module, data, steps: int, dt: float, batch: int, device: torch.device,
              optimiser: torch.optim.Optimizer | None) -> tuple[float, float, float]:
    """One pass over ``data`` (training when ``optimiser`` is given): seconds (binning included), mean loss,
    accuracy."""
    times, units, labels = data
    order = torch.randperm(len(labels)) if optimiser else torch.arange(len(labels))
    total, correct, loss_sum = 0, 0, 0.0
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    with torch.set_grad_enabled(optimiser is not None):
        for i in range(0, len(order), batch):
            idx = order[i:i + batch].tolist()
            x = bin_events([times[k] for k in idx], [units[k] for k in idx], steps, dt, device)
            y = labels[idx].to(device)
            logits = net(x)
            loss = nn.functional.cross_entropy(logits, y)
            if optimiser is not None:
                optimiser.zero_grad(set_to_none=True)
                loss.backward()
                optimiser.step()
            total, correct = total + len(idx), correct + int((logits.argmax(1) == y).sum())
            loss_sum += float(loss.detach()) * len(idx)
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start, loss_sum / max(total, 1), correct / max(total, 1)


def main(argv: list[str] | None = None) -> list[float]:
    """Train; returns each epoch's seconds."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--data", type=Path, help="a folder with shd_train.h5 and shd_test.h5 (default: random data)")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--steps", type=int, default=1127, help="time steps a sample is binned into (default 1127)")
    p.add_argument("--dt", type=float, default=1e-3, help="seconds per step (default 1 ms)")
    p.add_argument("--batch", type=int, default=256)
    p.add_argument("--hidden", type=int, default=256)
    p.add_argument("--max-delay", type=int, default=64, help="the longest delay, in steps (default 64)")
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--readout", choices=("li", "spikes"), default="li",
                   help="logits: leaky integrators' mean potential (default) or the last LIF layer's spike counts")
    p.add_argument("--samples", type=int, default=TRAIN_SAMPLES, help="random data: training samples (default 8,156)")
    p.add_argument("--rate", type=float, default=10.0, help="random data: spikes per second and channel")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    if args.data is not None:
        train, test = read_shd(args.data / "shd_train.h5"), read_shd(args.data / "shd_test.h5")
    else:
        train, test = random_shd(args.samples, args.steps, args.dt, args.rate, args.seed), None
    net = DelayNet((CHANNELS, args.hidden, args.hidden, CLASSES), args.max_delay, readout=args.readout).to(device)
    optimiser = torch.optim.Adam(net.parameters(), lr=args.lr)
    print(f"{'SHD from ' + str(args.data) if args.data else 'RANDOM data of SHD shapes'}: {len(train[2])} training "
          f"samples, {args.steps} steps of {args.dt * 1e3:g} ms, batch {args.batch}, 700-{args.hidden}-{args.hidden}-20, "
          f"longest delay {args.max_delay} steps, {device}")
    seconds = []
    for epoch in range(args.epochs):
        wall, loss, acc = run_epoch(net, train, args.steps, args.dt, args.batch, device, optimiser)
        seconds.append(wall)
        line = f"epoch {epoch + 1}: {wall:.1f} s, loss {loss:.3f}, training accuracy {acc:.3f}"
        if test is not None:
            line += f", test accuracy {run_epoch(net, test, args.steps, args.dt, args.batch, device, None)[2]:.3f}"
        print(line, flush=True)
    return seconds


if __name__ == "__main__":
    main()
