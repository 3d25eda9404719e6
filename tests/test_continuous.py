"""Continuous-time neurons (language v2, section 1): `equations` lowered to a discrete step.

References are independent of the package: closed-form solutions of linear ODEs, integrators
written out here from their textbook formulas (Brian2's state updaters of the same names), many
small Euler steps, and a hand-written refractory counter with Brian2's `lastspike` semantics.
Every check runs on both backends (Triton through its interpreter on the CPU) in float64.
"""
from __future__ import annotations

import math
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import sympy
import torch

import flexsn_dsl
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.errors import SpecWarning

BACKENDS = ["torch", "triton"]
DTYPE = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
ROOT = Path(__file__).resolve().parents[1]


def _run(text: str, inputs, backend: str, params=None, **kwargs):
    """Load ``text`` and run it on ``inputs`` (a tensor or a tuple); returns (module, outputs tuple)."""
    m = flexsn_dsl.loads(text, backend=backend, params=params, store_state_seqs=True, **kwargs).to(DTYPE)
    inputs = inputs if isinstance(inputs, tuple) else (inputs,)
    y = m(*inputs)
    return m, (y if isinstance(y, tuple) else (y,))


def _inputs(T: int, shape=(3,), lo=0.0, hi=2.0, seed=0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return (lo + (hi - lo) * torch.rand((T, *shape), generator=gen, dtype=DTYPE, device="cpu")).to(torch.get_default_device())


# ---------------------------------------------------------------------------------------------
# exact propagators against closed forms
# ---------------------------------------------------------------------------------------------

LEAKY = """
neuron: leaky_ct
inputs: [I]
parameters: {tau: 3.0, R: 1.5, v_rest: -0.2, dt: 0.7}
states: {v: 0.4}
equations:
  v: (v_rest - v + R * I) / tau
method: exact
outputs: [v]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_lif_matches_the_analytic_solution(backend):
    """Piecewise-constant input: over each step v relaxes exponentially to v_rest + R I."""
    T, tau, R, v_rest, dt = 12, 3.0, 1.5, -0.2, 0.7
    x = _inputs(T)
    _, (v,) = _run(LEAKY, x, backend)
    expected, state = [], torch.full_like(x[0], 0.4)
    for t in range(T):
        target = v_rest + R * x[t]
        state = target + (state - target) * math.exp(-dt / tau)
        expected.append(state)
    torch.testing.assert_close(v, torch.stack(expected), **TIGHT)


def test_exact_lif_folds_to_the_arithmetic_of_the_v1_lif():
    """Constants are folded: one multiply-add per term, no exp left, like the hand-written v1 LIF."""
    ct = compile_spec(ROOT / "neurons" / "lif_ct.yaml").ir
    v1 = compile_spec(ROOT / "neurons" / "lif.yaml").ir
    (update, spike, reset) = [e for _, e in ct.assignments]
    I, v = sympy.Symbol("I", real=True), sympy.Symbol("v", real=True)
    assert not update.has(sympy.exp)
    assert sympy.expand(update - (math.exp(-0.5) * v + (1 - math.exp(-0.5)) * I)).free_symbols == set()
    assert abs(float(update.coeff(v)) - math.exp(-0.5)) < 1e-15
    assert sum(sympy.count_ops(e) for _, e in ct.assignments) <= sum(sympy.count_ops(e) for _, e in v1.assignments)


CUBA = """
neuron: cuba_ct
inputs: [x]
parameters: {tau_m: 4.0, tau_s: 4.0, R: 2.0, i0: 1.5, dt: 0.25}
states: {v: 0.0, i_syn: i0}
equations:
  v: (-v + R * i_syn) / tau_m
  i_syn: (-i_syn + x) / tau_s
method: exact
outputs: [v, i_syn]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_cuba_with_equal_time_constants(backend):
    """tau_syn = tau_mem (a repeated eigenvalue): v(t) = R i0 (t / tau) e^{-t/tau} with no input."""
    T, tau, R, i0, dt = 40, 4.0, 2.0, 1.5, 0.25
    _, (v, i_syn) = _run(CUBA, torch.zeros(T, 2, dtype=DTYPE), backend)
    t = torch.arange(1, T + 1, dtype=DTYPE) * dt
    torch.testing.assert_close(v[:, 0], R * i0 * t / tau * torch.exp(-t / tau), **TIGHT)
    torch.testing.assert_close(i_syn[:, 0], i0 * torch.exp(-t / tau), **TIGHT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_cuba_with_distinct_time_constants(backend):
    """tau_m != tau_s: the difference of exponentials R i0 tau_s / (tau_s - tau_m) (e^{-t/tau_s} - e^{-t/tau_m})."""
    T, tau_m, tau_s, R, i0 = 30, 4.0, 1.5, 2.0, 1.5
    _, (v, _) = _run(CUBA, torch.zeros(T, 2, dtype=DTYPE), backend, params={"tau_s": tau_s})
    t = torch.arange(1, T + 1, dtype=DTYPE) * 0.25
    expected = R * i0 * tau_s / (tau_s - tau_m) * (torch.exp(-t / tau_s) - torch.exp(-t / tau_m))
    torch.testing.assert_close(v[:, 0], expected, **TIGHT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_pure_integrator_and_uncoupled_constant_state(backend):
    """Singular A: dv/dt = I / tau gives v + dt I / tau exactly; a state without equation stays."""
    text = """
neuron: integ
inputs: [I]
parameters: {tau: 2.0, dt: 0.5}
states: {v: 0.0, w: 0.3}
equations:
  v: I / tau + 0 * w
method: exact
outputs: [v, w]
"""
    x = _inputs(7)
    _, (v, w) = _run(text, x, backend)
    torch.testing.assert_close(v, torch.cumsum(x * 0.25, 0), **TIGHT)
    torch.testing.assert_close(w, torch.full_like(w, 0.3), **TIGHT)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_matches_many_small_euler_steps(backend):
    """The exact propagator of a coupled system equals the limit of Euler with dt / 2000."""
    T, sub = 6, 2000
    x = _inputs(T, shape=(2,))
    _, (v, _) = _run(CUBA, x, backend, params={"tau_s": 1.5, "dt": 0.5})
    fine = CUBA.replace("method: exact", "method: euler")
    _, (v_fine, _) = _run(fine, x.repeat_interleave(sub, 0), "torch", params={"tau_s": 1.5, "dt": 0.5 / sub})
    torch.testing.assert_close(v, v_fine[sub - 1::sub], rtol=0, atol=2e-4)
    assert (v - v_fine[sub - 1::sub]).abs().max() > 1e-7  # Euler's error is there, and small


# ---------------------------------------------------------------------------------------------
# gradients through exact propagators with learnable time constants
# ---------------------------------------------------------------------------------------------

LEARNABLE_LIF = """
neuron: plif_ct
inputs: [I]
parameters:
  tau: {value: 3.0, learnable: true}
  v_th: 1.0
  dt: 0.5
states: {v: 0.0}
equations:
  v: (-v + I) / tau
method: exact
threshold: v >= v_th
reset: {v: 0.0}
surrogate: atan
outputs: [s, v]
"""

LEARNABLE_LEAKY = LEARNABLE_LIF.replace("threshold: v >= v_th\nreset: {v: 0.0}\n", "").replace("[s, v]", "[v]")
LEARNABLE_CUBA = CUBA.replace("tau_m: 4.0", "tau_m: {value: 4.0, learnable: true}").replace("tau_s: 4.0", "tau_s: 2.5")


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("text", [LEARNABLE_LEAKY, LEARNABLE_CUBA],
                         ids=["lif", "cuba"])
def test_gradcheck_exact_propagator_with_learnable_tau(text, backend):
    """The propagator's gradient (no threshold: a surrogate is not the derivative of a step)."""
    m = flexsn_dsl.loads(text, backend=backend).to(DTYPE)
    name = "tau" if "plif_ct" in text else "tau_m"
    assert m.spec.continuous.threshold is None
    x = _inputs(6, shape=(2,), hi=3.0).requires_grad_()
    tau = getattr(m, name).detach().clone().requires_grad_()

    def f(x, tau):
        m.reset()
        out = torch.func.functional_call(m, {name: tau}, (x,))
        return out[1] if isinstance(out, tuple) else out

    assert torch.autograd.gradcheck(f, (x, tau), eps=1e-6, atol=1e-7)


def test_learnable_tau_gradient_is_the_derivative_of_the_closed_form():
    """d v_T / d tau of the leaky neuron (no spikes) against the closed form differentiated by hand."""
    m = flexsn_dsl.loads(LEARNABLE_LEAKY, backend="torch").to(DTYPE)
    x = torch.full((5, 1), 2.0, dtype=DTYPE)
    m(x)[-1].sum().backward()
    t = 5 * 0.5  # v(t) = I (1 - e^{-t/tau}); dv/dtau = -I e^{-t/tau} t / tau^2
    assert abs(m.tau.grad.item() - (-2.0 * math.exp(-t / 3.0) * t / 9.0)) < 1e-12


@pytest.mark.parametrize("backend", BACKENDS)
def test_learnable_equal_time_constants_in_a_coupled_system(backend):
    """tau_m learnable and equal to tau_s (the confluent case): the closed form R i0 (t/tau) e^{-t/tau},
    and d v / d tau_m there against central differences of the closed form for tau_m != tau_s."""
    T, tau, R, i0, dt = 12, 4.0, 2.0, 1.5, 0.25
    m = flexsn_dsl.loads(CUBA.replace("tau_m: 4.0", "tau_m: {value: 4.0, learnable: true}"), backend=backend).to(DTYPE)
    v, _ = m(torch.zeros(T, 1, dtype=DTYPE))
    t = torch.arange(1, T + 1, dtype=DTYPE) * dt
    torch.testing.assert_close(v[:, 0], R * i0 * t / tau * torch.exp(-t / tau), **TIGHT)
    v[-1, 0].backward()

    def closed(tau_m: float) -> float:
        return R * i0 * tau / (tau - tau_m) * (math.exp(-T * dt / tau) - math.exp(-T * dt / tau_m))
    h = 1e-4
    assert abs(m.tau_m.grad.item() - (closed(tau + h) - closed(tau - h)) / (2 * h)) < 1e-7


@pytest.mark.parametrize("backend", BACKENDS)
def test_learnable_rate_in_a_rotating_system(backend):
    """Two states coupled both ways with a learnable frequency: x1 = cos(omega t), x2 = sin(omega t), and
    d x1(t) / d omega = -t sin(omega t), d x2(t) / d omega = t cos(omega t) (tests/test_coupled_exact.py
    covers every regime of the eigenvalues)."""
    text = """
neuron: resonator
parameters: {omega: {value: 0.5, learnable: true}, dt: 0.1}
states: {x1: 1.0, x2: 0.0}
equations:
  x1: -omega * x2
  x2: omega * x1
method: exact
"""
    m = flexsn_dsl.loads(text, backend=backend).to(DTYPE)
    assert [name for name, _ in m.spec.outputs] == ["x1", "x2"]  # no threshold: every state is an output
    x1, x2 = m(torch.zeros(30, 1, dtype=DTYPE))
    t = torch.arange(1, 31, dtype=DTYPE) * 0.1
    torch.testing.assert_close(x1[:, 0], torch.cos(0.5 * t), **TIGHT)
    torch.testing.assert_close(x2[:, 0], torch.sin(0.5 * t), **TIGHT)
    (x1[-1, 0] + 2 * x2[-1, 0]).backward()
    assert abs(m.omega.grad.item() - 3.0 * (-math.sin(1.5) + 2 * math.cos(1.5))) < 1e-12


# ---------------------------------------------------------------------------------------------
# the explicit methods against integrators written here
# ---------------------------------------------------------------------------------------------

ADEX_LIKE = """
neuron: adex_like
inputs: [x]
parameters: {tau_m: 2.0, tau_w: 5.0, a: 0.3, delta_T: 0.25, v_T: 0.6, v_th: 1.2, b: 0.2, dt: 0.2}
states: {v: 0.0, w: 0.1}
equations:
  v: (-v + delta_T * exp((v - v_T) / delta_T) - w + x) / tau_m
  w: (a * v - w) / tau_w
method: METHOD
threshold: v >= v_th
reset:
  v: 0.0
  w: w + b
outputs: [s, v, w]
"""
ADEX_PARAMETERS = dict(tau_m=2.0, tau_w=5.0, a=0.3, delta_T=0.25, v_T=0.6, v_th=1.2, b=0.2, dt=0.2)
P = ADEX_PARAMETERS


def _f(v, w, x):
    p = P
    dv = (-v + p["delta_T"] * torch.exp((v - p["v_T"]) / p["delta_T"]) - w + x) / p["tau_m"]
    dw = (p["a"] * v - w) / p["tau_w"]
    return dv, dw


def _ref_step(method, v, w, x):
    h = P["dt"]
    if method == "euler":
        dv, dw = _f(v, w, x)
        return v + h * dv, w + h * dw
    if method == "rk2":
        kv, kw = (h * d for d in _f(v, w, x))
        dv, dw = _f(v + kv / 2, w + kw / 2, x)
        return v + h * dv, w + h * dw
    if method == "rk4":
        k1 = [h * d for d in _f(v, w, x)]
        k2 = [h * d for d in _f(v + k1[0] / 2, w + k1[1] / 2, x)]
        k3 = [h * d for d in _f(v + k2[0] / 2, w + k2[1] / 2, x)]
        k4 = [h * d for d in _f(v + k3[0], w + k3[1], x)]
        return tuple(s + (a + 2 * b + 2 * c + d) / 6 for s, a, b, c, d in zip((v, w), k1, k2, k3, k4))
    # exponential Euler: v is not linear in itself (euler), w is: A = -1/tau_w, B = a v / tau_w
    dv, _ = _f(v, w, x)
    A, B = -1 / P["tau_w"], P["a"] * v / P["tau_w"]
    return v + h * dv, -B / A + (w + B / A) * math.exp(A * h)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["euler", "rk2", "rk4", "exponential_euler"])
def test_explicit_methods_match_independent_integrators(method, backend):
    T = 30
    x = _inputs(T, shape=(4,), lo=0.5, hi=2.5, seed=3)
    _, (s, v, w) = _run(ADEX_LIKE.replace("METHOD", method), x, backend)
    vr, wr = torch.zeros_like(x[0]), torch.full_like(x[0], 0.1)
    spikes, vs, ws = [], [], []
    for t in range(T):
        vi, wi = _ref_step(method, vr, wr, x[t])
        sp = (vi >= P["v_th"]).to(DTYPE)
        vr, wr = (1 - sp) * vi, sp * (wi + P["b"]) + (1 - sp) * wi  # reset on the integrated values
        spikes.append(sp), vs.append(vr), ws.append(wr)
    spikes = torch.stack(spikes)
    assert 0 < spikes.sum() < spikes.numel()
    torch.testing.assert_close(s, spikes, rtol=0, atol=0)
    torch.testing.assert_close(v, torch.stack(vs), **TIGHT)
    torch.testing.assert_close(w, torch.stack(ws), **TIGHT)


@pytest.mark.parametrize("method", ["euler", "rk2", "rk4", "exponential_euler"])
def test_methods_agree_across_backends_forward_and_backward(method):
    text = ADEX_LIKE.replace("METHOD", method).replace("b: 0.2", "b: {value: 0.2, learnable: true}")
    x0 = _inputs(10, shape=(3,), lo=0.5, hi=2.5, seed=4)
    results = []
    for backend in BACKENDS:
        x = x0.clone().requires_grad_()
        m, (s, v, w) = _run(text, x, backend)
        (s.sum() + (v * v).sum() + w.sum() + m.states["w"].sum()).backward()
        results.append((s, v, w, x.grad, m.b.grad))
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-11)


def test_exponential_euler_is_exact_for_linear_decoupled_states():
    """For dv/dt = (v_rest - v + I) / tau, exponential Euler is the exact solution."""
    x = _inputs(9)
    _, (v_exact,) = _run(LEAKY, x, "torch")
    _, (v_ee,) = _run(LEAKY.replace("method: exact", "method: exponential_euler"), x, "torch")
    torch.testing.assert_close(v_ee, v_exact, **TIGHT)


# ---------------------------------------------------------------------------------------------
# threshold, reset and refractory
# ---------------------------------------------------------------------------------------------

REFRACTORY = """
neuron: lif_ref
inputs: [I]
parameters: {tau: 2.0, v_th: 1.0, v_reset: 0.0, t_ref: 1.5, dt: 0.5, R: 1.0}
states: {v: 0.0, u: 0.0}
equations:
  v: (-v + R * I) / tau
  u: (I - u) / tau
method: exact
threshold: v >= v_th
reset: {v: v_reset}
refractory: {period: t_ref}
outputs: [s, v, u]
"""


def _refractory_reference(x, n, decay=math.exp(-0.25)):
    """Brian2's semantics written out: not_refractory = (steps since the last spike) >= n; v held
    while refractory; u integrates always."""
    T = x.shape[0]
    v, u = torch.zeros_like(x[0]), torch.zeros_like(x[0])
    last = torch.full_like(x[0], -1e9)
    out = []
    for t in range(T):
        active = (t - last) >= n
        v_int = torch.where(active, x[t] + (v - x[t]) * decay, v)
        u = x[t] + (u - x[t]) * decay
        s = ((v_int >= 1.0) & active).to(x.dtype)
        v = (1 - s) * v_int
        last = torch.where(s > 0, torch.full_like(last, t), last)
        out.append((s, v, u))
    return [torch.stack(z) for z in zip(*out)]


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("t_ref", [0.5, 1.5, 2.0])
def test_refractory_semantics(t_ref, backend):
    x = _inputs(24, shape=(5,), lo=1.5, hi=6.0, seed=7)
    m, (s, v, u) = _run(REFRACTORY, x, backend, params={"t_ref": t_ref})
    rs, rv, ru = _refractory_reference(x, round(t_ref / 0.5))
    torch.testing.assert_close(s, rs, rtol=0, atol=0)
    torch.testing.assert_close(v, rv, **TIGHT)
    torch.testing.assert_close(u, ru, **TIGHT)
    if t_ref > 0.5:  # the spike trains are shaped by the period: gaps of at least n steps
        gaps = [torch.diff(torch.nonzero(s[:, j]).flatten()) for j in range(5)]
        assert min(int(g.min()) for g in gaps if g.numel()) >= round(t_ref / 0.5)


@pytest.mark.parametrize("backend", BACKENDS)
def test_refractory_counter_is_a_state_carried_across_calls_and_reset(backend):
    x = _inputs(16, shape=(5,), lo=1.5, hi=6.0, seed=8)
    m = flexsn_dsl.loads(REFRACTORY, backend=backend).to(DTYPE)
    assert list(m.states) == [] and "refractory" in m.spec.states
    first, _, _ = m(x[:7])
    counter = m.states["refractory"].clone()
    second, _, _ = m(x[7:])
    rs, _, _ = _refractory_reference(x, 3)
    torch.testing.assert_close(torch.cat([first, second]), rs, rtol=0, atol=0)
    assert counter.max() > 0 and set(counter.unique().tolist()) <= {0.0, 1.0, 2.0}
    m.reset()
    assert m.states == {}
    again, _, _ = m(x[:7])
    torch.testing.assert_close(again, first, rtol=0, atol=0)


def test_refractory_counter_gets_no_gradient():
    x = _inputs(10, shape=(4,), lo=1.5, hi=6.0, seed=9).requires_grad_()
    m = flexsn_dsl.loads(REFRACTORY, backend="torch").to(DTYPE)
    m(x)
    assert not m.states["refractory"].requires_grad


@pytest.mark.parametrize("backend", BACKENDS)
def test_detach_reset_cuts_the_gradient_through_the_reset(backend):
    """With detach_reset, v_t = (1 - s_t) (a v_{t-1} + (1 - a) x_t) with s_t a constant: the
    gradient of sum(v) is a linear recursion, written out here."""
    T, a = 8, math.exp(-0.5 / 3.0)
    grads = []
    for detach in (False, True):
        text = LEARNABLE_LIF + ("detach_reset: true\n" if detach else "")
        x = _inputs(T, shape=(3,), hi=4.0, seed=2).requires_grad_()
        m, (s, v) = _run(text, x, backend)
        v.sum().backward()
        grads.append(x.grad)
    assert 0 < s.sum() < s.numel()
    s = s.detach()
    expected, g_next = torch.zeros_like(x), None
    for t in reversed(range(T)):
        g = 1 + (g_next * (1 - s[t + 1]) * a if g_next is not None else 0)
        expected[t] = g * (1 - s[t]) * (1 - a)
        g_next = g
    torch.testing.assert_close(grads[1], expected, **TIGHT)
    assert not torch.allclose(grads[0], grads[1])


# ---------------------------------------------------------------------------------------------
# bad input, warnings, the CLI
# ---------------------------------------------------------------------------------------------

HEAD = "neuron: n\ninputs: [I]\nparameters: {tau: 10.0, dt: 0.5, v_th: 1.0}\nstates: {v: 0.0, w: 0.0}\n"
ERRORS = [
    (HEAD + "equations: {v: -v / tau}\nstep: {s: spike(v)}\n", (6, 1), "either `step`"),
    (HEAD.replace(", dt: 0.5", "") + "equations: {v: -v / tau}\n", (5, 1), "dt"),
    (HEAD + "equations: {tau: -v / tau}\n", (5, 13), "time derivative of the parameter 'tau'"),
    (HEAD + "equations:\n  v: (-v + exp(v - v_th) + I) / tau\nmethod: exact\n", (6, 6), "exp(v - v_th)"),
    (HEAD + "equations: {v: -v / tau}\nmethod: rk45\n", (6, 9), "unknown method 'rk45'"),
    (HEAD + "equations: {v: -v / tau}\nthreshold: v >= v_th\nreset: {tau: 0}\n", (7, 9), "only states"),
    (HEAD + "equations: {v: -v / tau}\nrefractory: {period: 1.0}\n", (6, 1), "`refractory` without `threshold`"),
    (HEAD + "equations: {v: -v / tau}\nreset: {v: 0.0}\n", (6, 1), "`reset` without `threshold`"),
    (HEAD + "step: {s: spike(v)}\nthreshold: v > 1\n", (6, 1), "belongs to continuous-time"),
    (HEAD + "equations: {v: -v / tau}\nthreshold: v >= v_th\nrefractory: {period: 1.0, hold: [q]}\n", (7, 34),
     "not a state"),
    (HEAD.replace("tau: 10.0", "tau: 10.0, s: 1.0") + "equations: {v: -v / tau}\nthreshold: v >= v_th\n", (3, 25),
     "spike output"),
    (HEAD + "equations: {v: -v / tau + spike(v)}\n", (5, 16), "spike()"),
    (HEAD.replace("dt: 0.5", "dt: {value: 0.5, learnable: true}") + "equations: {v: -v / tau}\n", (3, 25), "dt"),
]


@pytest.mark.parametrize("text, where, fragment", ERRORS, ids=range(len(ERRORS)))
def test_errors_name_the_place_and_what_to_change(text, where, fragment):
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="bad.yaml", backend="torch")
    exc = info.value
    assert fragment in exc.message, exc
    assert (exc.file, exc.line, exc.col) == ("bad.yaml", *where), exc
    assert exc.hint


