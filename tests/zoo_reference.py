"""Independent, hand-written PyTorch references for the specs in ``neurons/``.

Every neuron of the zoo has here a plain-torch single-step function written from
the model's equations (not generated from the YAML) and a spike function whose
surrogate gradient is written out by hand (SpikingJelly's formula for the named
surrogate; forward is the SpikingJelly Heaviside ``u >= 0``).

This module imports only ``torch``, ``math`` and the standard library, so that it
stays independent of ``flexsn_dsl``.

Public API
----------
``REFERENCES``: ``{name: Reference}``, one per ``neurons/<name>.yaml``.
``run_reference(name, inputs_seq, params=None, ...)``: run a whole sequence.
``make_inputs(name, T, shape, seed, dtype)``: the seeded inputs the tests use.
"""

from __future__ import annotations

import math
import zlib
from dataclasses import dataclass, field
from typing import Callable, Dict, Mapping, Optional, Sequence, Tuple, Union

import torch

Number = Union[float, torch.Tensor]
Params = Mapping[str, Number]
TensorDict = Dict[str, torch.Tensor]

__all__ = [
    "Reference",
    "REFERENCES",
    "SURROGATE_GRADIENTS",
    "spike",
    "run_reference",
    "make_inputs",
    "input_seed",
]


# --------------------------------------------------------------------------
# Surrogate gradients, written by hand (x is the argument of spike).
# Formulas: SpikingJelly surrogate.py (HEAD) and, for fast_sigmoid / triangle,
# the language contract (snnTorch fast_sigmoid; alpha*max(0, 1 - alpha*|x|)).
# --------------------------------------------------------------------------


def _sg_sigmoid(x: torch.Tensor, alpha: float = 4.0) -> torch.Tensor:
    sg = torch.sigmoid(alpha * x)
    return (1.0 - sg) * sg * alpha


