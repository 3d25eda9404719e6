"""DelayLinear and Delay (language v4 §2) against the formula written as a literal torch loop in float64: values and
the gradients of x, weight, bias and delay (autograd of the loop), on both backends (Triton through its
interpreter on the CPU), fractional and whole steps, delays clamped at 0 and max_delay, streaming."""
from __future__ import annotations

import importlib.util
import math
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl.triton_runtime import interpreting

F64 = torch.float64
BACKENDS = ("torch", "triton")


def _past(x: torch.Tensor, t: int) -> torch.Tensor:
    """x[t], zero before the first step."""
    return x[t] if t >= 0 else torch.zeros_like(x[0])


def loop_linear(x, weight, delay, bias, max_delay):
    """y[t, b, j] = bias[j] + sum_i w[j,i] ((1 - f) x[t-k, b, i] + f x[t-k-1, b, i]), written out."""
    d = delay.clamp(0, max_delay)
    k = d.floor()
    f = d - k
    steps = []
    for t in range(x.shape[0]):
        outs = []
        for j in range(weight.shape[0]):
            acc = bias[j] + torch.zeros_like(x[0, :, 0]) if bias is not None else torch.zeros_like(x[0, :, 0])
            for i in range(weight.shape[1]):
                kk = int(k[j, i])
                acc = acc + weight[j, i] * ((1 - f[j, i]) * _past(x, t - kk)[:, i] + f[j, i] * _past(x, t - kk - 1)[:, i])
            outs.append(acc)
        steps.append(torch.stack(outs, -1))
    return torch.stack(steps)


def loop_channels(x, delay, max_delay):
    """y[t, b, c] = (1 - f) x[t-k, b, c] + f x[t-k-1, b, c] with x [T, B, C] and one delay per channel."""
    d = delay.clamp(0, max_delay)
    k = d.floor()
    f = d - k
    return torch.stack([torch.stack([(1 - f[c]) * _past(x, t - int(k[c]))[:, c] + f[c] * _past(x, t - int(k[c]) - 1)[:, c]
                                     for c in range(x.shape[2])], -1) for t in range(x.shape[0])])


def _layer(backend, delays, max_delay, bias=True, seed=0):
    torch.manual_seed(seed)
    layer = flexsn_dsl.DelayLinear(delays.shape[1], delays.shape[0], max_delay, bias=bias, dtype=F64, backend=backend)
    with torch.no_grad():
        layer.delay.copy_(delays)
    return layer


def _grads(y, inputs, seed=1):
    g = torch.randn(y.shape, dtype=F64, generator=torch.Generator().manual_seed(seed), device="cpu").to(y.device)
    return torch.autograd.grad(y, inputs, g)


def _close(a, b, tol=1e-12):
    assert a.shape == b.shape and torch.allclose(a, b, rtol=tol, atol=tol), (a - b).abs().max()


def _same_values_and_gradients(y, want, params):
    """``y`` equals ``want``, and so do their gradients with respect to each of ``params`` (the same upstream
    gradient)."""
    _close(y, want)
    for got, ref in zip(_grads(y, params), _grads(want, params)):
        _close(got, ref)


# fractional, whole steps, below 0 (clamped), above max_delay (clamped), exactly max_delay, 0
DELAYS = torch.tensor([[0.0, 1.0, 2.5, 3.0], [3.7, -1.0, 0.3, 2.0], [1.5, 0.25, 3.0, 0.999]], dtype=F64)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T", [6, 2])  # 2: shorter than most delays
def test_values_and_all_four_gradients_equal_the_loop(backend, T):
    layer = _layer(backend, DELAYS, 3.0)
    x = torch.randn(T, 2, 4, dtype=F64, requires_grad=True)
    y, want = layer(x), loop_linear(x, layer.weight, layer.delay, layer.bias, 3.0)
    _same_values_and_gradients(y, want, [x, layer.weight, layer.delay, layer.bias])


@pytest.mark.parametrize("backend", BACKENDS)
def test_the_delay_gradient_at_a_whole_step_looks_towards_the_longer_delay(backend):
    """d = 2 exactly: dy/dd = w (x[t-3] - x[t-2]); at max_delay too (and zero where the clamp holds)."""
    layer = _layer(backend, torch.tensor([[2.0, 3.0, 4.0]], dtype=F64), 3.0, bias=False)
    x = torch.randn(7, 1, 3, dtype=F64)
    (grad,) = torch.autograd.grad(layer(x).sum(), [layer.delay])
    w = layer.weight.detach()[0]
    for i, k in enumerate((2, 3)):
        want = w[i] * sum(_past(x, t - k - 1)[0, i] - _past(x, t - k)[0, i] for t in range(7))
        assert torch.allclose(grad[0, i], want, rtol=1e-12, atol=1e-12)
    assert grad[0, 2] == 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_whole_step_delays_shift_exactly(backend):
    """A whole-step delay d gives x[t - d] exactly, bit for bit (also in float32)."""
    layer = flexsn_dsl.DelayLinear(3, 3, 5, bias=False, backend=backend)
    with torch.no_grad():
        layer.weight.copy_(torch.eye(3))
        layer.delay.copy_(torch.tensor([0.0, 2.0, 5.0]).diag() + 1.5 * (1 - torch.eye(3)))
    x = torch.randn(8, 2, 3)
    y = layer(x)
    for i, d in enumerate((0, 2, 5)):
        # the off-diagonal synapses have weight 0 (and fractional delays): only x[t - d] of input i is left
        assert torch.equal(y[d:, :, i], x[:8 - d, :, i]) and torch.equal(y[:d, :, i], torch.zeros(d, 2))


