"""flexsn_dsl.PerStep (time folded into the batch) against the same layers looped over the steps by hand."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn

import flexsn_dsl

DTYPE = torch.float64
LIF = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"


def test_the_layers_on_every_step_equal_a_loop_over_the_steps():
    torch.manual_seed(0)
    conv, fc = nn.Conv2d(3, 4, 3, padding=1).to(DTYPE), nn.Linear(4 * 2 * 2, 5).to(DTYPE)
    m = flexsn_dsl.PerStep(conv, nn.AvgPool2d(2), nn.Flatten(), fc)
    x = torch.randn(6, 2, 3, 4, 4, dtype=DTYPE, requires_grad=True)
    y = m(x)
    looped = torch.stack([fc(nn.functional.avg_pool2d(conv(x[t]), 2).flatten(1)) for t in range(x.shape[0])])
    assert y.shape == (6, 2, 5)
    torch.testing.assert_close(y, looped, rtol=1e-12, atol=1e-12)
    g = torch.randn_like(y)
    wrt = (x, conv.weight, conv.bias, fc.weight)
    for got, want in zip(torch.autograd.grad(y, wrt, g), torch.autograd.grad(looped, wrt, g)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_batchnorm_normalises_over_every_step_and_batch_row():
    """In training, the statistics are those of all T*B rows (SpikingJelly's SeqToANNContainer does the same)."""
    torch.manual_seed(1)
    bn = nn.BatchNorm2d(3, momentum=0.5).to(DTYPE)
    with torch.no_grad():
        bn.weight.uniform_(0.5, 2.0)
        bn.bias.uniform_(-1.0, 1.0)
    x = 3.0 * torch.randn(5, 4, 3, 2, 2, dtype=DTYPE) + 1.0
    y = flexsn_dsl.PerStep(bn)(x)
    dims = (0, 1, 3, 4)  # all but the channel
    mean, var = x.mean(dims, keepdim=True), x.var(dims, unbiased=False, keepdim=True)
    want = (x - mean) / torch.sqrt(var + bn.eps) * bn.weight.view(3, 1, 1) + bn.bias.view(3, 1, 1)
    torch.testing.assert_close(y, want, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bn.running_mean, 0.5 * mean.flatten(), rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(bn.running_var, 0.5 + 0.5 * x.var(dims, unbiased=True), rtol=1e-12, atol=1e-12)


def test_one_layer_is_kept_as_it_is_several_in_a_sequential():
    conv, pool = nn.Conv2d(1, 2, 3), nn.MaxPool2d(2)
    assert flexsn_dsl.PerStep(conv).layer is conv
    assert list(flexsn_dsl.PerStep(nn.Conv2d(1, 2, 3)).state_dict()) == ["layer.weight", "layer.bias"]
    both = flexsn_dsl.PerStep(conv, pool).layer
    assert isinstance(both, nn.Sequential) and list(both) == [conv, pool]
    with pytest.raises(TypeError, match="at least one layer"):
        flexsn_dsl.PerStep()


def _spiking_net() -> nn.Sequential:
    net = nn.Sequential(flexsn_dsl.PerStep(nn.Linear(5, 6)), flexsn_dsl.load(LIF, backend="torch"),
                         flexsn_dsl.PerStep(nn.Linear(6, 4)), flexsn_dsl.load(LIF, backend="torch")).double()
    with torch.no_grad():  # positive weights: both layers spike
        for layer in (net[0].layer, net[2].layer):
            layer.weight.uniform_(0.1, 0.6)
    return net


def test_reset_net_resets_every_neuron_like_a_fresh_network():
    torch.manual_seed(0)
    net = _spiking_net()
    fresh = copy.deepcopy(net)  # never run: every neuron at rest
    x1, x2 = (torch.rand(7, 3, 5, dtype=torch.float64) * 4 for _ in range(2))
    net(x1)
    carried = net(x2)
    from_rest = fresh(x2)
    assert not torch.equal(carried, from_rest)  # the states carried from x1 change the output
    assert flexsn_dsl.reset_net(net) == 2
    assert torch.equal(net(x2), from_rest)


def test_reset_net_visits_the_neurons_of_net_modules_once_each():
    shared, nested, top = (flexsn_dsl.load(LIF, backend="torch") for _ in range(3))
    inner = nn.Sequential(nn.Linear(3, 3), nested)
    inner.register_module("missing", None)  # a None submodule, skipped as modules() skips it
    net = nn.Sequential(shared, inner, nn.ModuleList([shared, nn.ReLU()]), top)
    x = torch.rand(2, 3)
    for m in (shared, nested, top):
        m(x)
    from flexsn_dsl.runtime import _neurons
    assert _neurons(net) == [m for m in net.modules() if isinstance(m, flexsn_dsl.FlexSN)] == [shared, nested, top]
    assert flexsn_dsl.reset_net(net) == 3
    assert all(m.states == {} for m in (shared, nested, top))
    assert flexsn_dsl.reset_net(top) == 1  # a neuron on its own


def test_detach_net_cuts_the_graph_of_earlier_calls_but_keeps_the_states():
    torch.manual_seed(1)
    net = _spiking_net()
    whole = copy.deepcopy(net)  # the same calls without the cut
    x1 = (torch.rand(7, 3, 5, dtype=torch.float64) * 4).requires_grad_()
    x2 = torch.rand(7, 3, 5, dtype=torch.float64) * 4
    net(x1)
    assert flexsn_dsl.detach_net(net) == 2
    y = net(x2)
    whole(x1)
    y_whole = whole(x2)
    assert torch.equal(y, y_whole)  # same values: the states were kept
    y_whole.sum().backward()
    assert x1.grad is not None and x1.grad.abs().sum() > 0  # without the cut the gradient reaches x1
    x1.grad = None
    y.sum().backward()
    assert x1.grad is None  # with it, nothing reaches the earlier call's input
