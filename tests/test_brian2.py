"""Continuous-time specs against Brian2 (a test-only peer; skipped where it is not installed).

The same equations, inputs, method, threshold, reset and refractory period run in Brian2
(numpy code generation, float64) and through both backends; every state trace and the spike
raster must agree. Inputs are per-step values held over the step: in Brian2 a TimedArray read
through a subexpression flagged ``(constant over dt)``. Brian2's state monitors record at the
start of a time step, before the update, by default; here they record ``when="end"``, after the
threshold and reset of the step, which is what a module's state holds after that step.
Time is in ms on both sides (the specs are unitless).
"""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import flexsn_dsl

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_continuous import ADEX_LIKE, ADEX_PARAMETERS  # noqa: E402 - the same AdEx-like spec

brian2 = pytest.importorskip("brian2")

BACKENDS = ["torch", "triton"]
ROOT = Path(__file__).resolve().parents[1]


def _brian(equations: str, x: np.ndarray, dt: float, method: str, init: dict, record: list[str], *,
           threshold: str | None = None, reset: str | None = None, refractory: float | str | None = None,
           namespace: dict | None = None):
    """Run a NeuronGroup on inputs ``x`` [T, N]; returns (spikes [T, N], {state: [T, N]})."""
    b = brian2
    b.prefs.codegen.target = "numpy"
    T, N = x.shape
    I_in = b.TimedArray(x, dt=dt * b.ms)
    group = b.NeuronGroup(N, equations, threshold=threshold, reset=reset, method=method,
                          refractory=(refractory if isinstance(refractory, str) else refractory * b.ms) if refractory
                          else False,
                          namespace={**(namespace or {}), "I_in": I_in, "ms": b.ms}, dt=dt * b.ms)
    for name, value in init.items():
        setattr(group, name, value)
    states = b.StateMonitor(group, record, record=True, when="end", dt=dt * b.ms)
    spikes = b.SpikeMonitor(group)
    b.Network(group, states, spikes).run(T * dt * b.ms)
    raster = np.zeros((T, N))
    steps = np.round(np.asarray(spikes.t / b.ms) / dt).astype(int)
    raster[steps, np.asarray(spikes.i)] = 1
    return raster, {name: np.asarray(getattr(states, name)).T for name in record}


def _ours(text: str, x: np.ndarray, backend: str, outputs: list[str]):
    m = flexsn_dsl.loads(text, backend=backend, store_state_seqs=True).double()
    y = m(torch.tensor(x, dtype=torch.float64))
    y = y if isinstance(y, tuple) else (y,)
    return dict(zip(outputs, y)), m.state_seqs


def _inputs(T: int, N: int, lo: float, hi: float, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).uniform(lo, hi, size=(T, N))


def _compare(ours, seqs, raster, traces, names):
    spikes = ours["s"].cpu().numpy() if "s" in ours else None
    if spikes is not None:
        assert 0 < raster.sum() < raster.size, "the test needs some spikes, not all"
        np.testing.assert_array_equal(spikes, raster)
    for name in names:
        np.testing.assert_allclose(seqs[name].cpu().numpy(), traces[name], rtol=1e-9, atol=1e-9)


LIF = """
neuron: lif_b2
inputs: [I]
parameters: {tau: 10.0, R: 1.0, v_rest: 0.0, v_th: 1.0, v_reset: 0.0, t_ref: 2.0, dt: 0.5}
states: {v: 0.0}
equations:
  v: (v_rest - v + R * I) / tau
method: exact
threshold: v >= v_th
reset: {v: v_reset}
refractory: {period: t_ref}
outputs: [s]
"""
LIF_B2 = """
dv/dt = (v_rest - v + R * I) / (tau * ms) : 1 (unless refractory)
I = I_in(t, i) : 1 (constant over dt)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_lif_with_refractory_period(backend):
    x = _inputs(80, 5, 0.0, 3.0, 1)
    ns = dict(tau=10.0, R=1.0, v_rest=0.0, v_th=1.0, v_reset=0.0)
    raster, traces = _brian(LIF_B2, x, 0.5, "exact", {}, ["v"], threshold="v >= v_th", reset="v = v_reset",
                            refractory=2.0, namespace=ns)
    ours, seqs = _ours(LIF, x, backend, ["s"])
    _compare(ours, seqs, raster, traces, ["v"])


CUBA = """
neuron: cuba_b2
inputs: [I]
parameters: {tau_m: 5.0, tau_s: 2.0, R: 3.0, v_th: 1.0, dt: 0.25}
states: {v: 0.0, i_syn: 0.0}
equations:
  v: (-v + R * i_syn) / tau_m
  i_syn: (I - i_syn) / tau_s
method: exact
threshold: v >= v_th
reset: {v: 0.0}
outputs: [s]
"""
CUBA_B2 = """
dv/dt = (-v + R * i_syn) / (tau_m * ms) : 1
di_syn/dt = (I - i_syn) / (tau_s * ms) : 1
I = I_in(t, i) : 1 (constant over dt)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_coupled_cuba(backend):
    x = _inputs(60, 4, 0.0, 1.0, 2)
    raster, traces = _brian(CUBA_B2, x, 0.25, "exact", {}, ["v", "i_syn"], threshold="v >= v_th", reset="v = 0",
                            namespace=dict(tau_m=5.0, tau_s=2.0, R=3.0, v_th=1.0))
    ours, seqs = _ours(CUBA, x, backend, ["s"])
    _compare(ours, seqs, raster, traces, ["v", "i_syn"])


