"""Surrogate gradients that are not in flexsn-dsl's built-in catalogue.

Each one follows the library or paper named in its description, with the same
formula; ``x`` is the argument of ``spike`` (membrane potential minus
threshold), every forward is the Heaviside step. Use one by name in a spec::

    surrogate: {name: multi_gaussian, sigma: 0.5}
"""
from __future__ import annotations

import flexsn_dsl

__version__ = "0.1.0"

# name -> (gradient g(x), default parameters, source)
SURROGATES: dict[str, tuple[str, dict[str, float], str]] = {
    "circ": (
        "alpha ** 3 / (alpha ** 2 + x ** 2) ** 1.5",
        {"alpha": 1.0},
        "Norse threshold method 'circ' (norse.torch.functional.threshold.HeaviCirc): the gradient "
        "2*alpha*(1/(2*sqrt(alpha^2+x^2)) - x^2/(2*(alpha^2+x^2)^1.5)) = alpha^3/(alpha^2+x^2)^(3/2); "
        "1 at x=0, heavy (1/|x|^3) tails. Norse passes its neuron's alpha (100 by default); the default here is 1.",
    ),
    "heavi_tanh": (
        "4 * sigmoid(2 * k * x) * (1 - sigmoid(2 * k * x))",
        {"k": 1.0},
        "Norse threshold method 'tanh' (norse.torch.functional.threshold.HeaviTanh): 1 - tanh(k x)^2, "
        "as Norse computes it (without a factor k), written as the identical 4 sigmoid(2kx) (1 - sigmoid(2kx)) "
        "so that it lowers to tl.sigmoid. Norse passes its neuron's alpha as k; the default here is 1.",
    ),
    "spike_rate_escape": (
        "slope * exp(-beta * abs(x - 1))",
        {"beta": 1.0, "slope": 25.0},
        "snnTorch surrogate.spike_rate_escape(beta=1, slope=25): slope * exp(-beta |x - 1|), the escape-noise "
        "(Boltzmann) rate; centred at x = 1 exactly as snnTorch computes it.",
    ),
    "sparse_fast_sigmoid": (
        "where(x > B, 1 / (slope * abs(x) + 1) ** 2, 0)",
        {"slope": 25.0, "B": 1.0},
        "snnTorch surrogate.SFS(slope=25, B=1), from Perez-Nieves & Goodman 2021, 'Sparse Spiking Gradient "
        "Descent' (NeurIPS): the fast-sigmoid gradient 1/(slope |x| + 1)^2 where x > B, else 0.",
    ),
    "gaussian": (
        "gamma * exp(-x ** 2 / (2 * sigma ** 2)) / (sqrt(2 * pi) * sigma)",
        {"sigma": 0.5, "gamma": 0.5},
        "Gaussian surrogate of Yin, Corradi & Bohte 2021, 'Accurate and efficient time-domain classification "
        "with adaptive spiking recurrent neural networks' (Nature Machine Intelligence), SRNN code option 'G': "
        "gamma * N(x; 0, sigma), sigma=0.5 ('lens'), gamma=0.5.",
    ),
    "multi_gaussian": (
        "gamma * ((1 + height) * exp(-x ** 2 / (2 * sigma ** 2)) / sigma"
        " - height * exp(-(x - sigma) ** 2 / (2 * (scale * sigma) ** 2)) / (scale * sigma)"
        " - height * exp(-(x + sigma) ** 2 / (2 * (scale * sigma) ** 2)) / (scale * sigma)) / sqrt(2 * pi)",
        {"sigma": 0.5, "scale": 6.0, "height": 0.15, "gamma": 0.5},
        "Multi-Gaussian (MG) surrogate of Yin, Corradi & Bohte 2021 (Nature Machine Intelligence): "
        "gamma * ((1+h) N(x; 0, s) - h N(x; s, 6s) - h N(x; -s, 6s)) with s=0.5, h=0.15, scale 6, gamma=0.5; "
        "slightly negative tails.",
    ),
}


@flexsn_dsl.hookimpl
def flexsn_dsl_register_surrogates(registry) -> None:
    for name, (gradient, params, source) in SURROGATES.items():
        registry.register(name, gradient=gradient, params=params, description=source)