def test_warnings_for_rounded_period_and_default_method(tmp_path):
    text = HEAD + ("equations:\n  v: (v * v - v + I) / tau\nthreshold: v >= v_th\nreset: {v: 0.0}\n"
                   "refractory: {period: 1.2}\n")
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        m = flexsn_dsl.loads(text, filename="w.yaml", backend="torch")
    found = [w.message for w in caught if isinstance(w.message, SpecWarning)]
    assert len(found) == 2
    assert m.spec.continuous.method == "euler"
    method, period = sorted(found, key=lambda w: w.pos.line)
    assert (method.pos.line, "euler" in method.message, "rk4" in method.hint) == (5, True, True)
    assert period.pos.line == 9 and "rounds to 2 steps" in period.message
    with warnings.catch_warnings(record=True) as caught:  # a params= value that makes the period fractional
        warnings.simplefilter("always")
        flexsn_dsl.loads(text.replace("1.2", "1.0"), filename="w.yaml", backend="torch", params={"dt": 0.3})
    (override,) = [w.message for w in caught if isinstance(w.message, SpecWarning) and "refractory" in str(w.message)]
    assert "3.33333 steps of dt = 0.3: it rounds to 3 steps" in override.message and override.pos.line == 9
    path = tmp_path / "w.yaml"
    path.write_text(text)
    run = subprocess.run([sys.executable, "-m", "flexsn_dsl", "check", str(path)], capture_output=True, text=True)
    assert run.returncode == 0
    assert f"{path}:5:1: warning: no `method`" in run.stderr and "rounds to 2 steps" in run.stderr
    assert "Traceback" not in run.stderr