@pytest.mark.parametrize("backend", BACKENDS)
def test_streaming_in_chunks_equals_one_call(backend):
    layer = _layer(backend, DELAYS, 3.0)
    x = torch.randn(9, 2, 4, dtype=F64, requires_grad=True)
    whole = layer(x)
    outs, h = [], None
    for lo, hi in ((0, 1), (1, 3), (3, 4), (4, 9)):
        y, h = layer(x[lo:hi], history=h, return_history=True)
        outs.append(y)
        assert h.shape == (4, 2, 4)  # floor(max_delay) + 1 steps
    chunked = torch.cat(outs)
    _same_values_and_gradients(chunked, whole, [x, layer.weight, layer.delay, layer.bias])


def test_triton_tiles_of_several_blocks_equal_the_torch_backend():
    """One more input, output and step than a tile of the linear kernels holds (and several batch rows, a
    history, delays clamped at both ends): every program's block indexes as the single-tile cases do."""
    from flexsn_dsl.delay_kernels import STEPS, SYNAPSES
    n, T = SYNAPSES + 1, STEPS + 1
    torch.manual_seed(5)
    delays = torch.rand(n, n, dtype=F64) * 7 - 0.5
    delays[0, :4] = torch.tensor([0.0, 3.0, 6.0, 6.5])
    torch_layer, triton_layer = _layer("torch", delays, 6.0), _layer("triton", delays, 6.0)
    x = torch.randn(T, 3, n, dtype=F64, requires_grad=True)
    history = torch.randn(7, 3, n, dtype=F64)
    y, want = (layer(x, history=history) for layer in (triton_layer, torch_layer))
    _close(y, want)
    for got, ref in zip(*(_grads(out, [x, layer.weight, layer.delay, layer.bias])
                          for out, layer in ((y, triton_layer), (want, torch_layer)))):
        _close(got, ref)


def _sparse(shape, density, seed):
    """Spikes (ones) and a few other values (negative, fractional) at about ``density`` of the entries."""
    g = torch.Generator().manual_seed(seed)
    keep = torch.rand(shape, generator=g, dtype=F64, device="cpu") < density
    values = torch.where(torch.rand(shape, generator=g, dtype=F64, device="cpu") < 0.7, 1.0,
                         torch.randn(shape, generator=g, dtype=F64, device="cpu"))
    return (values * keep).to(torch.get_default_device())


@pytest.fixture
def kernels_launched(monkeypatch):
    """The names of the linear delay kernels each call launches (the event kernels or the dense ones), in order:
    the forward and the tap gradients (the dense forward is ``_delayed_sum`` with SHIFT 1; with SHIFT -1 it is the
    input's gradient, not listed)."""
    from flexsn_dsl import delay_kernels
    launched = []
    for name in ("_delayed_sum", "_linear_grad_taps", "_linear_forward_events", "_linear_grad_taps_events"):
        kernel = getattr(delay_kernels, name)

        class Spy:
            def __getitem__(self, grid, kernel=kernel, name=name):
                def launch(*args, **kwargs):
                    if kwargs.get("SHIFT", 1) == 1:
                        launched.append("_linear_forward" if name == "_delayed_sum" else name)
                    return kernel[grid](*args, **kwargs)
                return launch
        monkeypatch.setattr(delay_kernels, name, Spy())
    return launched


def _thresholds(monkeypatch, forward: float, taps: float) -> None:
    """The input densities up to which the event forward and tap gradients run (for this test)."""
    from flexsn_dsl import delay_kernels
    monkeypatch.setattr(delay_kernels, "EVENT_FORWARD", forward)
    monkeypatch.setattr(delay_kernels, "EVENT_TAPS", taps)


def test_time_major_rows_hold_the_input_between_zeros():
    """The dense kernels' time-major copy: ``x [steps, B, n]`` as ``[B, n, W]``, ``x[s]`` at ``before + s`` and
    zeros elsewhere, written whole (its memory is not zeroed first); channels and steps past whole tiles."""
    from flexsn_dsl.delay_kernels import COPY_TILE, _time_major
    x = torch.randn(COPY_TILE + 3, 3, COPY_TILE + 5, dtype=F64)
    want = torch.zeros(3, COPY_TILE + 5, 2 * COPY_TILE + 9, dtype=F64)
    want[:, :, 4:4 + len(x)] = x.permute(1, 2, 0)
    assert torch.equal(_time_major(x, 4, want.shape[2]), want)


