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
from pathlib import Path

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


def song_abbott_specs(dt: float):
    """The synapse and neuron of examples/song_abbott.py at time step ``dt``."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    import song_abbott  # noqa: PLC0415
    return (flexsn_dsl.loads(song_abbott.SYNAPSE.replace("dt: 1.0e-3", f"dt: {dt!r}")),
            flexsn_dsl.loads(song_abbott.NEURON, params={"dt": dt}))


def song_abbott(batch: int, steps: int, dt: float, device: torch.device, backends: list[str]) -> None:
    """examples/song_abbott.py's network (1,000 Poisson inputs at 15 Hz, one conductance-based LIF, additive STDP),
    ``batch`` independent copies, ``steps`` steps of ``dt``: simulated seconds per wall second."""
    x = (torch.rand(steps, batch, 1000, device=device) < 15.0 * dt).float()
    for backend in backends:
        synapse, neuron = song_abbott_specs(dt)
        layer = flexsn_dsl.PlasticLinear(synapse, 1000, 1, neuron, per_sample=True, weight=0.005, device=device,
                                         backend=backend)
        seconds = timed(lambda: (layer.reset(), layer(x)), device, 1)
        print(f"Song-Abbott network {backend:6}, {batch} copies, {steps} steps of {dt * 1e3:g} ms: "
              f"{seconds * 1e6 / steps:.2f} us per step ({steps * dt / seconds:.3f} simulated s per wall s)", flush=True)


def brian2_song_abbott(copies: int, seconds: float, target: str) -> None:
    """The same network in Brian2 (its runtime device, code generation ``target``) on the CPU, ``copies`` copies
    in one network (each neuron with its own 1,000 inputs), at Brian2's default step of 0.1 ms."""
    import brian2 as b2  # noqa: PLC0415
    b2.prefs.codegen.target = target
    b2.start_scope()
    ms, mV, Hz = b2.ms, b2.mV, b2.Hz
    n, gmax, taupre, taupost = 1000, 0.01, 20 * ms, 20 * ms
    d_pre = 0.01 * gmax
    d_post = -0.01 * taupre / taupost * 1.05 * gmax
    neurons = b2.NeuronGroup(copies, "dv/dt = (ge * (0*mV - v) + (-74*mV) - v) / (10*ms) : volt\n"
                             "dge/dt = -ge / (5*ms) : 1", threshold="v > -54*mV", reset="v = -60*mV", method="euler")
    neurons.v = -60 * mV
    inputs = b2.PoissonGroup(n * copies, rates=15 * Hz)
    synapses = b2.Synapses(inputs, neurons, "w : 1\ndApre/dt = -Apre / taupre : 1 (event-driven)\n"
                           "dApost/dt = -Apost / taupost : 1 (event-driven)",
                           on_pre="ge += w\nApre += d_pre\nw = clip(w + Apost, 0, gmax)",
                           on_post="Apost += d_post\nw = clip(w + Apre, 0, gmax)",
                           namespace={"taupre": taupre, "taupost": taupost, "d_pre": d_pre, "d_post": d_post,
                                      "gmax": gmax})
    synapses.connect("j == i // n", namespace={"n": n})
    synapses.w = "rand() * gmax"
    net = b2.Network(neurons, inputs, synapses)
    net.run(10 * ms)  # code generation and compilation, not timed
    start = time.perf_counter()
    net.run(seconds * b2.second)
    wall = time.perf_counter() - start
    print(f"Brian2 {b2.__version__} runtime ({target}), {copies} copies, {seconds:g} s of 0.1 ms steps on the CPU: "
          f"{wall * 1e6 / (seconds / 1e-4):.2f} us per step ({seconds / wall:.3f} simulated s per wall s)", flush=True)


def spikingjelly_song_abbott(batch: int, steps: int, dt: float, device: torch.device) -> None:
    """SpikingJelly's ``STDPLearner`` on a Linear(1000, 1) and a LIFNode, stepped from Python (shared weights: it
    has no per-sample ones), on the same inputs."""
    x = (torch.rand(steps, batch, 1000, device=device) < 15.0 * dt).float()
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
    print(f"SpikingJelly STDPLearner (shared weights), {batch} copies, {steps} steps: {seconds * 1e6 / steps:.2f} us per "
          f"step ({steps * dt / seconds:.3f} simulated s per wall s)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=4096)
    parser.add_argument("--backends", nargs="+", default=["triton", "torch"], choices=["triton", "torch"])
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=100, help="steps of the weight-update measurement")
    parser.add_argument("--dt", type=float, default=1e-4, help="the Song-Abbott network's step (default 0.1 ms, Brian2's)")
    parser.add_argument("--brian2", nargs="*", default=[], choices=["numpy", "cython"],
                        help="also Brian2's runtime on the CPU with these code-generation targets")
    parser.add_argument("--brian2-seconds", type=float, default=1.0, help="simulated seconds of the Brian2 run")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()
    device = torch.device(args.device)
    weight_update(args.n, args.repeat, device, args.backends)
    song_abbott(args.batch, args.steps, args.dt, device, args.backends)
    spikingjelly_song_abbott(args.batch, args.steps, args.dt, device)
    for target in args.brian2:
        brian2_song_abbott(args.batch, args.brian2_seconds, target)


if __name__ == "__main__":
    main()
