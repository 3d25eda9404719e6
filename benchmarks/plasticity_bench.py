"""PlasticLinear's cost per step: (1) the weight update of the pair rule on a large matrix beside the floor of a
dense rule, one read and one write of the weights (``w.copy_(w2)``); (2) the Song-Miller-Abbott network (1,000
Poisson inputs, one LIF, batch 64 per-sample copies) in simulated seconds per wall second, beside SpikingJelly's
``STDPLearner`` on the same network when it is installed.

    python benchmarks/plasticity_bench.py [--n 4096] [--batch 64] [--steps 1000]
"""
from __future__ import annotations

import argparse
import time

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


def weight_update(n: int, device: torch.device, repeat: int) -> None:
    spec = flexsn_dsl.loads(PAIR)
    w = torch.rand(n, n, device=device)
    other = torch.rand(n, n, device=device)
    apre, apost = torch.rand(1, n, device=device), torch.rand(1, n, device=device)
    pre, post = torch.rand(1, n, device=device) < 0.05, torch.rand(1, n, device=device) < 0.05
    update = lambda w, new, mask: torch.where(mask, new, w)[0]  # noqa: E731 (shared weights, one batch entry)

    def step():
        w2, traces = spec.on_pre(pre, update, w, apre, apost)
        spec.on_post(post, update, w2, *traces)

    floor = timed(lambda: w.copy_(other), device, repeat)
    cost = timed(step, device, repeat)
    print(f"weight update {n}x{n} float32: {cost * 1e6:.1f} us per step; read+write floor {floor * 1e6:.1f} us; "
          f"ratio {cost / floor:.1f}")


def song_abbott(batch: int, steps: int, device: torch.device) -> None:
    layer = flexsn_dsl.PlasticLinear(flexsn_dsl.loads(PAIR), 1000, 1, flexsn_dsl.loads(LIF), per_sample=True,
                                     weight=0.005, device=device)
    x = (torch.rand(steps, batch, 1000, device=device) < 0.015).float()
    seconds = timed(lambda: (layer.reset(), layer(x)), device, 1)
    print(f"Song-Abbott network, {batch} copies, {steps} steps: {seconds * 1e3 / steps:.3f} ms per step "
          f"({steps * 1e-3 / seconds:.2f} simulated s per s)")
    try:
        from spikingjelly.activation_based import layer as sj_layer, learning, neuron
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
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=20)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    weight_update(args.n, device, args.repeat)
    song_abbott(args.batch, args.steps, device)


if __name__ == "__main__":
    main()