def test_show_prints_the_derived_step(tmp_path):
    run = subprocess.run([sys.executable, "-m", "flexsn_dsl", "show", str(ROOT / "neurons" / "lif_refractory.yaml"),
                          "--kernel", "model"], capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "equations (method exact)" in run.stdout and "dv/dt = " in run.stdout
    derived = run.stdout[run.stdout.index("derived step"):]
    a = math.exp(-0.5)  # the folded propagator, written in the language's spelling
    assert f"v__int = where(refractory > 0.5, v, {1 - a:.15f}*I + {a:.15f}*v)" in derived
    assert "s = where(refractory > 0.5, 0, spike(v__int - 1.0))" in derived
    assert "refractory__next = where(refractory > 0.5, refractory - 1, detach(s))" in derived


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("v0", [-40.0, -55.0])
def test_hodgkin_huxley_at_the_removable_singularities(v0, backend):
    """alpha_m(-40 mV) and alpha_n(-55 mV) are 0/0 as written: the spec's guard gives the
    continuous value (the mean of the values just beside it) and finite gradients."""
    text = (ROOT / "neurons" / "hh.yaml").read_text()

    def run(v_start, backend=backend):
        m = flexsn_dsl.loads(text.replace("V: -65.0", f"V: {v_start!r}"), backend=backend).to(DTYPE)
        x = torch.full((3, 2), 5.0, dtype=DTYPE).requires_grad_()
        s, V = m(x)
        (V.sum() + sum(state.sum() for state in m.states.values())).backward()
        return V.detach(), m.states, x.grad

    V, states, grad = run(v0)
    assert torch.isfinite(V).all() and torch.isfinite(grad).all()
    assert all(torch.isfinite(state).all() for state in states.values())
    below, _, _ = run(v0 - 1e-4, "torch")
    above, _, _ = run(v0 + 1e-4, "torch")
    torch.testing.assert_close(V, (below + above) / 2, rtol=0, atol=1e-8)


@pytest.mark.parametrize("backend", BACKENDS)
def test_exact_with_an_input_inside_the_rate(backend):
    """A conductance input g makes the rate -(g + 1/tau) an input: the propagator stays symbolic
    (e^{a dt}, and (e^{a dt} - 1) / a guarded where a may vanish), exact against the closed form."""
    text = """
neuron: coba
inputs: [g]
parameters: {tau: 4.0, E: 2.0, leak: {value: 0.0, learnable: true}, dt: 0.5}
states: {v: 0.5}
equations:
  v: g * (E - v) - leak * v
method: exact
outputs: [v]
"""
    g0 = torch.cat([torch.zeros(2, 3, dtype=DTYPE), _inputs(6, shape=(3,), hi=1.5)])
    g = g0.clone().requires_grad_()
    m, (v,) = _run(text, g, backend)
    v.sum().backward()
    state, expected = torch.full_like(g0[0], 0.5), []
    for t in range(g0.shape[0]):  # leak = 0: v relaxes to E at rate g (and stays where g = 0)
        state = 2.0 + (state - 2.0) * torch.exp(-g0[t] * 0.5)
        expected.append(state)
    torch.testing.assert_close(v.detach(), torch.stack(expected), **TIGHT)
    assert torch.isfinite(g.grad).all() and torch.isfinite(m.leak.grad)