def _sg_atan(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    return alpha / 2.0 / (1.0 + (math.pi / 2.0 * alpha * x) ** 2)


def _sg_piecewise_quadratic(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    g = -(alpha ** 2) * x.abs() + alpha
    return torch.where(x.abs() > 1.0 / alpha, torch.zeros_like(x), g)


def _sg_piecewise_exp(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return alpha / 2.0 * torch.exp(-alpha * x.abs())


def _sg_soft_sign(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    return alpha / (2.0 * (1.0 + alpha * x.abs()) ** 2)


def _sg_erf(x: torch.Tensor, alpha: float = 2.0) -> torch.Tensor:
    return torch.exp(-((alpha * x) ** 2)) * (alpha / math.sqrt(math.pi))


def _sg_super_spike(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return alpha / (x.abs() + 1.0) ** 2


def _sg_rect(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return alpha * (x.abs() < 0.5 / alpha).to(x.dtype)


def _sg_triangle(x: torch.Tensor, alpha: float = 1.0) -> torch.Tensor:
    return alpha * torch.clamp(1.0 - alpha * x.abs(), min=0.0)


def _sg_fast_sigmoid(x: torch.Tensor, slope: float = 25.0) -> torch.Tensor:
    return 1.0 / (slope * x.abs() + 1.0) ** 2


def _sg_straight_through(x: torch.Tensor) -> torch.Tensor:
    return torch.ones_like(x)


SURROGATE_GRADIENTS: Dict[str, Callable[..., torch.Tensor]] = {
    "sigmoid": _sg_sigmoid,
    "atan": _sg_atan,
    "piecewise_quadratic": _sg_piecewise_quadratic,
    "piecewise_exp": _sg_piecewise_exp,
    "soft_sign": _sg_soft_sign,
    "erf": _sg_erf,
    "super_spike": _sg_super_spike,
    "rect": _sg_rect,
    "triangle": _sg_triangle,
    "fast_sigmoid": _sg_fast_sigmoid,
    "straight_through": _sg_straight_through,
}


class _SpikeFn(torch.autograd.Function):
    """Forward: Heaviside ``u >= 0`` (SpikingJelly). Backward: ``g(u) * grad``."""

    @staticmethod
    def forward(ctx, u, grad_fn, kwargs):
        ctx.save_for_backward(u)
        ctx.grad_fn = grad_fn
        ctx.kwargs = kwargs
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, grad_out):
        (u,) = ctx.saved_tensors
        return grad_out * ctx.grad_fn(u, **ctx.kwargs), None, None


def spike(u: torch.Tensor, surrogate: str = "sigmoid", **kwargs) -> torch.Tensor:
    """Heaviside spike with the hand-written surrogate gradient ``surrogate``."""
    return _SpikeFn.apply(u, SURROGATE_GRADIENTS[surrogate], dict(kwargs))


# --------------------------------------------------------------------------
# The Reference record
# --------------------------------------------------------------------------

StepFn = Callable[[TensorDict, TensorDict, Params], Tuple[TensorDict, TensorDict]]


@dataclass
class Reference:
    """What the tests need to know about one spec.

    ``step(inputs, states, params) -> (outputs, new_states)`` runs one time step;
    ``state_init[name](params)`` gives the initial value of a state (a number or a
    0-dim tensor, broadcast to the input's per-step shape).
    """

    name: str
    model: str
    inputs: Tuple[str, ...]
    state_init: Dict[str, Callable[[Params], Number]]
    outputs: Tuple[str, ...]
    spike_outputs: Tuple[str, ...]
    params: Dict[str, float]  # every parameter of the spec with its default value
    learnable: Tuple[str, ...]
    surrogate: str
    step: StepFn
    # per-input uniform range for the tests' random inputs; default (0, 1.5)
    input_ranges: Dict[str, Tuple[float, float]] = field(default_factory=dict)
    # parameters with a shape: their shape with the tests' sizes; the sizes; the shape of one
    # step of the tests' inputs (None: the tests' default)
    param_shapes: Dict[str, Tuple[int, ...]] = field(default_factory=dict)
    sizes: Dict[str, int] = field(default_factory=dict)
    step_shape: Optional[Tuple[int, ...]] = None
    # the random numbers a step draws (a stochastic spec): the step reads them as inputs of these
    # names, which the caller supplies (rand__k uniform in [0, 1), randn__k standard normal)
    draws: Tuple[str, ...] = ()

    @property
    def states(self) -> Tuple[str, ...]:
        return tuple(self.state_init)

    @property
    def learnable_defaults(self) -> Dict[str, float]:
        return {k: self.params[k] for k in self.learnable}

    def resolve_params(self, params: Optional[Params] = None) -> Dict[str, Number]:
        unknown = set(params or {}) - set(self.params)
        if unknown:
            raise KeyError(f"{self.name}: unknown parameters {sorted(unknown)}")
        p: Dict[str, Number] = dict(self.params)
        p.update(params or {})
        return p

    def init_states(self, like: torch.Tensor, params: Optional[Params] = None) -> TensorDict:
        """Initial states with the shape, dtype and device of ``like`` (one step)."""
        p = self.resolve_params(params)
        return {k: torch.zeros_like(like) + f(p) for k, f in self.state_init.items()}

    def input_range(self, name: str) -> Tuple[float, float]:
        return self.input_ranges.get(name, (0.0, 1.5))


def _exp(x: Number) -> Number:
    return torch.exp(x) if isinstance(x, torch.Tensor) else math.exp(x)


# --------------------------------------------------------------------------
# The neurons. Each step takes (inputs, states, params) and returns
# (outputs, new_states); states not reassigned are carried over by the caller.
# --------------------------------------------------------------------------


def _hard_reset(h, s, v_reset):
    # v = s * v_reset + (1 - s) * h, with s undetached (SJ detach_reset=False)
    return (1.0 - s) * h + s * v_reset


# --- if: SpikingJelly IFNode, hard reset ----------------------------------
def _step_if(i, st, p):
    h = st["v"] + i["x"]
    s = spike(h - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- lif: SpikingJelly LIFNode (decay_input=True), hard reset --------------
def _step_lif(i, st, p):
    v = st["v"]
    h = v + (i["x"] - (v - p["v_reset"])) / p["tau"]
    s = spike(h - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- lif_soft: SJ LIFNode(decay_input=False, v_reset=None, detach_reset=True)
def _step_lif_soft(i, st, p):
    v = st["v"]
    h = v - v / p["tau"] + i["x"]
    s = spike(h - p["v_th"], "atan", alpha=2.0)
    return {"s": s}, {"v": h - s.detach() * p["v_th"]}


# --- plif: SJ ParametricLIFNode, 1/tau = sigmoid(w), w learnable ---------
def _step_plif(i, st, p):
    v = st["v"]
    inv_tau = torch.sigmoid(torch.as_tensor(p["w"], dtype=v.dtype))
    h = v + (i["x"] - (v - p["v_reset"])) * inv_tau
    s = spike(h - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- plif_channel: plif with one w per channel of [B, C, H, W] ---------------
def _step_plif_channel(i, st, p):
    return _step_plif(i, st, p)  # w is a [C, 1, 1] tensor: it broadcasts over B, H and W


# --- lif_hetero: alpha = exp(-dt / tau), tau per neuron (Perez-Nieves et al.) --
def _step_lif_hetero(i, st, p):
    v = st["v"]
    alpha = torch.exp(-p["dt"] / torch.as_tensor(p["tau"], dtype=v.dtype))
    h = alpha * v + (1.0 - alpha) * i["x"]
    s = spike(h - p["v_th"], "fast_sigmoid", slope=25.0)
    return {"s": s}, {"v": h * (1.0 - s)}


# --- qif: SJ QIFNode defaults ---------------------------------------------
def _step_qif(i, st, p):
    v = st["v"]
    h = v + (i["x"] + p["a0"] * (v - p["v_rest"]) * (v - p["v_c"])) / p["tau"]
    s = spike(h - p["v_th"], "piecewise_quadratic", alpha=1.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- eif: SJ EIFNode defaults ---------------------------------------------
def _step_eif(i, st, p):
    v = st["v"]
    dT = p["delta_T"]
    h = v + (i["x"] + p["v_rest"] - v + dT * torch.exp((v - p["theta_rh"]) / dT)) / p["tau"]
    s = spike(h - p["v_th"], "soft_sign", alpha=2.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- izhikevich: Izhikevich 2003, regular spiking, rescaled ---------------
# V[mV] = 100 v, U = 100 u, I = 100 x, forward Euler with dt = 1 ms:
#   v' = 4 v^2 + 5 v + 1.4 - u + x ; u' = a (b v - u)
#   if v >= v_th (30 mV): v <- c, u <- u + d
# Order as Norse izhikevich_feed_forward_step: u integrates with the OLD v,
# the spike tests the integrated v; reset of v by select (no grad through s).
def _step_izhikevich(i, st, p):
    v, u = st["v"], st["u"]
    dt = p["dt"]
    h = v + dt * (4.0 * v * v + 5.0 * v + 1.4 - u + i["x"])
    u_int = u + dt * p["a"] * (p["b"] * v - u)
    s = spike(h - p["v_th"], "super_spike", alpha=1.0)
    v_new = torch.where(s > 0, torch.zeros_like(h) + p["c"], h)
    return {"s": s}, {"v": v_new, "u": u_int + p["d"] * s}


# --- alif: Bellec et al. 2018 LSNN adaptive threshold ---------------------
# Norse lsnn_step form (b0 = v_th, b relaxes to v_th, b += beta * z, detached
# z in reset and adaptation) with the input driving v directly (no synapse).
def _step_alif(i, st, p):
    v, b = st["v"], st["b"]
    h = v + (i["x"] - v) / p["tau_m"]
    b_dec = b + (p["v_th"] - b) / p["tau_a"]
    s = spike(h - b_dec, "triangle", alpha=1.0)
    z = s.detach()
    v_new = (1.0 - z) * h + z * p["v_reset"]
    b_new = b_dec + p["beta"] * z
    return {"s": s}, {"v": v_new, "b": b_new}


# --- cuba_lif: SJ CUBALIFNode (rect surrogate), threshold raised ----------
def _step_cuba_lif(i, st, p):
    c = st["c"] * p["c_decay"] + i["x"]
    h = st["v"] * p["v_decay"] + c
    s = spike(h - p["v_th"], "rect", alpha=1.0)
    return {"s": s}, {"c": c, "v": _hard_reset(h, s, p["v_reset"])}


# --- adex: Brette & Gerstner 2005, dimensionless, forward Euler -----------
#   tau_m v' = -(v - v_rest) + delta_T exp((v - v_T)/delta_T) - w + x
#   tau_w w' = a (v - v_rest) - w ;  v >= v_th: v <- v_reset, w <- w + b
# w integrates with the OLD v; exponent capped at 10 (never reached here).
def _step_adex(i, st, p):
    v, w = st["v"], st["w"]
    dt, dT = p["dt"], p["delta_T"]
    expo = torch.clamp((v - p["v_T"]) / dT, max=10.0)
    dv = (-(v - p["v_rest"]) + dT * torch.exp(expo) - w + i["x"]) / p["tau_m"]
    h = v + dt * dv
    w_int = w + dt * (p["a"] * (v - p["v_rest"]) - w) / p["tau_w"]
    s = spike(h - p["v_th"], "fast_sigmoid", slope=5.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"]), "w": w_int + p["b"] * s}


# --- resonate_fire: Izhikevich 2001 resonate-and-fire --------------------
# z' = (b + i omega) z + I, integrated exactly over one step (dt = 1):
# z <- exp(b) * exp(i omega) * z + x ; spike when Im z >= v_th; z <- 0 on spike.
def _step_resonate_fire(i, st, p):
    re, im = st["z_re"], st["z_im"]
    b = torch.as_tensor(p["b"], dtype=re.dtype)
    om = torch.as_tensor(p["omega"], dtype=re.dtype)
    r = torch.exp(b)
    c, sn = torch.cos(om), torch.sin(om)
    re_new = r * (c * re - sn * im) + i["x"]
    im_new = r * (sn * re + c * im)
    s = spike(im_new - p["v_th"], "erf", alpha=2.0)
    keep = 1.0 - s
    return {"s": s}, {"z_re": re_new * keep, "z_im": im_new * keep}


# --- modulated_lif: SpikingJelly FlexSN tutorial (complicated_lif_core) ----
def _step_modulated_lif(i, st, p):
    x, m = i["x"], i["m"]
    v, rho = st["v"], st["rho"]
    h = p["beta"] * v + x
    s1 = spike(h - (rho + 1.0), "atan", alpha=2.0)  # adaptive threshold
    s2 = spike(h - 1.0, "atan", alpha=2.0)  # fixed threshold
    rho_new = p["gamma"] * rho + s1
    v_hard = h * (1.0 - s1)
    v_soft = h - s2
    g = torch.sigmoid(m)
    v_new = v_hard * g + v_soft * (1.0 - g)
    return {"s1": s1, "s2": s2}, {"v": v_new, "rho": rho_new}


# --- klif: SpikingJelly KLIFNode (learnable k, scale_reset=False) ---------
def _step_klif(i, st, p):
    v = st["v"]
    h = v + (i["x"] - (v - p["v_reset"])) / p["tau"]
    h = torch.relu(p["k"] * h)
    s = spike(h - p["v_th"], "piecewise_exp", alpha=1.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- leaky: snnTorch Leaky (subtract reset, reset_delay=True) -------------
def _step_leaky(i, st, p):
    mem = st["mem"]
    thr = p["threshold"]
    r = spike(mem - thr, "atan", alpha=2.0).detach()  # delayed, detached reset
    beta = torch.clamp(torch.as_tensor(p["beta"], dtype=mem.dtype), 0.0, 1.0)
    mem_new = beta * mem + i["x"] - r * thr
    spk = spike(mem_new - thr, "atan", alpha=2.0)
    return {"spk": spk, "mem": mem_new}, {"mem": mem_new}


# --- li: Norse LICell (li_feed_forward_step): no spike, no reset -------------
def _step_li(i, st, p):
    i_jump = st["i"] + i["x"]
    v_new = st["v"] + p["dt"] * p["tau_mem_inv"] * ((p["v_leak"] - st["v"]) + i_jump)
    i_new = i_jump - p["dt"] * p["tau_syn_inv"] * i_jump
    return {"v": v_new}, {"v": v_new, "i": i_new}


# --- lif_ct: tau v' = -(v - v_rest) + R I, exact over dt with I held ------
#   v(t + dt) = v_inf + (v(t) - v_inf) e^{-dt/tau}, v_inf = v_rest + R I
def _step_lif_ct(i, st, p):
    v_inf = p["v_rest"] + p["R"] * i["I"]
    h = v_inf + (st["v"] - v_inf) * _exp(-p["dt"] / p["tau"])
    s = spike(h - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"])}


# --- cuba_lif_ct: tau_syn i' = x - i, tau_mem v' = -(v - v_rest) + R i, exact -
# Over one step with x held (tau_mem != tau_syn): i relaxes to x; v gets the
# difference of exponentials of the synaptic transient.
def _step_cuba_lif_ct(i, st, p):
    dt, tm, ts, R, x = p["dt"], p["tau_mem"], p["tau_syn"], p["R"], i["x"]
    em, es = math.exp(-dt / tm), math.exp(-dt / ts)
    v0, i0 = st["v"] - p["v_rest"], st["i"]
    h = p["v_rest"] + v0 * em + R * x * (1 - em) + R * (i0 - x) * ts / (ts - tm) * (es - em)
    s = spike(h - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"]), "i": x + (i0 - x) * es}


# --- lif_refractory: exact LIF; refractory for n = round(t_ref / dt) steps ----
# `refractory` counts the steps left: n - 1 after a spike, then down to 0; while
# it is > 0, v keeps its value and no spike is emitted.
def _step_lif_refractory(i, st, p):
    v, r = st["v"], st["refractory"]
    active = r <= 0
    v_inf = p["v_rest"] + p["R"] * i["I"]
    h = torch.where(active, v_inf + (v - v_inf) * math.exp(-p["dt"] / p["tau"]), v)
    s = spike(h - p["v_th"], "atan", alpha=2.0) * active.to(v.dtype)
    n = round(p["t_ref"] / p["dt"])
    r_new = torch.where(active, (n - 1) * s.detach(), r - 1)
    return {"s": s}, {"v": _hard_reset(h, s, p["v_reset"]), "refractory": r_new}


# --- adex_ct: Brette & Gerstner 2005 as ODEs, classical RK4 ---------------
def _adex_rhs(v, w, x, p):
    expo = torch.clamp((v - p["v_T"]) / p["delta_T"], max=10.0)
    dv = (-(v - p["v_rest"]) + p["delta_T"] * torch.exp(expo) - w + x) / p["tau_m"]
    return dv, (p["a"] * (v - p["v_rest"]) - w) / p["tau_w"]


def _rk4(rhs, y, h):
    k1 = [h * d for d in rhs(*y)]
    k2 = [h * d for d in rhs(*[a + b / 2 for a, b in zip(y, k1)])]
    k3 = [h * d for d in rhs(*[a + b / 2 for a, b in zip(y, k2)])]
    k4 = [h * d for d in rhs(*[a + b for a, b in zip(y, k3)])]
    return [a + (b + 2 * c + 2 * d + e) / 6 for a, b, c, d, e in zip(y, k1, k2, k3, k4)]


def _step_adex_ct(i, st, p):
    v, w = _rk4(lambda v, w: _adex_rhs(v, w, i["x"], p), [st["v"], st["w"]], p["dt"])
    s = spike(v - p["v_th"], "fast_sigmoid", slope=5.0)
    return {"s": s}, {"v": _hard_reset(v, s, p["v_reset"]), "w": w + p["b"] * s}


# --- izhikevich_ct: Izhikevich 2003 in mV/ms, explicit midpoint (rk2) -------
def _step_izhikevich_ct(i, st, p):
    def rhs(v, u):
        return 0.04 * v * v + 5.0 * v + 140.0 - u + i["I"], p["a"] * (p["b"] * v - u)
    h, v, u = p["dt"], st["v"], st["u"]
    kv, ku = (h * d for d in rhs(v, u))
    dv, du = rhs(v + kv / 2, u + ku / 2)
    v, u = v + h * dv, u + h * du
    s = spike(v - p["v_peak"], "super_spike", alpha=0.1)
    return {"s": s, "v": s * p["c"] + (1 - s) * v}, {"v": s * p["c"] + (1 - s) * v, "u": u + p["d"] * s}


# --- hh: Hodgkin-Huxley (Dayan & Abbott's convention), exponential Euler ----
def _vtrap(u: torch.Tensor, scale: float) -> torch.Tensor:
    """u / (1 - exp(-u / scale)), continued at u = 0 (the same guard as the spec)."""
    small = u.abs() < 0.01
    safe = torch.where(small, torch.ones_like(u), u)
    return torch.where(small, scale + u / 2 + u * u / (12 * scale), safe / (1 - torch.exp(-safe / scale)))


def _step_hh(i, st, p):
    V, m, h, n, r = st["V"], st["m"], st["h"], st["n"], st["refractory"]
    dt = p["dt"]
    rates = {
        "m": (0.1 * _vtrap(V + 40, 10.0), 4.0 * torch.exp(-(V + 65) / 18)),
        "h": (0.07 * torch.exp(-(V + 65) / 20), 1 / (1 + torch.exp(-(V + 35) / 10))),
        "n": (0.01 * _vtrap(V + 55, 10.0), 0.125 * torch.exp(-(V + 65) / 80)),
    }
    gates = {}
    for z, (alpha, beta) in rates.items():  # dz/dt = alpha (1 - z) - beta z: A = -(alpha + beta), B = alpha
        inf = alpha / (alpha + beta)
        gates[z] = inf + (st[z] - inf) * torch.exp(-(alpha + beta) * dt)
    g = p["g_Na"] * m ** 3 * h + p["g_K"] * n ** 4 + p["g_L"]
    e = p["g_Na"] * m ** 3 * h * p["E_Na"] + p["g_K"] * n ** 4 * p["E_K"] + p["g_L"] * p["E_L"] + i["I"]
    V_new = e / g + (V - e / g) * torch.exp(-g / p["C"] * dt)
    # Brian2's refractory='V >= V_spike': still refractory only while V (at the step's start) stays above
    r = torch.where(V >= p["V_spike"], r, torch.zeros_like(r))
    active = (r <= 0).to(V.dtype)
    s = spike(V_new - p["V_spike"], "sigmoid", alpha=0.5) * active
    r_new = torch.where(s.detach() > 0, torch.ones_like(r), r)
    return {"s": s, "V": V_new}, {"V": V_new, **gates, "refractory": r_new}


# --- morris_lecar: Morris-Lecar (Rinzel & Ermentrout's Hopf set), classical Runge-Kutta ----
def _step_morris_lecar(i, st, p):
    def rhs(V, w):
        m_inf = 0.5 * (1 + torch.tanh((V - p["V1"]) / p["V2"]))
        w_inf = 0.5 * (1 + torch.tanh((V - p["V3"]) / p["V4"]))
        dV = (i["I"] - p["g_L"] * (V - p["V_L"]) - p["g_Ca"] * m_inf * (V - p["V_Ca"]) - p["g_K"] * w * (V - p["V_K"]))
        return dV / p["C"], p["phi"] * (w_inf - w) * torch.cosh((V - p["V3"]) / (2 * p["V4"]))
    V, w, r, h = st["V"], st["w"], st["refractory"], p["dt"]
    k1 = rhs(V, w)
    k2 = rhs(V + h / 2 * k1[0], w + h / 2 * k1[1])
    k3 = rhs(V + h / 2 * k2[0], w + h / 2 * k2[1])
    k4 = rhs(V + h * k3[0], w + h * k3[1])
    V_new = V + h / 6 * (k1[0] + 2 * k2[0] + 2 * k3[0] + k4[0])
    w_new = w + h / 6 * (k1[1] + 2 * k2[1] + 2 * k3[1] + k4[1])
    r = torch.where(V >= p["V_spike"], r, torch.zeros_like(r))  # refractory while V (at the start) stays above
    s = spike(V_new - p["V_spike"], "sigmoid", alpha=0.5) * (r <= 0).to(V.dtype)
    return {"s": s, "V": V_new}, {"V": V_new, "w": w_new, "refractory": torch.where(s.detach() > 0,
                                                                                    torch.ones_like(r), r)}


def _const(v: float) -> Callable[[Params], float]:
    return lambda p: v


def _param(name: str) -> Callable[[Params], Number]:
    return lambda p: p[name]


REFERENCES: Dict[str, Reference] = {}


def _add(ref: Reference) -> None:
    REFERENCES[ref.name] = ref


_add(Reference(
    name="if", model="SpikingJelly IFNode (hard reset)",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"v_th": 1.0, "v_reset": 0.0}, learnable=(),
    surrogate="sigmoid(alpha=4)", step=_step_if,
))
_add(Reference(
    name="lif", model="SpikingJelly LIFNode (decay_input, hard reset)",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "v_th": 1.0, "v_reset": 0.0}, learnable=(),
    surrogate="sigmoid(alpha=4)", step=_step_lif,
    input_ranges={"x": (0.0, 2.0)},
))
_add(Reference(
    name="lif_soft", model="SpikingJelly LIFNode(decay_input=False, v_reset=None, detach_reset=True)",
    inputs=("x",), state_init={"v": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "v_th": 1.0}, learnable=(),
    surrogate="atan(alpha=2)", step=_step_lif_soft,
))
_add(Reference(
    name="plif", model="SpikingJelly ParametricLIFNode (init_tau=2)",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"w": 0.0, "v_th": 1.0, "v_reset": 0.0}, learnable=("w",),
    surrogate="sigmoid(alpha=4)", step=_step_plif,
    input_ranges={"x": (0.0, 2.0)},
))
_add(Reference(
    name="plif_channel", model="ParametricLIFNode with one learnable w per channel",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"init_tau": 2.0, "w": 0.0, "v_th": 1.0, "v_reset": 0.0}, learnable=("w",),
    surrogate="sigmoid(alpha=4)", step=_step_plif_channel,
    input_ranges={"x": (0.0, 2.0)},
    param_shapes={"w": (3, 1, 1)}, sizes={"C": 3}, step_shape=(2, 3, 4, 5),
))
_add(Reference(
    name="lif_hetero", model="LIF with one learnable tau per neuron (Perez-Nieves et al. 2021)",
    inputs=("x",), state_init={"v": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"dt": 1.0, "tau": 20.0, "v_th": 1.0}, learnable=("tau",),
    surrogate="fast_sigmoid(slope=25)", step=_step_lif_hetero,
    input_ranges={"x": (0.0, 8.0)},
    param_shapes={"tau": (7,)}, sizes={"N": 7}, step_shape=(3, 7),
))
_add(Reference(
    name="lif_hetero_ct", model="lif_hetero as an ODE, exact propagator with one e^{-dt/tau} per neuron",
    inputs=("x",), state_init={"v": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"dt": 1.0, "tau": 20.0, "v_th": 1.0}, learnable=("tau",),
    surrogate="fast_sigmoid(slope=25)", step=_step_lif_hetero,  # the exact step of tau v' = x - v
    input_ranges={"x": (0.0, 8.0)},
    param_shapes={"tau": (7,)}, sizes={"N": 7}, step_shape=(3, 7),
))
_add(Reference(
    name="qif", model="SpikingJelly QIFNode",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_th": 1.0, "v_rest": 0.0, "v_reset": -0.1},
    learnable=(), surrogate="piecewise_quadratic(alpha=1)", step=_step_qif,
))
_add(Reference(
    name="eif", model="SpikingJelly EIFNode",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "delta_T": 1.0, "theta_rh": 0.8, "v_th": 1.0, "v_rest": 0.0,
            "v_reset": -0.1},
    learnable=(), surrogate="soft_sign(alpha=2)", step=_step_eif,
))
_add(Reference(
    name="izhikevich", model="Izhikevich 2003 (regular spiking), Norse step order, scaled by 1/100",
    inputs=("x",), state_init={"v": _param("c"), "u": lambda p: p["b"] * p["c"]},
    outputs=("s",), spike_outputs=("s",),
    params={"a": 0.02, "b": 0.2, "c": -0.65, "d": 0.08, "v_th": 0.3, "dt": 1.0},
    learnable=(), surrogate="super_spike(alpha=1)", step=_step_izhikevich,
))
_add(Reference(
    name="alif", model="Bellec et al. 2018 (LSNN) adaptive threshold, Norse lsnn_step form",
    inputs=("x",), state_init={"v": _param("v_reset"), "b": _param("v_th")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau_m": 2.0, "tau_a": 5.0, "v_th": 0.6, "beta": 0.5, "v_reset": 0.0},
    learnable=("beta",), surrogate="triangle(alpha=1)", step=_step_alif,
))
_add(Reference(
    name="cuba_lif", model="SpikingJelly CUBALIFNode (threshold raised to 1.5)",
    inputs=("x",), state_init={"c": _const(0.0), "v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"c_decay": 0.5, "v_decay": 0.75, "v_th": 1.5, "v_reset": 0.0},
    learnable=(), surrogate="rect(alpha=1)", step=_step_cuba_lif,
))
_add(Reference(
    name="adex", model="Brette & Gerstner 2005 AdEx, dimensionless, forward Euler",
    inputs=("x",), state_init={"v": _param("v_rest"), "w": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"tau_m": 2.0, "tau_w": 4.0, "v_rest": 0.0, "v_T": 0.6, "delta_T": 0.2,
            "v_th": 1.0, "v_reset": 0.0, "a": 0.5, "b": 0.3, "dt": 1.0},
    learnable=("b",), surrogate="fast_sigmoid(slope=5)", step=_step_adex,
))
_add(Reference(
    name="resonate_fire", model="Izhikevich 2001 resonate-and-fire (exact linear step)",
    inputs=("x",), state_init={"z_re": _const(0.0), "z_im": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"b": -0.2, "omega": 1.0, "v_th": 1.0},
    learnable=(), surrogate="erf(alpha=2)", step=_step_resonate_fire,
))
_add(Reference(
    name="modulated_lif", model="SpikingJelly FlexSN tutorial complicated_lif_core (beta=0.5, gamma=0.9)",
    inputs=("x", "m"), state_init={"v": _const(0.0), "rho": _const(0.0)},
    outputs=("s1", "s2"), spike_outputs=("s1", "s2"),
    params={"beta": 0.5, "gamma": 0.9}, learnable=(),
    surrogate="atan(alpha=2)", step=_step_modulated_lif,
    input_ranges={"m": (-3.0, 3.0)},
))
_add(Reference(
    name="klif", model="SpikingJelly KLIFNode (learnable k)",
    inputs=("x",), state_init={"v": _param("v_reset")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "k": 1.0, "v_th": 1.0, "v_reset": 0.0}, learnable=("k",),
    surrogate="piecewise_exp(alpha=1)", step=_step_klif,
    input_ranges={"x": (-1.0, 2.5)},  # negative inputs exercise the relu
))
_add(Reference(
    name="leaky", model="snnTorch Leaky (subtract reset, reset_delay=True, learn_beta)",
    inputs=("x",), state_init={"mem": _const(0.0)},
    outputs=("spk", "mem"), spike_outputs=("spk",),
    params={"beta": 0.8, "threshold": 1.0}, learnable=("beta",),
    surrogate="atan(alpha=2)", step=_step_leaky,
))


_add(Reference(
    name="li", model="Norse LICell (li_feed_forward_step, default LIParameters, dt = 1 ms)",
    inputs=("x",), state_init={"v": _const(0.0), "i": _const(0.0)},
    outputs=("v",), spike_outputs=(),
    params={"tau_syn_inv": 200.0, "tau_mem_inv": 100.0, "v_leak": 0.0, "dt": 0.001}, learnable=("tau_mem_inv",),
    surrogate="sigmoid(alpha=4)", step=_step_li,
))
_add(Reference(
    name="lif_ct", model="LIF ODE (Neuronal Dynamics eq. 1.5), exact propagator",
    inputs=("I",), state_init={"v": _param("v_rest")},
    outputs=("s",), spike_outputs=("s",),
    params={"tau": 2.0, "R": 1.0, "v_rest": 0.0, "v_th": 1.0, "v_reset": 0.0, "dt": 1.0}, learnable=(),
    surrogate="sigmoid(alpha=4)", step=_step_lif_ct,
    input_ranges={"I": (0.0, 2.0)},
))


_add(Reference(
    name="cuba_lif_ct", model="CUBA LIF ODEs (Brette et al. 2007), exact with two time constants",
    inputs=("x",), state_init={"v": _param("v_rest"), "i": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"tau_mem": 2.0, "tau_syn": 1.0, "R": 2.0, "v_rest": 0.0, "v_th": 1.0, "v_reset": 0.0, "dt": 1.0},
    learnable=("R",), surrogate="sigmoid(alpha=4)", step=_step_cuba_lif_ct,
))
_add(Reference(
    name="lif_refractory", model="exact LIF with an absolute refractory period (Brian2 semantics)",
    inputs=("I",), state_init={"v": _param("v_rest"), "refractory": _const(0.0)},
    outputs=("s", "v"), spike_outputs=("s",),
    params={"tau": 2.0, "R": 1.0, "v_rest": 0.0, "v_th": 1.0, "v_reset": 0.0, "t_ref": 2.0, "dt": 1.0},
    learnable=(), surrogate="atan(alpha=2)", step=_step_lif_refractory,
    input_ranges={"I": (0.5, 4.0)},
))
_add(Reference(
    name="adex_ct", model="AdEx ODEs (Brette & Gerstner 2005), rk4",
    inputs=("x",), state_init={"v": _param("v_rest"), "w": _const(0.0)},
    outputs=("s",), spike_outputs=("s",),
    params={"tau_m": 2.0, "tau_w": 4.0, "v_rest": 0.0, "v_T": 0.6, "delta_T": 0.2, "v_th": 1.0,
            "v_reset": 0.0, "a": 0.5, "b": 0.3, "dt": 0.5},
    learnable=("b",), surrogate="fast_sigmoid(slope=5)", step=_step_adex_ct,
    input_ranges={"x": (0.0, 3.0)},
))
_add(Reference(
    name="izhikevich_ct", model="Izhikevich 2003 ODEs in mV/ms, rk2",
    inputs=("I",), state_init={"v": _param("c"), "u": lambda p: p["b"] * p["c"]},
    outputs=("s", "v"), spike_outputs=("s",),
    params={"a": 0.02, "b": 0.2, "c": -65.0, "d": 8.0, "v_peak": 30.0, "dt": 0.5},
    learnable=(), surrogate="super_spike(alpha=0.1)", step=_step_izhikevich_ct,
    input_ranges={"I": (0.0, 80.0)},
))
_add(Reference(
    name="hh", model="Hodgkin-Huxley 1952 (Dayan & Abbott convention), exponential Euler",
    inputs=("I",), state_init={"V": _const(-65.0), "m": _const(0.0529325), "h": _const(0.5961207),
                               "n": _const(0.3176769), "refractory": _const(0.0)},
    outputs=("s", "V"), spike_outputs=("s",),
    params={"C": 1.0, "g_Na": 120.0, "g_K": 36.0, "g_L": 0.3, "E_Na": 50.0, "E_K": -77.0, "E_L": -54.387,
            "V_spike": 0.0, "dt": 0.1},
    learnable=(), surrogate="sigmoid(alpha=0.5)", step=_step_hh,
    input_ranges={"I": (0.0, 300.0)},
))

_add(Reference(
    name="morris_lecar", model="Morris-Lecar 1981 (Rinzel & Ermentrout's parameters), classical Runge-Kutta",
    inputs=("I",), state_init={"V": _const(-60.0), "w": _const(0.0149), "refractory": _const(0.0)},
    outputs=("s", "V"), spike_outputs=("s",),
    params={"C": 20.0, "g_L": 2.0, "V_L": -60.0, "g_Ca": 4.4, "V_Ca": 120.0, "g_K": 8.0, "V_K": -84.0, "V1": -1.2,
            "V2": 18.0, "V3": 2.0, "V4": 30.0, "phi": 0.04, "V_spike": 0.0, "dt": 0.1},
    learnable=(), surrogate="sigmoid(alpha=0.5)", step=_step_morris_lecar,
    input_ranges={"I": (800.0, 3000.0)},  # (a spike within the test's few steps of 0.1 ms)
))

# --- escape_lif: LIF with escape noise (Jolivet et al. 2006): fires with probability 1 - exp(-rho dt) ----
def _step_escape_lif(i, st, p):
    h = st["v"] + (i["x"] - st["v"]) * p["dt"] / p["tau"]
    rho = p["rho0"] * torch.exp((h - p["v_th"]) / p["delta"])
    prob = 1 - torch.exp(-rho * p["dt"])
    s = spike(prob - i["rand__0"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": h * (1 - s)}


_add(Reference(
    name="escape_lif", model="LIF with escape noise (Jolivet, Rauch, Luescher & Gerstner 2006)",
    inputs=("x",), state_init={"v": _const(0.0)}, outputs=("s",), spike_outputs=("s",),
    params={"tau": 10.0, "v_th": 1.0, "delta": 0.1, "rho0": 0.05, "dt": 1.0},
    learnable=(), surrogate="sigmoid(alpha=4.0)", step=_step_escape_lif, draws=("rand__0",),
))


# --- ou_lif: LIF driven by an Ornstein-Uhlenbeck current, Euler-Maruyama ----
def _step_ou_lif(i, st, p):
    v, noise, dt = st["v"], st["i_n"], p["dt"]
    v_int = v + dt * (i["x"] + noise - v) / p["tau"]  # both from the values at the start of the step
    n_int = noise - dt * noise / p["tau_n"] + math.sqrt(dt) * p["sigma"] * math.sqrt(2 / p["tau_n"]) * i["randn__0"]
    s = spike(v_int - p["v_th"], "sigmoid", alpha=4.0)
    return {"s": s}, {"v": v_int * (1 - s), "i_n": n_int}


_add(Reference(
    name="ou_lif", model="LIF driven by an Ornstein-Uhlenbeck current (Euler-Maruyama)",
    inputs=("x",), state_init={"v": _const(0.0), "i_n": _const(0.0)}, outputs=("s",), spike_outputs=("s",),
    params={"tau": 10.0, "tau_n": 5.0, "sigma": 0.3, "v_th": 1.0, "dt": 0.1},
    learnable=(), surrogate="sigmoid(alpha=4.0)", step=_step_ou_lif, draws=("randn__0",),
))

# --------------------------------------------------------------------------
# Running a sequence
# --------------------------------------------------------------------------


def run_reference(
    name: str,
    inputs_seq: Mapping[str, torch.Tensor],
    params: Optional[Params] = None,
    states: Optional[Mapping[str, torch.Tensor]] = None,
    return_state_seqs: bool = False,
):
    """Run reference ``name`` over ``inputs_seq`` (``{input: Tensor[T, ...]}``).

    ``params`` override the defaults (floats, or tensors e.g. with requires_grad);
    ``states`` continue from given states instead of the initial ones.
    Returns ``(outputs_seq, final_states)``, each ``{name: tensor}`` with outputs
    stacked to ``[T, ...]``; with ``return_state_seqs=True`` also
    ``state_seqs`` (``{state: Tensor[T, ...]}``, the states after each step).
    """
    ref = REFERENCES[name]
    missing = set(ref.inputs + ref.draws) - set(inputs_seq)
    if missing:
        raise KeyError(f"{name}: missing inputs {sorted(missing)}")
    p = ref.resolve_params(params)
    first = inputs_seq[ref.inputs[0]]
    T = first.shape[0]
    st: TensorDict = dict(states) if states is not None else ref.init_states(first[0], p)
    outs: Dict[str, list] = {k: [] for k in ref.outputs}
    seqs: Dict[str, list] = {k: [] for k in ref.states}
    for t in range(T):
        o, new = ref.step({k: inputs_seq[k][t] for k in ref.inputs + ref.draws}, st, p)
        st = {**st, **new}
        for k in ref.outputs:
            outs[k].append(o[k] if k in o else st[k])
        for k in ref.states:
            seqs[k].append(st[k])
    outputs_seq = {k: torch.stack(v) for k, v in outs.items()}
    if return_state_seqs:
        return outputs_seq, st, {k: torch.stack(v) for k, v in seqs.items()}
    return outputs_seq, st


def input_seed(name: str, base: int = 0) -> int:
    """A stable per-spec seed (independent of PYTHONHASHSEED)."""
    return (zlib.crc32(name.encode()) + base) % (2 ** 31)


def make_inputs(
    name: str,
    T: int = 8,
    shape: Sequence[int] = (3, 5),
    seed: Optional[int] = None,
    dtype: torch.dtype = torch.float64,
) -> Dict[str, torch.Tensor]:
    """Seeded uniform inputs ``{input: Tensor[T, *shape]}`` in each input's range."""
    ref = REFERENCES[name]
    gen = torch.Generator().manual_seed(input_seed(name) if seed is None else seed)
    out = {}
    for k in ref.inputs:
        lo, hi = ref.input_range(k)
        draw = torch.rand((T, *shape), generator=gen, dtype=dtype, device="cpu")  # the same numbers everywhere
        out[k] = (lo + (hi - lo) * draw).to(torch.get_default_device())
    return out
