"""The built-in surrogate catalogue against hand-written gradients.

Each formula below is written independently from the library it names (SpikingJelly's
``surrogate.py`` backward, as coded; for ``piecewise_leaky_relu`` SpikingJelly HEAD's
torch formula 1/(2w) inside |x| < w; ``fast_sigmoid`` from snnTorch; ``triangle`` is
alpha * max(0, 1 - alpha |x|)). For every surrogate, with its default parameters and
with others, a one-line spec ``s: spike(x)`` is run on both backends in float64: the
forward must be the Heaviside step (1 where x >= 0, including x == 0) and ds/dx must
equal the formula on a grid (points where the gradient jumps are left out).
"""
from __future__ import annotations

import math

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.plugins import BUILTIN, get_plugins

BACKENDS = ["torch", "triton"]
PI = math.pi


def _sigmoid_grad(x, alpha):
    s = torch.sigmoid(alpha * x)
    return (1 - s) * s * alpha


# name -> (contract defaults, reference g(x, **params), non-default params, x where g jumps (given params))
CATALOGUE = {
    "sigmoid": ({"alpha": 4.0}, lambda x, alpha: _sigmoid_grad(x, alpha), {"alpha": 2.5}, lambda p: []),
    "atan": ({"alpha": 2.0},
             lambda x, alpha: (alpha / 2) / (1 + (PI * (alpha / 2) * x) ** 2), {"alpha": 3.0}, lambda p: []),
    "piecewise_quadratic": ({"alpha": 1.0},
                            lambda x, alpha: torch.where(x.abs() > 1 / alpha, torch.zeros_like(x),
                                                         -(alpha ** 2) * x.abs() + alpha),
                            {"alpha": 0.5}, lambda p: [1 / p["alpha"], -1 / p["alpha"]]),
    "piecewise_exp": ({"alpha": 1.0}, lambda x, alpha: alpha / 2 * torch.exp(-alpha * x.abs()), {"alpha": 2.5},
                      lambda p: []),
    "soft_sign": ({"alpha": 2.0}, lambda x, alpha: 1 / (2 * alpha * (1 / alpha + x.abs()) ** 2), {"alpha": 0.7},
                  lambda p: []),
    "erf": ({"alpha": 2.0}, lambda x, alpha: torch.exp(-(alpha * x) ** 2) * (alpha / math.sqrt(PI)), {"alpha": 1.3},
            lambda p: []),
    "super_spike": ({"alpha": 1.0}, lambda x, alpha: alpha / (x.abs() + 1) ** 2, {"alpha": 2.5}, lambda p: []),
    "rect": ({"alpha": 1.0}, lambda x, alpha: alpha * (x.abs() < 0.5 / alpha).to(x), {"alpha": 0.4},
             lambda p: [0.5 / p["alpha"], -0.5 / p["alpha"]]),
    "piecewise_leaky_relu": ({"w": 1.0, "c": 0.01},
                             lambda x, w, c: torch.where(x.abs() < w, torch.full_like(x, 1 / (2 * w)),
                                                         torch.full_like(x, c)),
                             {"w": 0.6, "c": 0.1}, lambda p: [p["w"], -p["w"]]),
    "s2nn": ({"alpha": 4.0, "beta": 1.0},
             lambda x, alpha, beta: torch.where(x < 0, _sigmoid_grad(x, alpha), beta / (x + 1)),
             {"alpha": 2.0, "beta": 0.5}, lambda p: [0.0]),
    "q_pseudo_spike": ({"alpha": 2.0}, lambda x, alpha: (1 + 2 / (alpha - 1) * x.abs()) ** (-alpha), {"alpha": 3.0},
                       lambda p: []),
    "leaky_k_relu": ({"leak": 0.0, "k": 1.0},
                     lambda x, leak, k: torch.where(x >= 0, torch.full_like(x, k), torch.full_like(x, leak)),
                     {"leak": 0.1, "k": 2.0}, lambda p: [0.0]),
    "nonzero_sign_log_abs": ({"alpha": 1.0}, lambda x, alpha: 1 / (1 / alpha + x.abs()), {"alpha": 4.0},
                             lambda p: []),
    "log_tailed_relu": ({"alpha": 0.0},
                        lambda x, alpha: torch.where(x > 1, 1 / x, torch.where(x <= 0, torch.full_like(x, alpha),
                                                                               torch.ones_like(x))),
                        {"alpha": 0.2}, lambda p: [0.0, 1.0]),
    "fast_sigmoid": ({"slope": 25.0}, lambda x, slope: 1 / (slope * x.abs() + 1) ** 2, {"slope": 5.0},
                     lambda p: []),
    "triangle": ({"alpha": 1.0}, lambda x, alpha: alpha * torch.clamp(1 - alpha * x.abs(), min=0), {"alpha": 0.7},
                 lambda p: []),
    "straight_through": ({}, lambda x: torch.ones_like(x), None, lambda p: []),
}
CONTRACT_NAMES = {"sigmoid", "atan", "piecewise_quadratic", "piecewise_exp", "soft_sign", "erf", "super_spike",
                  "rect", "piecewise_leaky_relu", "s2nn", "q_pseudo_spike", "leaky_k_relu", "nonzero_sign_log_abs",
                  "log_tailed_relu", "fast_sigmoid", "triangle", "straight_through"}

