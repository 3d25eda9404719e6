"""The built-in surrogate catalogue, registered through the public plugin hook.

Gradients follow SpikingJelly's surrogate classes (same names, defaults and
formulas); ``fast_sigmoid`` follows snnTorch, ``triangle`` Norse. ``x`` is the
argument of ``spike``; every forward is the Heaviside step (1 where x >= 0).
"""
from __future__ import annotations

from .hookspecs import hookimpl

CATALOGUE: dict[str, tuple[str, dict[str, float]]] = {
    "sigmoid": ("alpha * sigmoid(alpha * x) * (1 - sigmoid(alpha * x))", {"alpha": 4.0}),
    "atan": ("alpha / 2 / (1 + (pi / 2 * alpha * x) ** 2)", {"alpha": 2.0}),
    "piecewise_quadratic": ("where(abs(x) > 1 / alpha, 0, alpha - alpha ** 2 * abs(x))", {"alpha": 1.0}),
    "piecewise_exp": ("alpha / 2 * exp(-alpha * abs(x))", {"alpha": 1.0}),
    "soft_sign": ("alpha / (2 * (1 + alpha * abs(x)) ** 2)", {"alpha": 2.0}),
    "erf": ("alpha / sqrt(pi) * exp(-(alpha * x) ** 2)", {"alpha": 2.0}),
    "super_spike": ("alpha / (abs(x) + 1) ** 2", {"alpha": 1.0}),
    "rect": ("where(abs(x) < 0.5 / alpha, alpha, 0)", {"alpha": 1.0}),
    "piecewise_leaky_relu": ("where(abs(x) < w, 1 / (2 * w), c)", {"w": 1.0, "c": 0.01}),
    "s2nn": ("where(x < 0, alpha * sigmoid(alpha * x) * (1 - sigmoid(alpha * x)), beta / (x + 1))",
             {"alpha": 4.0, "beta": 1.0}),
    "q_pseudo_spike": ("(1 + 2 / (alpha - 1) * abs(x)) ** (-alpha)", {"alpha": 2.0}),
    "leaky_k_relu": ("where(x >= 0, k, leak)", {"leak": 0.0, "k": 1.0}),
    "nonzero_sign_log_abs": ("1 / (1 / alpha + abs(x))", {"alpha": 1.0}),
    "log_tailed_relu": ("where(x > 1, 1 / x, where(x <= 0, alpha, 1))", {"alpha": 0.0}),
    "fast_sigmoid": ("1 / (slope * abs(x) + 1) ** 2", {"slope": 25.0}),
    "triangle": ("alpha * max(0, 1 - alpha * abs(x))", {"alpha": 1.0}),
    "straight_through": ("1", {}),
}


@hookimpl
def flexsn_dsl_register_surrogates(registry) -> None:
    for name, (gradient, params) in CATALOGUE.items():
        registry.register(name, gradient=gradient, params=params)
