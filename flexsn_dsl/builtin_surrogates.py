"""The built-in surrogate catalogue, registered through the public plugin hook.

Gradients follow SpikingJelly's surrogate classes (same names, defaults and
formulas); ``fast_sigmoid`` follows snnTorch, ``triangle`` Norse. ``x`` is the
argument of ``spike``; every forward is the Heaviside step (1 where x >= 0).
"""
from __future__ import annotations

from .hookspecs import hookimpl

# name -> (gradient g(x), default parameters, where it comes from)
CATALOGUE: dict[str, tuple[str, dict[str, float], str]] = {
    "sigmoid": ("alpha * sigmoid(alpha * x) * (1 - sigmoid(alpha * x))", {"alpha": 4.0},
                "SpikingJelly surrogate.Sigmoid"),
    "atan": ("alpha / 2 / (1 + (pi / 2 * alpha * x) ** 2)", {"alpha": 2.0}, "SpikingJelly surrogate.ATan"),
    "piecewise_quadratic": ("where(abs(x) > 1 / alpha, 0, alpha - alpha ** 2 * abs(x))", {"alpha": 1.0},
                            "SpikingJelly surrogate.PiecewiseQuadratic"),
    "piecewise_exp": ("alpha / 2 * exp(-alpha * abs(x))", {"alpha": 1.0}, "SpikingJelly surrogate.PiecewiseExp"),
    "soft_sign": ("alpha / (2 * (1 + alpha * abs(x)) ** 2)", {"alpha": 2.0}, "SpikingJelly surrogate.SoftSign"),
    "erf": ("alpha / sqrt(pi) * exp(-(alpha * x) ** 2)", {"alpha": 2.0}, "SpikingJelly surrogate.Erf"),
    "super_spike": ("alpha / (abs(x) + 1) ** 2", {"alpha": 1.0},
                    "SpikingJelly surrogate.SuperSpike (Zenke & Ganguli 2018)"),
    "rect": ("where(abs(x) < 0.5 / alpha, alpha, 0)", {"alpha": 1.0}, "SpikingJelly surrogate.Rect"),
    "piecewise_leaky_relu": ("where(abs(x) < w, 1 / (2 * w), c)", {"w": 1.0, "c": 0.01},
                             "SpikingJelly surrogate.PiecewiseLeakyReLU"),
    "s2nn": ("where(x < 0, alpha * sigmoid(alpha * x) * (1 - sigmoid(alpha * x)), beta / (x + 1))",
             {"alpha": 4.0, "beta": 1.0}, "SpikingJelly surrogate.S2NN"),
    "q_pseudo_spike": ("(1 + 2 / (alpha - 1) * abs(x)) ** (-alpha)", {"alpha": 2.0},
                       "SpikingJelly surrogate.QPseudoSpike"),
    "leaky_k_relu": ("where(x >= 0, k, leak)", {"leak": 0.0, "k": 1.0}, "SpikingJelly surrogate.LeakyKReLU"),
    "nonzero_sign_log_abs": ("1 / (1 / alpha + abs(x))", {"alpha": 1.0},
                             "SpikingJelly surrogate.NonzeroSignLogAbs"),
    "log_tailed_relu": ("where(x > 1, 1 / x, where(x <= 0, alpha, 1))", {"alpha": 0.0},
                        "SpikingJelly surrogate.LogTailedReLU"),
    "fast_sigmoid": ("1 / (slope * abs(x) + 1) ** 2", {"slope": 25.0}, "snnTorch surrogate.fast_sigmoid"),
    "triangle": ("alpha * max(0, 1 - alpha * abs(x))", {"alpha": 1.0}, "triangle (tent) of half-width 1/alpha and height alpha"),
    "straight_through": ("1", {}, "straight-through estimator (Bengio et al. 2013)"),
}


@hookimpl
def flexsn_dsl_register_surrogates(registry) -> None:
    """The built-in catalogue: the same hook, and the same checks, as any third-party plugin."""
    for name, (gradient, params, source) in CATALOGUE.items():
        registry.register(name, gradient=gradient, params=params, description=source)
