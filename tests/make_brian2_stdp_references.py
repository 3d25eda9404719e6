"""Make the Brian2 references of tests/test_plasticity.py (run by hand: needs Brian2; the tests read only
the data files it writes, tests/data/brian2_stdp_<rule>.npz).

Each reference: Poisson presynaptic spike trains (a ``SpikeGeneratorGroup``) into a few LIF neurons
(``dv/dt = -v / tau``, integrated exactly) through all-to-all synapses with event-driven STDP, Brian2's
runtime target (numpy), ``dt`` as the synapse spec's. The rules are written here in Brian2's own terms,
independently of the synapse specs (only their numbers are read from tests/specs/).

Timing, to match flexsn-dsl's step (docs/synapses.md): Brian2 runs ``on_pre`` in the ``synapses`` slot,
after the neurons' update and threshold, so its ``v_post += w`` reaches the neuron one step later than
flexsn-dsl's ``I = W s_pre``. Here the presynaptic pathway runs in the ``thresholds`` slot instead, after
the spike generator (order -2) and before the neurons' threshold (order 0): the weights a pre spike adds
are those before this step's updates, and the neuron crosses its threshold in the same step. ``on_post``
stays in the ``synapses`` slot, after ``on_pre``. A pre line that reads no neuron state gives the same
result in either slot.

    PYTHONPATH=. python tests/make_brian2_stdp_references.py
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
N_PRE, N_POST, STEPS, CHUNK = 24, 3, 1500, 250  # weights stored after every chunk of steps
RATE = 20.0  # Hz, per input
NEURON = {"tau": 10.0e-3, "v_th": 1.0, "v_reset": 0.0}  # tests/specs/lif_brian2.yaml

# The rules in Brian2's terms: (synaptic model, on_pre after `v_post += w`, on_post).
RULES = {
    "pair": ("""w : 1
                dapre/dt = -apre / tau_pre : 1 (event-driven)
                dapost/dt = -apost / tau_post : 1 (event-driven)""",
             "apre += a_plus\nw = clip(w + apost, 0, w_max)",
             "apost += a_minus\nw = clip(w + apre, 0, w_max)"),
    "multiplicative": ("""w : 1
                dapre/dt = -apre / tau_pre : 1 (event-driven)
                dapost/dt = -apost / tau_post : 1 (event-driven)""",
                       "apre += a_plus\nw = clip(w + apost * w, 0, w_max)",
                       "apost += a_minus\nw = clip(w + apre * (w_max - w), 0, w_max)"),
    "triplet": ("""w : 1
                dr1/dt = -r1 / tau_plus : 1 (event-driven)
                dr2/dt = -r2 / tau_x : 1 (event-driven)
                do1/dt = -o1 / tau_minus : 1 (event-driven)
                do2/dt = -o2 / tau_y : 1 (event-driven)""",
                "w = clip(w - o1 * (a2_minus + a3_minus * r2), 0, w_max)\nr1 += 1\nr2 += 1",
                "w = clip(w + r1 * (a2_plus + a3_plus * o2), 0, w_max)\no1 += 1\no2 += 1"),
}
SPECS = {"pair": "stdp_pair.yaml", "multiplicative": "stdp_multiplicative.yaml", "triplet": "stdp_triplet.yaml"}
W0 = {"pair": (0.05, 0.35), "multiplicative": (0.05, 0.35), "triplet": (0.05, 0.25)}  # initial weights, uniform in


def run(rule: str, seed: int) -> dict[str, np.ndarray]:
    import brian2 as b2
    from flexsn_dsl.synapse import read_synapse

    spec = read_synapse(HERE / "specs" / SPECS[rule])
    b2.start_scope()
    b2.prefs.codegen.target = "numpy"
    dt = spec.dt * b2.second
    b2.defaultclock.dt = dt
    rng = np.random.default_rng(seed)
    spikes = rng.random((STEPS, N_PRE)) < RATE * spec.dt
    steps, indices = np.nonzero(spikes)
    w0 = rng.uniform(*W0[rule], size=(N_POST, N_PRE))
    namespace = {k: v * b2.second if k.startswith("tau") else v for k, v in spec.params.items()}
    namespace.update(tau=NEURON["tau"] * b2.second, v_th=NEURON["v_th"], v_reset=NEURON["v_reset"])
    inputs = b2.SpikeGeneratorGroup(N_PRE, indices, steps * dt, order=-2)
    neurons = b2.NeuronGroup(N_POST, "dv/dt = -v / tau : 1", threshold="v >= v_th", reset="v = v_reset",
                             method="exact", namespace=namespace)
    model, on_pre, on_post = RULES[rule]
    synapses = b2.Synapses(inputs, neurons, model, on_pre="v_post += w\n" + on_pre, on_post=on_post,
                           namespace=namespace)
    synapses.connect()
    synapses.pre.when, synapses.pre.order = "thresholds", -1
    synapses.w[:] = w0[synapses.j[:], synapses.i[:]]
    monitor = b2.SpikeMonitor(neurons)
    weights = []
    for _ in range(STEPS // CHUNK):
        b2.run(CHUNK * dt)
        matrix = np.zeros((N_POST, N_PRE))
        matrix[synapses.j[:], synapses.i[:]] = synapses.w[:]
        weights.append(matrix)
    post_steps = np.round(np.asarray(monitor.t / dt)).astype(np.int64)
    return {"pre_steps": steps.astype(np.int32), "pre_indices": indices.astype(np.int32), "w0": w0,
            "post_steps": post_steps.astype(np.int32), "post_indices": np.asarray(monitor.i[:], np.int32),
            "weights": np.stack(weights), "shape": np.array([STEPS, N_PRE, N_POST, CHUNK])}


def main() -> None:
    out = HERE / "data"
    out.mkdir(exist_ok=True)
    for k, rule in enumerate(RULES):
        data = run(rule, seed=42 + k)
        np.savez_compressed(out / f"brian2_stdp_{rule}.npz", **data)
        final = data["weights"][-1]
        print(f"{rule}: {len(data['pre_steps'])} pre spikes, {len(data['post_steps'])} post spikes, "
              f"final weights in [{final.min():.3f}, {final.max():.3f}], mean {final.mean():.3f}")


if __name__ == "__main__":
    main()