@pytest.mark.parametrize("asked", [(True, True), (True, False), (False, True)])
def test_events_are_listed_in_each_kernels_order(asked, monkeypatch):
    """The event kernels' lists: the nonzero entries of ``xs`` in the order of each kernel, as nonzero() of the
    permuted tensor lists them (the forward's (b, s, i), the tap gradients' (i, b, s)), and the first event of each
    group of the first two axes; their count is nonzero()'s. Inputs and steps span several listing programs, the
    last of each partly outside ``xs``; values of either sign and NaN are events. The counting and the listing
    programs walk their steps in tiles of their own (the listing's of one step, then of two)."""
    from flexsn_dsl import delay_kernels
    monkeypatch.setattr(delay_kernels, "LIST_INPUTS", 4)
    monkeypatch.setattr(delay_kernels, "COUNT_STEPS", 4)
    monkeypatch.setattr(delay_kernels, "LIST_CHUNK", 8)
    xs = _sparse((17, 3, 10), 0.3, 3) * torch.randn(17, 3, 10, dtype=F64)
    xs[4, 1, 9] = math.nan
    counts = delay_kernels.count_events(xs)
    assert counts.count == int(xs.count_nonzero()) > 0
    monkeypatch.setattr(delay_kernels, "LIST_STEPS", 1)
    one = delay_kernels.list_events(xs, counts, *asked)
    monkeypatch.setattr(delay_kernels, "LIST_STEPS", 2)
    lists = delay_kernels.list_events(xs, counts, *asked)
    for a, b in zip(one, lists):  # (tiles of one step and of two: the same lists)
        assert (a is None) == (b is None)
        if a is not None:
            assert all(torch.equal(u, v) for u, v in zip(a[:3], b[:3]))
            assert torch.equal(a.values.nan_to_num(7.0), b.values.nan_to_num(7.0))
    for wanted, listed, order in zip(asked, lists, ((1, 0, 2), (2, 1, 0))):
        if not wanted:
            assert listed is None
            continue
        moved = xs.permute(order)
        want = moved.nonzero()
        assert torch.equal(listed.second.long(), want[:, 1]) and torch.equal(listed.third.long(), want[:, 2])
        assert torch.equal(listed.values.nan_to_num(7.0), moved[tuple(want.T)].nan_to_num(7.0))
        groups = want[:, 0] * moved.shape[1] + want[:, 1]
        firsts = [int((groups < g).sum()) for g in range(moved.shape[0] * moved.shape[1] + 1)]
        assert listed.start.tolist() == firsts and listed.start.dtype == torch.int32 and listed.shape == xs.shape
    assert delay_kernels.count_events(xs[:0]).count == 0 == delay_kernels.count_events(torch.zeros(3, 2, 5)).count


