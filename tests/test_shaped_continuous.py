"""Shaped parameters inside continuous-time `equations` (language v2, sections 1 and 2).

A learnable or fixed parameter with a shape stays a symbol in the derived step, so an exact
propagator e^{-dt/tau} has one value per element. Every method, per channel ([C, 1, 1] on
[T, B, C, H, W]) and per neuron ([N] on [T, B, N]), on both backends (Triton in its interpreter
on the CPU) in float64 against hand-written torch loops of the closed form or the integrator's
formula; gradients of the shaped time constants against autograd through those loops and by
finite differences (gradcheck); a shaped dt or refractory period is refused where it is written.
"""
from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl import SpecError  # noqa: E402

BACKENDS = ["torch", "triton"]
F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)
GRAD = dict(rtol=1e-9, atol=1e-11)
DT, R, V_REST = 0.7, 1.5, -0.2

# tau: learnable, shaped (inside A: the propagator); v_th: fixed, shaped (in the threshold)
LIF = """
neuron: lif_shaped_ct
inputs: [I]
parameters:
  tau: {{value: 2.0, learnable: true, shape: {shape}}}
  v_th: {{value: 1.0, shape: {shape}}}
  R: 1.5
  v_rest: -0.2
  dt: 0.7
states: {{v: 0.0}}
equations:
  v: (v_rest - v + R * I) / tau
method: {method}
threshold: v >= v_th
reset: {{v: 0.0}}
surrogate: {{name: sigmoid, alpha: 4.0}}
outputs: [s, v]
"""

# (spec shape, sizes, input shape [T, ...], parameter shape); each input has more neurons per
# step than one interpreter block (1024), and not a multiple of it
CASES = {
    "channel": ("[C, 1, 1]", {"C": 5}, (3, 3, 5, 9, 11), (5, 1, 1)),
    "neuron": ("[N]", {"N": 517}, (4, 3, 517), (517,)),
}


def _spike(u: torch.Tensor) -> torch.Tensor:
    """Heaviside forward; the sigmoid surrogate (alpha = 4), written out in zoo_reference."""
    return zr.spike(u, "sigmoid", alpha=4.0)


def _integrate(method: str, v, I, tau):
    """One step of tau v' = v_rest - v + R I with I held: the closed form, or the method's formula."""
    f = lambda u: (V_REST - u + R * I) / tau  # noqa: E731
    if method in ("exact", "exponential_euler"):  # linear in v: exponential Euler is exact here
        v_inf = V_REST + R * I
        return v_inf + (v - v_inf) * torch.exp(-DT / tau)
    if method == "euler":
        return v + DT * f(v)
    if method == "rk2":
        return v + DT * f(v + DT / 2 * f(v))
    k1 = DT * f(v)
    k2 = DT * f(v + k1 / 2)
    k3 = DT * f(v + k2 / 2)
    k4 = DT * f(v + k3)
    return v + (k1 + 2 * k2 + 2 * k3 + k4) / 6


def reference(method, I, tau, v_th):
    v = torch.zeros_like(I[0])
    spikes, vs = [], []
    for t in range(I.shape[0]):
        h = _integrate(method, v, I[t], tau)
        s = _spike(h - v_th)
        v = h * (1 - s)
        spikes.append(s)
        vs.append(v)
    return torch.stack(spikes), torch.stack(vs)


def _draw(shape, seed, lo, hi):
    gen = torch.Generator().manual_seed(seed)  # CPU draws, moved: the same values on a GPU machine
    return (lo + (hi - lo) * torch.rand(shape, generator=gen, dtype=F64, device="cpu")).to(torch.get_default_device())


def _check_against_reference(m, method, I, tau, v_th):
    Im, Ir = I.clone().requires_grad_(), I.clone().requires_grad_()
    tau_r = tau.clone().requires_grad_()
    s_m, v_m = m(Im)
    s_r, v_r = reference(method, Ir, tau_r, v_th)
    torch.testing.assert_close(s_m, s_r, rtol=0, atol=0)
    assert 0 < int(s_m.sum()) < s_m.numel()
    torch.testing.assert_close(v_m, v_r, **TIGHT)
    w_s, w_v = _draw(s_r.shape, 7, -1, 1), _draw(v_r.shape, 8, -1, 1)
    ((w_s * s_m).sum() + (w_v * v_m).sum()).backward()
    g_I, g_tau = torch.autograd.grad((w_s * s_r).sum() + (w_v * v_r).sum(), [Ir, tau_r])
    torch.testing.assert_close(Im.grad, g_I, **TIGHT)
    assert m.tau.grad.shape == tau.shape and bool((g_tau != 0).all())
    torch.testing.assert_close(m.tau.grad, g_tau, **GRAD)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["exact", "euler", "rk2", "rk4", "exponential_euler"])