# a grid through 0, the kinks and jumps, and both tails (0.05 apart), and a few odd points
GRID = torch.cat([torch.linspace(-3.0, 3.0, 121, dtype=torch.float64),
                  torch.tensor([-1e-3, 1e-3, -1e-9, 0.123, -0.777, 2.2222, 7.5, -7.5], dtype=torch.float64)])


def _spec(name: str, params: dict | None) -> str:
    if params is None:
        surrogate = name
    else:
        surrogate = "{" + ", ".join([f"name: {name}"] + [f"{k}: {v!r}" for k, v in params.items()]) + "}"
    return f"neuron: sg_{name}\nstates: {{v: 0.0}}\nstep:\n  s: spike(x)\nsurrogate: {surrogate}\n"


def _forward_backward(text: str, backend: str):
    m = flexsn_dsl.loads(text, backend=backend)
    x = GRID.clone().reshape(1, -1).requires_grad_(True)  # [T=1, N]
    s = m(x)
    s.sum().backward()
    return s.detach().reshape(-1), x.grad.reshape(-1)


CASES = [pytest.param(name, kind, backend, id=f"{name}-{kind}-{backend}")
         for name, entry in CATALOGUE.items()
         for kind in (("default", "other") if entry[2] is not None else ("default",))
         for backend in BACKENDS]


@pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")  # 1/x in the branch where() drops
@pytest.mark.parametrize("name, kind, backend", CASES)
def test_surrogate_gradient(name, kind, backend):
    defaults, reference, other, jumps = CATALOGUE[name]
    params = dict(defaults) if kind == "default" else dict(other)
    spikes, grad = _forward_backward(_spec(name, params), backend)

    assert spikes.dtype == torch.float64
    torch.testing.assert_close(spikes, (GRID >= 0).to(torch.float64), rtol=0, atol=0)
    assert spikes[GRID == 0].eq(1).all()  # SpikingJelly fires AT the threshold

    keep = torch.ones_like(GRID, dtype=torch.bool)
    for point in jumps(params):
        keep &= (GRID - point).abs() > 1e-9
    expected = reference(GRID, **params)
    torch.testing.assert_close(grad[keep], expected[keep], rtol=1e-9, atol=1e-12)
    assert torch.isfinite(grad).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_bare_name_and_no_surrogate_mean_defaults(backend):
    _, grad = _forward_backward(_spec("atan", None), backend)  # surrogate: atan
    torch.testing.assert_close(grad, CATALOGUE["atan"][1](GRID, alpha=2.0), rtol=1e-9, atol=1e-12)
    text = "neuron: sg_default\nstates: {v: 0.0}\nstep:\n  s: spike(x)\n"  # no surrogate: sigmoid(alpha=4)
    _, grad = _forward_backward(text, backend)
    torch.testing.assert_close(grad, _sigmoid_grad(GRID, 4.0), rtol=1e-9, atol=1e-12)


def test_partial_parameters_keep_the_other_defaults():
    _, grad = _forward_backward(_spec("piecewise_leaky_relu", {"c": 0.25}), "torch")
    keep = (GRID.abs() - 1.0).abs() > 1e-9
    expected = CATALOGUE["piecewise_leaky_relu"][1](GRID, w=1.0, c=0.25)
    torch.testing.assert_close(grad[keep], expected[keep], rtol=1e-9, atol=1e-12)


def test_the_catalogue_is_the_contract():
    plugins = get_plugins()
    builtin = {name: s for name, s in plugins.surrogates.items() if s.origin == BUILTIN}
    assert set(builtin) == CONTRACT_NAMES
    assert CONTRACT_NAMES <= set(plugins.surrogates)
    assert set(CATALOGUE) == CONTRACT_NAMES
    for name, (defaults, *_rest) in CATALOGUE.items():
        assert builtin[name].params == defaults, name


def test_the_gradient_is_applied_at_the_argument_of_spike():
    """g is evaluated at u = (argument of spike), and chains through it."""
    text = ("neuron: shifted\nparameters: {th: 0.5}\nstates: {v: 0.0}\nstep:\n  s: spike(2 * x - th)\n"
            "surrogate: {name: triangle, alpha: 0.7}\n")
    for backend in BACKENDS:
        spikes, grad = _forward_backward(text, backend)
        u = 2 * GRID - 0.5
        torch.testing.assert_close(spikes, (u >= 0).to(torch.float64), rtol=0, atol=0)
        torch.testing.assert_close(grad, 2 * CATALOGUE["triangle"][1](u, alpha=0.7), rtol=1e-9, atol=1e-12)
