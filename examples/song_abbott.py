"""Song, Miller and Abbott 2000: 1,000 Poisson inputs onto one conductance-based LIF neuron, additive STDP with
depression slightly stronger than potentiation; the weights end bimodal (near 0 or near w_max).

A batch of independent copies (``per_sample=True``: one weight matrix per batch entry) learns at once. The
numbers are those of Brian2's example ``synapses/STDP.py``. Prints the histogram of the final weights
(w / w_max, 10 bins) and saves it as a picture when matplotlib is installed.

    python examples/song_abbott.py [--seconds 100] [--batch 64] [--device cuda]
"""
from __future__ import annotations

import argparse

import torch

import flexsn_dsl

NEURON = """\
neuron: song_lif
description: Conductance-based LIF; ge decays exactly, v by an Euler step of dt.
inputs: [x]
parameters: {dt: 1.0e-3, tau_m: 10.0e-3, tau_e: 5.0e-3, e_e: 0.0, e_l: -74.0e-3, v_t: -54.0e-3, v_r: -60.0e-3}
states: {v: -60.0e-3, ge: 0.0}
step:
  ge: ge * exp(-dt / tau_e) + x
  h: v + dt * (ge * (e_e - v) + e_l - v) / tau_m
  s: spike(h - v_t)
  v: where(s > 0, v_r, h)
outputs: [s]
"""

SYNAPSE = """\
kind: synapse
name: song_stdp
params: {tau_pre: 20.0e-3, tau_post: 20.0e-3, w_max: 0.01, a_pre: 1.0e-4, a_post: -1.05e-4}
dt: 1.0e-3
pre:
  apre: {decay: exp(-dt / tau_pre)}
post:
  apost: {decay: exp(-dt / tau_post)}
on_pre:
  - apre: apre + a_pre
  - w: clip(w + apost, 0, w_max)
on_post:
  - apost: apost + a_post
  - w: clip(w + apre, 0, w_max)
"""


def main(argv: list[str] | None = None) -> torch.Tensor:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=100.0, help="simulated time (default 100 s)")
    parser.add_argument("--batch", type=int, default=64, help="independent copies (default 64)")
    parser.add_argument("--inputs", type=int, default=1000)
    parser.add_argument("--rate", type=float, default=15.0, help="input rate in Hz (default 15)")
    parser.add_argument("--chunk", type=int, default=1000, help="steps per call (default 1000)")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--dt", type=float, default=1.0e-4, help="time step in s (default 0.1 ms, Brian2's)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch.device(args.device)
    dt = args.dt
    synapse = flexsn_dsl.loads(SYNAPSE.replace("dt: 1.0e-3", f"dt: {dt!r}"))
    w_max = synapse.model.params["w_max"]
    neuron = flexsn_dsl.loads(NEURON, params={"dt": dt})
    weight = torch.rand(args.batch, 1, args.inputs) * w_max  # uniform in [0, w_max], as Song et al.
    layer = flexsn_dsl.PlasticLinear(synapse, args.inputs, 1, neuron, per_sample=True, weight=weight, device=device)
    steps = round(args.seconds / dt)
    spikes = 0.0
    for t0 in range(0, steps, args.chunk):
        x = (torch.rand(min(args.chunk, steps - t0), args.batch, args.inputs, device=device) < args.rate * dt).float()
        spikes += float(layer(x).sum())
    w = (layer.weight[:, 0] / w_max).flatten().cpu()
    counts = torch.histc(w, bins=10, min=0.0, max=1.0).long().tolist()
    print(f"{args.batch} copies, {args.seconds:g} s: output rate {spikes / args.batch / args.seconds:.1f} Hz")
    print("w / w_max histogram (10 bins from 0 to 1):", counts)
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return w
    plt.hist(w.numpy(), bins=40)
    plt.xlabel("w / w_max")
    plt.ylabel("synapses")
    plt.savefig("song_abbott.png", dpi=100)
    print("saved song_abbott.png")
    return w


if __name__ == "__main__":
    main()