def test_every_method_per_neuron(method, backend):
    shape, sizes, inp, pshape = CASES["neuron"]
    tau, v_th, I = _draw(pshape, 1, 1.5, 4.0), _draw(pshape, 2, 0.4, 0.9), _draw(inp, 3, 0.0, 2.5)
    m = flexsn_dsl.loads(LIF.format(shape=shape, method=method), sizes=sizes, backend=backend,
                         params={"tau": tau, "v_th": v_th}).double()
    assert isinstance(m.tau, torch.nn.Parameter) and "v_th" in dict(m.named_buffers())
    _check_against_reference(m, method, I, tau, v_th)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("method", ["exact", "rk4"])
def test_per_channel_on_images(method, backend):
    shape, sizes, inp, pshape = CASES["channel"]
    tau, v_th, I = _draw(pshape, 4, 1.5, 4.0), _draw(pshape, 5, 0.4, 0.9), _draw(inp, 6, 0.0, 2.5)
    m = flexsn_dsl.loads(LIF.format(shape=shape, method=method), sizes=sizes, backend=backend,
                         params={"tau": tau, "v_th": v_th}).double()
    _check_against_reference(m, method, I, tau, v_th)


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_fixed_shaped_time_constant_in_the_exact_propagator(backend):
    """Not learnable: still one propagator per element (a buffer read by index, not a folded number)."""
    text = LIF.format(shape="[N]", method="exact").replace("learnable: true", "learnable: false")
    _, sizes, inp, pshape = CASES["neuron"]
    tau, v_th, I = _draw(pshape, 9, 1.5, 4.0), _draw(pshape, 10, 0.4, 0.9), _draw(inp, 11, 0.0, 2.5)
    m = flexsn_dsl.loads(text, sizes=sizes, backend=backend, params={"tau": tau, "v_th": v_th}).double()
    assert "tau" in dict(m.named_buffers()) and not list(m.parameters())
    with torch.no_grad():
        s_m, v_m = m(I)
    s_r, v_r = reference("exact", I, tau, v_th)
    torch.testing.assert_close(s_m, s_r, rtol=0, atol=0)
    torch.testing.assert_close(v_m, v_r, **TIGHT)


CUBA = """
neuron: cuba_shaped_ct
parameters:
  tau_mem: 2.0
  tau_syn: {value: 1.0, learnable: true, shape: [N]}
  R: 2.0
  v_th: 1.0
  dt: 1.0
states: {v: 0.0, i: 0.0}
equations:
  v: (R * i - v) / tau_mem
  i: (x - i) / tau_syn
method: exact
threshold: v >= v_th
reset: {v: 0.0}
surrogate: {name: sigmoid, alpha: 4.0}
outputs: [s, v, i]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_coupled_exact_propagator_with_a_per_neuron_synaptic_time_constant(backend):
    """Two states coupled one way: the symbolic matrix exponential, evaluated per neuron."""
    T, B, N = 5, 3, 37
    ts, x = _draw((N,), 12, 0.5, 1.5), _draw((T, B, N), 13, 0.0, 3.0)
    ts[ts.sub(2.0).abs() < 1e-3] = 1.0  # away from tau_mem (the formula's removable singularity)
    m = flexsn_dsl.loads(CUBA, backend=backend, params={"tau_syn": ts}).double()
    xm, xr, ts_r = x.clone().requires_grad_(), x.clone().requires_grad_(), ts.clone().requires_grad_()
    s_m, v_m, i_m = m(xm)
    tm, em = 2.0, math.exp(-1.0 / 2.0)
    es = torch.exp(-1.0 / ts_r)
    v, i = torch.zeros(B, N, dtype=F64), torch.zeros(B, N, dtype=F64)
    out = []
    for t in range(T):  # i relaxes to x; v gets the difference of exponentials of the transient
        h = v * em + 2.0 * xr[t] * (1 - em) + 2.0 * (i - xr[t]) * ts_r / (ts_r - tm) * (es - em)
        i = xr[t] + (i - xr[t]) * es
        s = _spike(h - 1.0)
        v = h * (1 - s)
        out.append((s, v, i))
    s_r, v_r, i_r = (torch.stack(z) for z in zip(*out))
    torch.testing.assert_close(s_m, s_r, rtol=0, atol=0)
    assert 0 < int(s_m.sum()) < s_m.numel()
    torch.testing.assert_close(v_m, v_r, **TIGHT)
    torch.testing.assert_close(i_m, i_r, **TIGHT)
    w = [_draw(z.shape, 14 + k, -1, 1) for k, z in enumerate((s_r, v_r, i_r))]
    sum((a * b).sum() for a, b in zip(w, (s_m, v_m, i_m))).backward()
    g_x, g_ts = torch.autograd.grad(sum((a * b).sum() for a, b in zip(w, (s_r, v_r, i_r))), [xr, ts_r])
    torch.testing.assert_close(xm.grad, g_x, **TIGHT)
    assert bool((g_ts != 0).all())
    torch.testing.assert_close(m.tau_syn.grad, g_ts, **GRAD)


LEAKY = """
neuron: leaky_shaped_ct
inputs: [I]
parameters:
  tau: {{value: 2.0, learnable: true, shape: {shape}}}
  R: 1.5
  dt: 0.7