def test_event_kernels_are_chosen_per_kernel_by_density_and_reach(monkeypatch):
    """The forward's events where density x (1 + EVENT_READ (EVENT_STEPS + reach) / EVENT_STEPS) is at most
    EVENT_FORWARD and the batch gives the event forward EVENT_PROGRAMS programs, the tap gradients' where the
    density is at most EVENT_TAPS: one count of an input with exactly 1 % ones."""
    from flexsn_dsl import delay_kernels
    monkeypatch.setattr(delay_kernels, "EVENT_READ", 0.5)
    _thresholds(monkeypatch, 0.021, 0.05)
    x = torch.zeros(50, 4, 10)
    x.view(-1)[::100] = 1.0  # (20 of 2,000)
    steps = delay_kernels.EVENT_STEPS
    many = (steps + 1, delay_kernels.EVENT_PROGRAMS // 8 * delay_kernels.EVENT_OUTPUTS)  # (4 x 16 x 2 programs)
    monkeypatch.setattr(delay_kernels, "_chosen", type(delay_kernels._chosen)())
    assert delay_kernels.event_kernels(x, steps // 4, *many, 0)[:2] == (True, True)  # 0.01 (1 + 0.5 x 1.25) = 0.01625
    assert delay_kernels.event_kernels(x, 2 * steps, *many, 0)[:2] == (False, True)  # 0.01 x (1 + 0.5 x 3) = 0.025
    assert delay_kernels.event_kernels(x, steps // 4, steps, many[1], 0)[:2] == (False, True)  # (half the programs)
    _thresholds(monkeypatch, 0.021, 0.005)
    choice = delay_kernels.event_kernels(x, 1, *many, 0)
    assert choice[:2] == (True, False) and choice.counts.count == 20
    _thresholds(monkeypatch, 0.0, 0.0)
    assert delay_kernels.event_kernels(torch.zeros(3, 2, 2), 1, *many, 0) == (False, False, None)


@pytest.mark.parametrize("T", [6, 2])
def test_event_kernels_values_and_gradients_equal_the_loop(T, kernels_launched, monkeypatch):
    """Sparse inputs take the event kernels (the forward and the weight and delay gradients; the input's gradient
    stays dense): equal to the loop, values and all four gradients, with a history in front."""
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)  # (the event forward on a batch of two)
    layer = _layer("triton", DELAYS, 3.0)
    history, x = _sparse((4, 2, 4), 0.3, 7), _sparse((T, 2, 4), 0.3, 8).requires_grad_()
    y = layer(x, history=history)
    want = loop_linear(torch.cat([history, x]), layer.weight, layer.delay, layer.bias, 3.0)[4:]
    _same_values_and_gradients(y, want, [x, layer.weight, layer.delay, layer.bias])
    assert kernels_launched == ["_linear_forward_events", "_linear_grad_taps_events"]
    assert 0 < torch.count_nonzero(x) < x.numel() / 2


def _fresh_choices(monkeypatch) -> list[bool]:
    """No eager choice of kernels seen before this test (what a captured call follows), and the ``read`` of each
    count of events made from here on."""
    from flexsn_dsl import delay_kernels
    monkeypatch.setattr(delay_kernels, "_chosen", type(delay_kernels._chosen)())
    count, reads = delay_kernels.count_events, []

    def counted(xs, read=True):
        reads.append(read)
        return count(xs, read)
    monkeypatch.setattr(delay_kernels, "count_events", counted)
    return reads


def test_a_captured_call_follows_the_layers_last_eager_choice(kernels_launched, monkeypatch):
    """A call inside a CUDA graph capture cannot wait for the count of its events: it takes the kernels that the
    layer's last eager call on an input of its shape took (the capture's warm-up), without a warning, and lists its
    events without reading their number back, in lists with room for every entry. So an input denser at replay
    than at the warm-up still gives the loop's values and gradients, on the event kernels, and so does a layer whose
    weight was replaced since. A layer whose warm-up input was dense stays dense; a shape seen by no eager call is
    dense too (next test)."""
    import warnings
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 0.5, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)
    reads = _fresh_choices(monkeypatch)
    sparse, dense = _layer("triton", DELAYS, 3.0), _layer("triton", DELAYS, 3.0, seed=1)
    sparse(_sparse((6, 2, 4), 0.3, 8))  # the warm-ups: event kernels and dense ones
    dense(_sparse((6, 2, 4), 0.9, 9))
    assert kernels_launched == ["_linear_forward_events", "_linear_forward"] and reads == [True, True]
    sparse.weight = torch.nn.Parameter(sparse.weight.detach().clone())  # (moved: the choice is the layer's)
    monkeypatch.setattr(delay_kernels, "_capturing", lambda xs: True)
    x = _sparse((6, 2, 4), 0.9, 10).requires_grad_()  # (denser than the warm-up's)
    for layer, kernels, read in ((sparse, ["_linear_forward_events", "_linear_grad_taps_events"], [False]),
                                 (dense, ["_linear_forward", "_linear_grad_taps"], [])):
        kernels_launched.clear()
        reads.clear()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            y = layer(x)
            _same_values_and_gradients(y, loop_linear(x, layer.weight, layer.delay, layer.bias, 3.0),
                                       [x, layer.weight, layer.delay, layer.bias])
        assert kernels_launched == kernels and reads == read


def test_a_captured_call_without_an_eager_one_takes_the_dense_kernels_and_says_why(kernels_launched, monkeypatch):
    """A layer captured with no eager call on an input of that shape before it (no warm-up, or another shape: the
    choice is per layer and shape) runs the dense kernels, equal to the loop, and warns that a warm-up lets sparse
    inputs take the event kernels."""
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)
    _fresh_choices(monkeypatch)
    warmed, layer = _layer("triton", DELAYS, 3.0), _layer("triton", DELAYS, 3.0, seed=1)
    warmed(_sparse((6, 2, 4), 0.3, 8))  # (another layer, and another shape)
    warmed(_sparse((5, 2, 4), 0.3, 8))
    monkeypatch.setattr(delay_kernels, "_capturing", lambda xs: True)
    x = _sparse((6, 2, 4), 0.3, 8).requires_grad_()
    kernels_launched.clear()
    for call in (layer, lambda x: warmed(torch.cat([x, x]))):
        with pytest.warns(UserWarning, match="without an eager call on an input of this shape.*Warm the step") as seen:
            y = call(x)
        assert [Path(w.filename).name for w in seen] == ["delays.py"]  # (the layer's call)
    _same_values_and_gradients(y, loop_linear(torch.cat([x, x]), warmed.weight, warmed.delay, warmed.bias, 3.0),
                               [x, warmed.weight, warmed.delay, warmed.bias])
    assert kernels_launched == ["_linear_forward", "_linear_forward", "_linear_grad_taps"]


def test_the_eager_choices_kept_are_bounded(monkeypatch):
    """The choices kept for captured calls (one per layer and input shape) are the newest CHOICES_KEPT."""
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(delay_kernels, "CHOICES_KEPT", 2)
    _fresh_choices(monkeypatch)
    for steps in (3, 4, 5, 4):
        delay_kernels.event_kernels(torch.zeros(steps, 2, 2), 1, steps, 8, 7)
    assert [key[1][0] for key in delay_kernels._chosen] == [5, 4]


def test_a_step_at_a_time_on_the_event_kernels_leaves_the_bias_alone(kernels_launched, monkeypatch):
    """One step of one sample a call (the event forward starts its output from the bias, here a view of it would
    be [1, 1, J]): the calls give the loop's steps, and the bias is never written."""
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)
    layer = _layer("triton", DELAYS, 3.0)
    bias = layer.bias.detach().clone()
    x = _sparse((6, 1, 4), 0.5, 3)
    outs, h = [], None
    for t in range(len(x)):
        y, h = layer(x[t:t + 1], history=h, return_history=True)
        outs.append(y.detach())
    assert "_linear_forward_events" in kernels_launched and torch.equal(layer.bias.detach(), bias)
    _close(torch.cat(outs), loop_linear(x, layer.weight, layer.delay, layer.bias, 3.0).detach())


@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(),
                    reason="CUDA graphs need a CUDA GPU and compiled Triton kernels (not the interpreter)")
