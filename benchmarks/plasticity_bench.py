"""PlasticLinear's cost per step, fused kernel (``triton``) and torch loop: (1) a whole step of the pair rule on a
large matrix (a batch of one) beside the floor of a dense rule, one read and one write of the weights
(``w.copy_(w2)``); (2) the Song-Miller-Abbott network (1,000
Poisson inputs, one LIF, batch 64 per-sample copies) in simulated seconds per wall second, beside SpikingJelly's
``STDPLearner`` on the same network when it is installed.

    python benchmarks/plasticity_bench.py [--n 4096] [--batch 64] [--steps 1000] [--backends triton torch]
"""
from __future__ import annotations

import argparse
import importlib
import sys
import time
import types

import torch

import flexsn_dsl

PAIR = """\
kind: synapse
name: stdp
params: {tau_pre: 20.0e-3, tau_post: 20.0e-3, a_plus: 0.01, a_minus: -0.0105, w_max: 1.0}
dt: 1.0e-3
pre:
  apre: {decay: exp(-dt / tau_pre)}
post:
  apost: {decay: exp(-dt / tau_post)}
on_pre:
  - apre: apre + a_plus
  - w: clip(w + apost, 0, w_max)
on_post:
  - apost: apost + a_minus
  - w: clip(w + apre, 0, w_max)
"""
LIF = "neuron: lif\nstates: {v: 0.0}\nstep:\n  h: v * 0.9 + x\n  s: spike(h - 1.0)\n  v: h * (1 - s)\n"


def timed(fn, device: torch.device, repeat: int) -> float:
    """Seconds per call of ``fn`` (after one warm-up call)."""
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(repeat):
        fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / repeat


def weight_update(n: int, steps: int, device: torch.device, backends: list[str]) -> None:
    """Per step of the pair rule on an n x n layer (shared weights, a batch of one): the whole step (current,
    neuron, traces, weights) against the floor of a dense rule, one read and one write of the weights."""
    w, other = torch.rand(n, n, device=device), torch.rand(n, n, device=device)
    floor = timed(lambda: w.copy_(other), device, 20)
    x = (torch.rand(steps, 1, n, device=device) < 0.05).float()
    for backend in backends:
        layer = flexsn_dsl.PlasticLinear(flexsn_dsl.loads(PAIR), n, n, flexsn_dsl.loads(LIF), weight=w.clone() * 0.01,
                                         device=device, backend=backend)
        cost = timed(lambda: layer(x), device, 3) / steps
        print(f"PlasticLinear {backend:6} {n}x{n} float32, {steps} steps: {cost * 1e6:.1f} us per step; read+write "
              f"floor {floor * 1e6:.1f} us; ratio {cost / floor:.2f}", flush=True)


def song_abbott(batch: int, steps: int, device: torch.device, backends: list[str]) -> None:
    x = (torch.rand(steps, batch, 1000, device=device) < 0.015).float()
    for backend in backends:
        layer = flexsn_dsl.PlasticLinear(flexsn_dsl.loads(PAIR), 1000, 1, flexsn_dsl.loads(LIF), per_sample=True,
                                         weight=0.005, device=device, backend=backend)
        seconds = timed(lambda: (layer.reset(), layer(x)), device, 1)
        print(f"Song-Abbott network {backend:6}, {batch} copies, {steps} steps: {seconds * 1e3 / steps:.4f} ms per "
              f"step ({steps * 1e-3 / seconds:.2f} simulated s per s)", flush=True)
    try:
        importlib.import_module("torch.utils.tensorboard")  # SpikingJelly's monitor imports it at import time
    except ImportError:  # the STDPLearner never writes a summary: let the import through without tensorboard
        sys.modules["torch.utils.tensorboard"] = types.SimpleNamespace(SummaryWriter=None)
    try:
        from spikingjelly.activation_based import layer as sj_layer, learning, neuron  # noqa: PLC0415
    except ImportError:
        print("spikingjelly is not installed: no STDPLearner comparison")
        return
    fc = sj_layer.Linear(1000, 1, bias=False).to(device)
    lif = neuron.LIFNode(step_mode="s").to(device)
    learner = learning.STDPLearner(step_mode="s", synapse=fc, sn=lif, tau_pre=20.0, tau_post=20.0)

    def run():
        lif.reset()
        learner.reset()
        for t in range(steps):
            lif(fc(x[t]))
            fc.weight.data += learner.step(on_grad=False)

    seconds = timed(run, device, 1)
    print(f"SpikingJelly STDPLearner (shared weights): {seconds * 1e3 / steps:.3f} ms per step")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--backends", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=100, help="steps of the weight-update measurement")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    weight_update(args.n, args.repeat, device, args.backends)
    song_abbott(args.batch, args.steps, device, args.backends)


if __name__ == "__main__":
    main()