states: {{v: 0.3}}
equations:
  v: (R * I - v) / tau
method: exact
outputs: [v]
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", [("[C, 1, 1]", (2, 2, 3, 1, 2), (3, 1, 1)), ("[N]", (3, 2, 5), (5,))],
                         ids=["channel", "neuron"])
def test_gradcheck_of_a_learnable_shaped_time_constant(case, backend):
    """Finite differences of the whole sequence (no threshold: the function is smooth)."""
    shape, inp, pshape = case
    m = flexsn_dsl.loads(LEAKY.format(shape=shape), backend=backend, params={"tau": torch.ones(pshape)}).double()
    tau = _draw(pshape, 20, 1.2, 3.0).requires_grad_()
    I = _draw(inp, 21, -1.0, 2.0).requires_grad_()

    def run(tau, I):
        m.reset()
        return torch.func.functional_call(m, {"tau": tau}, (I,))
    assert torch.autograd.gradcheck(run, (tau, I), eps=1e-6, atol=1e-8, rtol=1e-6)
    # and the closed form: v_k = v_inf + (v_{k-1} - v_inf) e^{-dt/tau}
    with torch.no_grad():
        v, expected = torch.full(inp[1:], 0.3, dtype=F64), []
        for t in range(inp[0]):
            v = R * I[t] + (v - R * I[t]) * torch.exp(-DT / tau)
            expected.append(v)
        torch.testing.assert_close(run(tau, I), torch.stack(expected), **TIGHT)


REFRACTORY = """
neuron: shaped_refractory
inputs: [I]
parameters:
  tau: 2.0
  t_ref: {value: 2.0, shape: [N]}
  dt: 1.0
states: {v: 0.0}
equations:
  v: (I - v) / tau
threshold: v >= 1.0
reset: {v: 0.0}
refractory: {period: t_ref}
"""


def test_a_shaped_dt_or_refractory_period_is_refused_where_it_is_written():
    lines = REFRACTORY.splitlines()
    with pytest.raises(SpecError, match="refractory period may not use the shaped parameter 't_ref'") as exc:
        flexsn_dsl.loads(REFRACTORY, sizes={"N": 3})
    line = next(k for k, text in enumerate(lines) if text.startswith("refractory"))
    assert (exc.value.line, exc.value.col) == (line + 1, lines[line].index("t_ref}") + 1)
    assert "whole number of steps" in exc.value.message and "scalar" in exc.value.hint
    text = REFRACTORY.replace("  dt: 1.0", "  dt: {value: 1.0, shape: [N]}").replace("{period: t_ref}", "{period: 2.0}")
    with pytest.raises(SpecError, match="`dt` cannot have a shape") as exc:
        flexsn_dsl.loads(text, sizes={"N": 3})
    assert (exc.value.line, exc.value.col) == (lines.index("  dt: 1.0") + 1, 3)
    assert "the same for every neuron" in exc.value.message