def test_a_cuda_graph_replays_the_eager_values_and_gradients(kernels_launched, monkeypatch):
    """A DelayLinear call and its backward captured in a CUDA graph after an eager warm-up on a sparse input take the
    event kernels, as the warm-up did, without a warning, and replay the eager call's output and gradients for new
    inputs copied into the captured one: sparse ones, and one denser than the event kernels' thresholds."""
    import warnings
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 0.5, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)  # (the event forward on a small batch)
    torch.manual_seed(0)
    layer = flexsn_dsl.DelayLinear(24, 8, 6.0, device="cuda")
    params = [layer.weight, layer.delay, layer.bias]
    inputs = [((torch.rand(20, 4, 24, device="cuda") < density).float(), torch.randn(20, 4, 8, device="cuda"))
              for density in (0.05, 0.05, 0.9, 0.02)]
    eager = []
    for x, g in inputs:
        y = layer(x)
        eager.append((y.detach(), *torch.autograd.grad(y, params, g)))
    del y  # no autograd graph of an eager call may outlive it: its nodes would tie the capture to their streams
    x, g = (t.clone() for t in inputs[0])
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        torch.autograd.grad(layer(x), params, g)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    kernels_launched.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.cuda.graph(graph):
            y = layer(x)
            captured = (y, *torch.autograd.grad(y, params, g))
    assert kernels_launched == ["_linear_forward_events", "_linear_grad_taps_events"]
    for (new_x, new_g), want in zip(inputs[::-1], eager[::-1]):
        x.copy_(new_x)
        g.copy_(new_g)
        graph.replay()
        for got, ref in zip(captured, want):
            torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("backend, compiler", [("torch", "aot_eager"), ("triton", "inductor")])
def test_a_compiled_network_is_one_graph_with_the_eager_values_and_gradients(backend, compiler, kernels_launched,
                                                                             monkeypatch, fresh_dynamo):
    """torch.compile(fullgraph=True) of DelayLinear -> LIF -> Delay (learnable) -> DelayLinear (fixed delays, no
    bias) on an input that is not contiguous: the delay layers are operators the graph holds whole, and the compiled
    network gives the eager one's output and the gradients of its input and of every parameter. Inside the graph
    each call still chooses its kernels when it runs: the same ones as eagerly (the event kernels here, the
    backward listing the events again)."""
    from flexsn_dsl import delay_kernels
    _thresholds(monkeypatch, 1.0, 0.5)
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)
    torch.manual_seed(0)
    net = torch.nn.Sequential(
        flexsn_dsl.DelayLinear(12, 6, 3.5, backend=backend),
        flexsn_dsl.load(Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml", backend=backend),
        flexsn_dsl.Delay(torch.rand(6, device="cpu") * 3, learnable=True, max_delay=3.0, backend=backend),
        flexsn_dsl.DelayLinear(6, 4, 2.0, bias=False, learn_delay=False, backend=backend),
    ).double().to(torch.get_default_device())
    with torch.no_grad():
        net[0].weight.abs_().mul_(4)
    leaf = (2 * _sparse((3, 10, 12), 0.2, 5)).requires_grad_()
    x = leaf.transpose(0, 1)
    params = [leaf, *net.parameters()]
    compiled = torch.compile(net, fullgraph=True, backend=compiler)
    runs, launches = [], []
    for call in (net, compiled):
        flexsn_dsl.reset_net(net)
        kernels_launched.clear()
        y = call(x)
        runs.append((y, *_grads(y, params)))
        launches.append(list(kernels_launched))
    assert 0 < int((runs[0][0] != 0).sum()) and len(runs[0]) == 1 + 1 + 5
    for got, want in zip(*runs):
        _close(got, want)
    assert launches[1] == launches[0]
    if backend == "triton":
        assert {"_linear_forward_events", "_linear_grad_taps_events"} <= set(launches[0])


def _saved_pointers(run):
    """``run()``'s result and the data pointers of the tensors its graph saved for the backward."""
    packed = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.data_ptr()) or t, lambda t: t):
        return run(), packed