ADEX_B2 = """
dv/dt = (-v + delta_T * exp((v - v_T) / delta_T) - w + I) / (tau_m * ms) : 1
dw/dt = (a * v - w) / (tau_w * ms) : 1
I = I_in(t, i) : 1 (constant over dt)
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["euler", "rk2", "rk4"])
def test_explicit_methods(method, backend):
    """(exponential_euler is compared on Hodgkin-Huxley below: for v here, whose derivative is not
    linear in v, the language prescribes Euler, while Brian2 moves exp(v) into the B of A v + B.)"""
    x = _inputs(60, 4, 0.5, 2.5, 3)
    ns = {k: v for k, v in ADEX_PARAMETERS.items() if k != "dt"}
    raster, traces = _brian(ADEX_B2, x, ADEX_PARAMETERS["dt"], method, {"w": 0.1}, ["v", "w"],
                            threshold="v >= v_th", reset="v = 0\nw = w + b", namespace=ns)
    ours, seqs = _ours(ADEX_LIKE.replace("METHOD", method), x, backend, ["s", "v", "w"])
    _compare(ours, seqs, raster, traces, ["v", "w"])


HH_B2 = """
dV/dt = (I - g_Na * m**3 * h * (V - E_Na) - g_K * n**4 * (V - E_K) - g_L * (V - E_L)) / (C * ms) : 1
dm/dt = (alpha_m * (1 - m) - beta_m * m) / ms : 1
dh/dt = (alpha_h * (1 - h) - beta_h * h) / ms : 1
dn/dt = (alpha_n * (1 - n) - beta_n * n) / ms : 1
alpha_m = 0.1 * 10 / exprel(-(V + 40) / 10) : 1
beta_m = 4 * exp(-(V + 65) / 18) : 1
alpha_h = 0.07 * exp(-(V + 65) / 20) : 1
beta_h = 1 / (1 + exp(-(V + 35) / 10)) : 1
alpha_n = 0.01 * 10 / exprel(-(V + 55) / 10) : 1
beta_n = 0.125 * exp(-(V + 65) / 80) : 1
I = I_in(t, i) : 1 (constant over dt)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_hodgkin_huxley_exponential_euler(backend):
    """The zoo's hh, refractory while V >= 0 after a spike: one spike per action potential, as Brian2's
    refractory='V >= 0' (Brian2 writes the removable singularities with exprel)."""
    x = _inputs(300, 3, 0.0, 40.0, 4)  # three action potentials a neuron (spikes at steps 12-14, 137-154, 252-280)
    ns = dict(C=1.0, g_Na=120.0, g_K=36.0, g_L=0.3, E_Na=50.0, E_K=-77.0, E_L=-54.387)
    init = {"V": -65.0, "m": 0.0529325, "h": 0.5961207, "n": 0.3176769}
    raster, traces = _brian(HH_B2, x, 0.1, "exponential_euler", init, ["V", "m", "h", "n"], threshold="V >= 0",
                            refractory="V >= 0", namespace=ns)
    above = traces["V"] >= 0  # every upward crossing of 0 mV is one spike, and nothing else is
    crossings = above & ~np.vstack([np.zeros((1, above.shape[1]), bool), above[:-1]])
    np.testing.assert_array_equal(raster, crossings)
    assert (above.sum(0) > 2 * raster.sum(0)).all()  # an action potential stays above 0 for several steps
    assert (raster.sum(0) == 3).all()  # the threshold crossed again after each refractory period
    ours, seqs = _ours((ROOT / "neurons" / "hh.yaml").read_text(), x, backend, ["s", "V"])
    _compare(ours, seqs, raster, traces, ["V", "m", "h", "n"])


ML_B2 = """
dV/dt = (I - g_L * (V - V_L) - g_Ca * m_inf * (V - V_Ca) - g_K * w * (V - V_K)) / (C * ms) : 1
dw/dt = phi * (w_inf - w) * cosh((V - V3) / (2 * V4)) / ms : 1
m_inf = 0.5 * (1 + tanh((V - V1) / V2)) : 1
w_inf = 0.5 * (1 + tanh((V - V3) / V4)) : 1
I = I_in(t, i) : 1 (constant over dt)
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_morris_lecar_with_a_crossing_threshold(backend):
    """The zoo's morris_lecar (cosh in its gating time constant), refractory while V >= 0 after a spike: one spike
    per action potential, as Brian2's refractory='V >= 0'."""
    x = _inputs(900, 3, 80.0, 220.0, 6)  # two action potentials a neuron (spikes at steps 84-92 and 771-809)
    ns = dict(C=20.0, g_L=2.0, V_L=-60.0, g_Ca=4.4, V_Ca=120.0, g_K=8.0, V_K=-84.0, V1=-1.2, V2=18.0, V3=2.0,
              V4=30.0, phi=0.04)
    raster, traces = _brian(ML_B2, x, 0.1, "rk4", {"V": -60.0, "w": 0.0149}, ["V", "w"],
                            threshold="V >= 0", refractory="V >= 0", namespace=ns)
    ours, seqs = _ours((ROOT / "neurons" / "morris_lecar.yaml").read_text(), x, backend, ["s", "V"])
    _compare(ours, seqs, raster, traces, ["V", "w"])
    assert ((traces["V"] >= 0).sum(0) > 3 * raster.sum(0)).all()  # each action potential lasts many steps
    assert (raster.sum(0) == 2).all()  # the threshold crossed again after a refractory period has ended
