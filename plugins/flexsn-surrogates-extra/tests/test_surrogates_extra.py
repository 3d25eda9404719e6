"""flexsn-surrogates-extra: found through its entry point, used by name from YAML on both
backends, gradients checked in float64 against the formulas written out by hand."""
from __future__ import annotations

import math

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.plugins import get_plugins

N01 = 1 / math.sqrt(2 * math.pi)


def _normal(x, mu, sigma):
    return N01 / sigma * torch.exp(-((x - mu) ** 2) / (2 * sigma ** 2))


# name -> (spec parameters, g(x) written out independently of the plugin)
CASES = {
    "circ": ({"alpha": 1.5}, lambda x: 1.5 ** 3 / (1.5 ** 2 + x ** 2) ** 1.5),
    "heavi_tanh": ({"k": 2.0}, lambda x: 1 - torch.tanh(2.0 * x) ** 2),
    "spike_rate_escape": ({}, lambda x: 25.0 * torch.exp(-1.0 * (x - 1).abs())),
    "sparse_fast_sigmoid": ({"B": 0.5}, lambda x: torch.where(x > 0.5, 1 / (25 * x.abs() + 1) ** 2,
                                                               torch.zeros_like(x))),
    "gaussian": ({}, lambda x: 0.5 * _normal(x, 0.0, 0.5)),
    "multi_gaussian": ({}, lambda x: 0.5 * (1.15 * _normal(x, 0.0, 0.5) - 0.15 * _normal(x, 0.5, 3.0)
                                            - 0.15 * _normal(x, -0.5, 3.0))),
}
THRESHOLD = 0.25


def _spec(name: str, params: dict) -> str:
    values = "".join(f", {k}: {v}" for k, v in params.items())
    return f"""
neuron: probe_{name}
surrogate: {{name: {name}{values}}}
states: {{v: 0.0}}
step:
  s: spike(x - {THRESHOLD})
outputs: [s]
"""


def test_registered_through_the_entry_point_with_sources():
    plugins = get_plugins()
    assert not [e for e in plugins.errors if "surrogates_extra" in e.message]
    where = dict(plugins.sources)["surrogates_extra"]
    assert where.startswith("entry point surrogates_extra = flexsn_surrogates_extra")
    for name in CASES:
        surrogate = plugins.surrogate(name)
        assert surrogate is not None and surrogate.origin == "surrogates_extra"
        assert any(word in surrogate.description for word in ("Norse", "snnTorch", "Yin"))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(CASES))
def test_gradient_matches_formula(name, backend):
    params, formula = CASES[name]
    neuron = flexsn_dsl.loads(_spec(name, params), backend=backend)
    x = torch.linspace(-3, 3, 24, dtype=torch.float64).reshape(4, 6).requires_grad_()
    spikes = neuron(x)
    assert torch.equal(spikes, (x.detach() >= THRESHOLD).to(x.dtype))  # the forward is Heaviside
    spikes.sum().backward()
    torch.testing.assert_close(x.grad, formula(x.detach() - THRESHOLD), rtol=1e-10, atol=1e-12)


def test_defaults_are_used_when_the_spec_gives_only_the_name():
    neuron = flexsn_dsl.loads(_spec("circ", {}).replace("{name: circ}", "circ"), backend="torch")
    x = torch.tensor([[THRESHOLD + 1.0]], dtype=torch.float64, requires_grad=True)
    neuron(x).sum().backward()
    assert x.grad.item() == pytest.approx(1 / 2 ** 1.5)  # alpha = 1: 1 / (1 + 1)^(3/2)


def test_unknown_parameter_is_a_spec_error():
    with pytest.raises(flexsn_dsl.SpecError, match="no parameter 'alfa'"):
        flexsn_dsl.loads(_spec("circ", {"alfa": 2.0}))