def test_a_sparse_input_is_kept_as_its_events_and_the_hidden_spikes_by_nothing(monkeypatch):
    """Where the tap gradients take events, the layer keeps the input's events for the backward, not the input;
    nothing of it where only the input's gradient is wanted; the input itself where the taps are dense. In
    DelayLinear -> LIF -> DelayLinear, the hidden layer's spikes are then saved by neither the LIF (its backward
    reads its saved h) nor the next layer, and the gradients still equal the torch backend's."""
    _thresholds(monkeypatch, 0.5, 0.5)
    x = _sparse((6, 2, 4), 0.2, 5)
    layer = _layer("triton", DELAYS, 3.0)
    _, packed = _saved_pointers(lambda: layer(x))
    assert x.data_ptr() not in packed and len(packed) == 6  # (the by-input list: 4, weight, delay)
    layer.requires_grad_(False)
    leaf = x.clone().requires_grad_()  # (the input's gradient only)
    _, packed = _saved_pointers(lambda: layer(leaf))
    assert leaf.data_ptr() not in packed and len(packed) == 2
    layer.requires_grad_(True)
    _thresholds(monkeypatch, 0.0, 0.0)
    _, packed = _saved_pointers(lambda: layer(x))
    assert x.data_ptr() in packed
    _thresholds(monkeypatch, 0.5, 0.5)

    def network(backend):
        torch.manual_seed(4)
        first, second = (flexsn_dsl.DelayLinear(n, m, 3.0, dtype=F64, backend=backend) for n, m in ((4, 5), (5, 3)))
        neuron = flexsn_dsl.load(Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml", backend=backend)
        with torch.no_grad():
            first.weight.abs_().mul_(8)
        spikes = []
        y, packed = _saved_pointers(lambda: second(spikes.append(neuron.double()(first(x))) or spikes[0]))
        return spikes[0], y, packed, [first.weight, first.delay, second.weight, second.delay]

    spikes, y, packed, params = network("triton")
    assert 0 < int(spikes.count_nonzero()) < spikes.numel() / 2 and spikes.data_ptr() not in packed
    _, want, _, want_params = network("torch")
    _close(y, want)
    for got, ref in zip(_grads(y, params), _grads(want, want_params)):
        _close(got, ref)


def test_event_kernels_over_blocks_equal_the_torch_backend(kernels_launched, monkeypatch):
    """More outputs than an event program's block, delays clamped at both ends, a history, input spikes below the
    default density threshold: equal to the torch backend. The batch of three gives the event forward fewer
    programs than it asks for, so the forward is dense there and the tap gradients are events; a dense input in
    the same layer takes the dense kernels. The event forward's blocks of steps are shorter than the delays and
    the history, so that an event reaches the steps of several blocks, and the tap gradients sum partial sums
    of blocks of batch rows."""
    from flexsn_dsl import delay_kernels
    for blocks in ("EVENT_SYNAPSES", "EVENT_OUTPUTS"):  # (blocks of 16 outputs: fewer interpreted programs)
        monkeypatch.setattr(delay_kernels, blocks, 16)
    monkeypatch.setattr(delay_kernels, "EVENT_STEPS", 8)  # (delays up to 8, 9 steps of history)
    monkeypatch.setattr(delay_kernels, "EVENT_ROWS", 2)  # (a batch of three: a block of two and a block of one)
    J, I, T = delay_kernels.EVENT_SYNAPSES + 1, 40, 30
    torch.manual_seed(6)
    delays = torch.rand(J, I, dtype=F64) * 9 - 1
    delays[0, :3] = torch.tensor([0.0, 8.0, 7.5])
    torch_layer, triton_layer = _layer("torch", delays, 8.0), _layer("triton", delays, 8.0)
    density = delay_kernels.EVENT_FORWARD / (1 + delay_kernels.EVENT_READ * (8 + 9) / 8) / 2  # (at reach 9)
    history, x = _sparse((9, 3, I), density, 9), _sparse((T, 3, I), density, 10)
    want = torch_layer(x, history=history)
    ref = _grads(want, [torch_layer.weight, torch_layer.delay, torch_layer.bias])
    for programs in (delay_kernels.EVENT_PROGRAMS, 1):
        monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", programs)
        y = triton_layer(x, history=history)
        _close(y, want)
        for got, r in zip(_grads(y, [triton_layer.weight, triton_layer.delay, triton_layer.bias]), ref):
            _close(got, r)
    assert kernels_launched == ["_linear_forward", "_linear_grad_taps_events",
                                "_linear_forward_events", "_linear_grad_taps_events"] and x.count_nonzero() > 5
    triton_layer(torch.randn(T, 3, I, dtype=F64))
    assert kernels_launched[-1] == "_linear_forward"


def test_event_kernels_in_float32_and_without_events(kernels_launched, monkeypatch):
    """float32: the event kernels equal the dense ones to float32's rounding; an input with no event gives the bias
    and zero weight and delay gradients without a kernel; a threshold of 0 takes the dense kernels even then."""
    from flexsn_dsl import delay_kernels
    monkeypatch.setattr(delay_kernels, "EVENT_PROGRAMS", 1)
    torch.manual_seed(2)
    layer = flexsn_dsl.DelayLinear(30, 20, 6.0, backend="triton")
    x = _sparse((25, 2, 30), 0.01, 11).float()
    outs = []
    for density in (0.02, 0.0):
        _thresholds(monkeypatch, density, density)
        y = layer(x)
        outs.append((y, *torch.autograd.grad(y, [layer.weight, layer.delay], torch.ones_like(y))))
    for got, want in zip(*outs):
        assert got.dtype == torch.float32 and torch.allclose(got, want, rtol=1e-5, atol=1e-5)
    assert kernels_launched == ["_linear_forward_events", "_linear_grad_taps_events",
                                "_linear_forward", "_linear_grad_taps"]
    _thresholds(monkeypatch, 0.02, 0.02)
    y = layer(torch.zeros(5, 2, 30))
    gw, gd = torch.autograd.grad(y, [layer.weight, layer.delay], torch.ones_like(y))
    assert torch.equal(y, layer.bias.detach().expand(5, 2, 20)) and not gw.any() and not gd.any()
    assert len(kernels_launched) == 4
    _thresholds(monkeypatch, 0.0, 0.0)
    layer(torch.zeros(5, 2, 30))
    assert kernels_launched[-1] == "_linear_forward"


@pytest.mark.parametrize("backend", BACKENDS)
def test_unbatched_input(backend):
    layer = _layer(backend, DELAYS, 3.0)
    x = torch.randn(5, 4, dtype=F64)
    y, h = layer(x, return_history=True)
    assert y.shape == (5, 3) and h.shape == (4, 4)
    _close(y, layer(x[:, None])[:, 0])
    y2 = layer(x, history=h)
    _close(y2, layer(torch.cat([x, x]))[5:])


def test_parameters_and_initialisation():
    torch.manual_seed(3)
    layer = flexsn_dsl.DelayLinear(5, 4, 7.5)
    torch.manual_seed(3)
    linear = nn.Linear(5, 4)
    assert torch.equal(layer.weight, linear.weight) and torch.equal(layer.bias, linear.bias)
    assert {n for n, _ in layer.named_parameters()} == {"weight", "delay", "bias"}
    assert layer.delay.shape == (4, 5) and layer.delay.min() >= 0 and layer.delay.max() <= 7.5
    assert (layer.delay != layer.delay.round()).any()
    zero = flexsn_dsl.DelayLinear(5, 4, 7.5, delay_init="zero", bias=False)
    assert torch.equal(zero.delay, torch.zeros(4, 5)) and zero.bias is None
    fixed = flexsn_dsl.DelayLinear(50, 40, 3, learn_delay=False, dtype=F64)
    assert "delay" in dict(fixed.named_buffers()) and "delay" not in dict(fixed.named_parameters())
    assert torch.equal(fixed.delay, fixed.delay.round()) and set(fixed.delay.unique().tolist()) == {0, 1, 2, 3}
    assert fixed.delay.dtype == F64 and fixed.weight.dtype == F64
    with pytest.raises(ValueError, match="delay_init"):
        flexsn_dsl.DelayLinear(2, 2, 3, delay_init="normal")


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_delays_train_the_weights_only(backend):
    torch.manual_seed(4)
    layer = flexsn_dsl.DelayLinear(3, 2, 4, learn_delay=False, dtype=F64, backend=backend)
    x = torch.randn(6, 2, 3, dtype=F64)
    y = layer(x)
    _close(y, loop_linear(x, layer.weight, layer.delay, layer.bias, 4))
    y.sum().backward()
    assert layer.weight.grad is not None and layer.delay.grad is None


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_delays_rounds_in_place_to_whole_steps(backend):
    layer = _layer(backend, DELAYS, 3.0)
    assert layer.round_delays_() is layer
    assert torch.equal(layer.delay, DELAYS.clamp(0, 3).round())
    x = torch.randn(6, 2, 4, dtype=F64)
    _close(layer(x), loop_linear(x, layer.weight, layer.delay, layer.bias, 3.0))


@pytest.mark.parametrize("backend", BACKENDS)
def test_rounding_under_a_fractional_max_delay_gives_whole_steps(backend):
    """With max_delay 2.5, a delay of 2.5 or more rounds to 2, not to 3 (which the forward would clamp back to
    2.5, a fraction again); fixed delays per channel likewise, and their streaming reaches back far enough."""
    layer = _layer(backend, DELAYS, 2.5).round_delays_()
    assert torch.equal(layer.delay, torch.tensor([[0.0, 1.0, 2.0, 2.0], [2.0, 0.0, 0.0, 2.0], [2.0, 0.0, 2.0, 1.0]],
                                                 dtype=F64))
    x = torch.randn(6, 2, 4, dtype=F64)
    _close(layer(x), loop_linear(x, layer.weight, layer.delay, layer.bias, 2.5))
    fixed = flexsn_dsl.Delay([1.5, 3.0, 0.4], max_delay=1.5, backend=backend)
    assert torch.equal(fixed.delay, torch.tensor([1.0, 1.0, 0.0]))
    x = torch.randn(5, 2, 3)
    y = fixed(x)
    assert torch.equal(y[1:, :, :2], x[:4, :, :2]) and not y[0, :, :2].any() and torch.equal(y[:, :, 2], x[:, :, 2])
    y1, h = fixed(x[:2], return_history=True)
    assert torch.equal(torch.cat([y1, fixed(x[2:], history=h)]), y)


def test_shape_errors():
    layer = flexsn_dsl.DelayLinear(3, 2, 4)
    with pytest.raises(ValueError, match=r"x must be \[T, B, 3\]"):
        layer(torch.zeros(4, 2, 5))
    with pytest.raises(ValueError, match=r"history must have shape \[5, 2, 3\]"):
        layer(torch.zeros(4, 2, 3), history=torch.zeros(4, 2, 3))
    with pytest.raises(ValueError, match=r"delays \[2\] do not broadcast to x's channels \[2, 3\].*\[C, 1, 1\]"):
        flexsn_dsl.Delay([1.0, 2.0])(torch.zeros(4, 1, 2, 3))


CHANNEL_DELAYS = torch.tensor([0.0, 1.3, 2.0, 4.5, -0.5, 4.0], dtype=F64)


@pytest.mark.parametrize("backend", BACKENDS)
def test_delay_per_channel_learnable(backend):
    """[T, B, 2, 3]: one delay per channel, values and gradients as the loop; streaming."""
    delay = flexsn_dsl.Delay(CHANNEL_DELAYS.reshape(2, 3), learnable=True, max_delay=4.0, backend=backend)
    assert isinstance(delay.delay, nn.Parameter)
    x = torch.randn(5, 2, 2, 3, dtype=F64, requires_grad=True)
    y = delay(x)
    want = loop_channels(x.reshape(5, 2, 6), delay.delay.reshape(6), 4.0).reshape(5, 2, 2, 3)
    _same_values_and_gradients(y, want, [x, delay.delay])
    y1, h = delay(x[:2], return_history=True)
    _close(torch.cat([y1, delay(x[2:], history=h)]), y)


@pytest.mark.parametrize("backend", BACKENDS)
def test_fixed_delays_per_channel_are_whole_steps(backend):
    delay = flexsn_dsl.Delay([0.0, 1.4, 2.6, 3.0], backend=backend)
    assert "delay" in dict(delay.named_buffers()) and torch.equal(delay.delay, torch.tensor([0.0, 1.0, 3.0, 3.0]))
    x = torch.randn(6, 2, 4)
    y = delay(x)
    for c, d in enumerate((0, 1, 3, 3)):
        assert torch.equal(y[d:, :, c], x[:6 - d, :, c]) and not y[:d, :, c].any()
    y1, h = delay(x[:1], return_history=True)
    assert h.shape == (3, 2, 4) and torch.equal(torch.cat([y1, delay(x[1:], history=h)]), y)


def test_nir_delays_import_to_delay_and_export_from_it():
    nir = pytest.importorskip("nir")
    import numpy as np
    graph = nir.NIRGraph.from_list(nir.Delay(delay=np.array([0.0, 2e-3, 1e-3 + 1e-13])))
    net = flexsn_dsl.from_nir(graph, dt=1e-3)
    (delay,) = [m for m in net.modules() if isinstance(m, flexsn_dsl.Delay)]
    assert torch.equal(delay.delay, torch.tensor([0.0, 2.0, 1.0]))
    back = flexsn_dsl.to_nir(nn.Sequential(flexsn_dsl.Delay([3.0, 0.0])), torch.zeros(4, 1, 2), dt=0.5)
    (node,) = [n for n in back.nodes.values() if isinstance(n, nir.Delay)]
    assert node.delay.tolist() == [1.5, 0.0]
    # float32 delays written in float64 (3 steps of 1 ms, not 3.0000001 ms), so that they read back
    back = flexsn_dsl.to_nir(nn.Sequential(flexsn_dsl.Delay([0.0, 2.0, 3.0])), torch.zeros(4, 1, 3), dt=1e-3)
    (node,) = [n for n in back.nodes.values() if isinstance(n, nir.Delay)]
    assert node.delay.dtype == np.float64 and node.delay.tolist() == [0.0, 2e-3, 3e-3]
    (again,) = [m for m in flexsn_dsl.from_nir(back, dt=1e-3).modules() if isinstance(m, flexsn_dsl.Delay)]
    assert torch.equal(again.delay, torch.tensor([0.0, 2.0, 3.0]))
    with pytest.raises(flexsn_dsl.NIRError, match="node 'delay'.*whole multiples of dt"):
        flexsn_dsl.from_nir(nir.NIRGraph.from_list(nir.Delay(delay=np.array([1e-3 + 1e-11]))), dt=1e-3)


def test_a_delay_linear_of_whole_steps_exports_as_the_same_sum():
    nir = pytest.importorskip("nir")
    layer = _layer("torch", DELAYS, 3.0)
    x = torch.randn(7, 2, 4, dtype=F64)
    with pytest.raises(flexsn_dsl.NIRError, match=r"fractional delays.*round_delays_\(\)"):
        flexsn_dsl.to_nir(nn.Sequential(layer), x, dt=1e-3)
    layer.round_delays_()
    with torch.no_grad():  # values a float32 network (from_nir's) holds exactly
        layer.weight.copy_(layer.weight.float())
        layer.bias.copy_(layer.bias.float())
    graph = flexsn_dsl.to_nir(nn.Sequential(layer), x, dt=1e-3)
    (sub,) = [n for n in graph.nodes.values() if isinstance(n, nir.NIRGraph)]
    assert sorted(float(n.delay[0]) for n in sub.nodes.values() if isinstance(n, nir.Delay)) == [1e-3, 2e-3, 3e-3]
    back = flexsn_dsl.from_nir(graph, dt=1e-3).to(F64)
    _close(back(x), layer(x))


def test_dense_kernels_cost_one_load_and_a_few_instructions_a_synapse_step():
    """DelayLinear's dense kernels compiled for sm_90 and read by nvdisasm (``benchmarks/isa_count.py --delays``):
    each loaded input serves both taps, so a synapse-step (two fmas) takes about one load and under 6 (forward,
    input's gradient) or 7 (taps' gradients) instructions, without spilling. Before the shared loads, unmasked
    padded rows and the taps' single row, the same count was 24, 28 and 19 instructions with 2.4 to 5.4 loads."""
    root = Path(__file__).resolve().parents[1]
    tools = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin"
    if not list(tools.glob("nvdisasm")):
        pytest.skip("this Triton has no CUDA backend tools")
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "isa_count.py"), "--delays"], capture_output=True,
                         text=True, cwd=root, env={**os.environ, "PYTHONPATH": str(root)})
    rows = re.findall(r"(\S+):\s+([0-9.]+) instructions, ([0-9.]+) loads per synapse-step; \d+ registers, "
                      r"(\d+) B stack", run.stdout)
    assert [r[0] for r in rows] == ["forward", "gradient", "gradients"], run.stdout + run.stderr[-2000:]
    for (_, instructions, loads, stack), most in zip(rows, (6, 6, 7)):
        assert float(instructions) < most and float(loads) < 1.5 and stack == "0", run.stdout
