"""The passes of the delay layers (:mod:`flexsn_dsl.delays`) on either backend, and their eager autograd Functions.

A pass takes ``xs [P + T, B, ...]`` (``P`` steps of history first) and the layer's parameters, and gives the outputs
or the gradients. :class:`DelayLinearFunction` and :class:`DelayFunction` call them in an eager call;
:mod:`flexsn_dsl.delay_operators` calls the same passes as the operators a compiled network calls. The Triton
kernels are :mod:`flexsn_dsl.delay_kernels`' (imported on first use); the torch backend sums one matrix product
per distinct delay. Nothing either keeps for the backward grows with ``max_delay``."""
from __future__ import annotations

import math
from typing import Any

import torch
from torch.autograd.function import once_differentiable

__all__ = ["DelayFunction", "DelayLinearFunction", "channel_backward", "channel_forward", "linear_backward",
           "linear_forward", "taps_source"]

_WIDE = (torch.float16, torch.bfloat16)  # computed in float32 by the kernels


def _work(dtype: torch.dtype) -> torch.dtype:
    """The dtype the kernels compute a call of ``dtype`` in."""
    return torch.float32 if dtype in _WIDE else dtype


def _kernels() -> Any:
    from . import delay_kernels
    return delay_kernels


def _split(delay: torch.Tensor, max_delay: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(k, f, inside)``: whole steps and fraction of the clamped delay, and where the clamp passes gradients."""
    d = delay.detach().clamp(0, max_delay)
    k = d.floor()
    inside = (delay.detach() >= 0) & (delay.detach() <= max_delay)
    return k, d - k, inside


def _shifted(xs: torch.Tensor, s: int, P: int, T: int) -> torch.Tensor:
    """``xs[P - s + t]`` for ``t < T`` (zero where the index is negative)."""
    start = P - s
    if start >= 0:
        return xs[start:start + T]
    zeros = xs.new_zeros((min(-start, T), *xs.shape[1:]))
    return torch.cat([zeros, xs[:max(0, start + T)]])


def _add_shifted_back(grad: torch.Tensor, g: torch.Tensor, s: int, P: int) -> None:
    """The transpose of :func:`_shifted`: ``grad[P - s + t] += g[t]`` where ``0 <= P - s + t``."""
    start, skip = P - s, max(0, s - P)
    if skip < len(g):
        grad[start + skip:start + len(g)] += g[skip:]


def _shifts(k: torch.Tensor) -> list[int]:
    """The steps any tap reads at: ``k`` and ``k + 1`` (one host read: the torch backend's loop)."""
    return torch.unique(torch.cat([k.flatten(), k.flatten() + 1])).to(torch.int64).tolist()


def linear_forward(xs: torch.Tensor, weight: torch.Tensor, delay: torch.Tensor, bias: torch.Tensor | None,
                   max_delay: float, P: int, triton: bool, layer: int, keep_taps: bool
                   ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...], bool]:
    """``(y, kept, events)``: ``y [T, B, J]`` of :class:`~flexsn_dsl.DelayLinear` (the layer numbered ``layer``);
    where ``keep_taps`` (the weight's or the delay's gradient is wanted), what the backward's tap gradients read:
    ``(xs,)``, or where they take the event kernels the by-input list's tensors (``events`` true); ``()``
    otherwise."""
    k, f, _ = _split(delay, max_delay)
    a, c = weight * (1 - f), weight * f
    T = xs.shape[0] - P
    if not triton:
        y = xs.new_zeros((T, xs.shape[1], weight.shape[0]))
        if bias is not None:
            y += bias
        for s in _shifts(k):
            y += _shifted(xs, s, P, T) @ (a * (k == s) + c * (k + 1 == s)).T
        return y, (xs,) if keep_taps else (), False
    work, kernels = _work(xs.dtype), _kernels()
    reach = math.floor(max_delay) + 1
    xw = xs.to(work).contiguous()
    by_step, kept, events = _listed(xw, xs, reach, T, weight.shape[0], layer, True, keep_taps)
    y = kernels.linear_forward(xw, a.to(work).contiguous(), c.to(work).contiguous(), k.to(torch.int32).contiguous(),
                               None if bias is None else bias.to(work), T, P, reach, by_step)
    return y.to(xs.dtype), kept, events


def _listed(xw: torch.Tensor, xs: torch.Tensor, reach: int, T: int, outputs: int, layer: int, forward: bool,
            keep_taps: bool) -> tuple[Any, tuple[torch.Tensor, ...], bool]:
    """The event kernels chosen for the layer numbered ``layer`` by the density of ``xw`` (``xs`` in the kernels'
    dtype, contiguous; one wait for the GPU, none in a CUDA graph capture) and the events listed once for them: the
    forward's by-step list where ``forward`` asks for it and the event forward runs (else None), and ``(kept,
    events)`` as :func:`linear_forward` gives them (``xs`` kept where the tap gradients are dense)."""
    kernels = _kernels()
    choice = kernels.event_kernels(xw, reach, T, outputs, layer)
    by_steps, events = forward and choice.forward, keep_taps and choice.taps  # (the backward follows this choice)
    by_step = by_input = None
    if by_steps or events:
        counts = choice.counts if choice.counts is not None else kernels.count_events(xw, read=False)  # (captured)
        by_step, by_input = kernels.list_events(xw, counts, by_steps, events)
    return by_step, tuple(by_input[:4]) if events else (xs,) if keep_taps else (), events


def taps_source(xs: torch.Tensor, max_delay: float, P: int, outputs: int, layer: int
                ) -> tuple[tuple[torch.Tensor, ...], bool]:
    """``(kept, events)`` as :func:`linear_forward` gives them where ``keep_taps``, on the Triton backend, from the
    input alone (the input kept in the kernels' dtype)."""
    xw = xs.to(_work(xs.dtype)).contiguous()
    return _listed(xw, xw, math.floor(max_delay) + 1, xs.shape[0] - P, outputs, layer, False, True)[1:]


def linear_backward(g: torch.Tensor, kept: tuple[torch.Tensor, ...], events: bool, shape: tuple[int, ...],
                    dtype: torch.dtype, weight: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int,
                    triton: bool, wanted: tuple[bool, bool, bool]
                    ) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
    """The gradients of ``xs`` (of ``shape`` and ``dtype``), the weight and the delay, each where ``wanted``, from
    that of ``y``, ``g [T, B, J]``, and :func:`linear_forward`'s ``kept`` and ``events``."""
    k, f, inside = _split(delay, max_delay)
    a, c = weight * (1 - f), weight * f
    want_x, want_w, want_d = wanted
    grad_x = s0 = s1 = None
    if not triton:
        grad_x = g.new_zeros(shape) if want_x else None
        s0, s1 = torch.zeros_like(weight), torch.zeros_like(weight)
        rows = g.reshape(-1, g.shape[-1]).T
        for s in _shifts(k):
            if want_x:
                _add_shifted_back(grad_x, g @ (a * (k == s) + c * (k + 1 == s)), s, P)
            if want_w or want_d:
                m = rows @ _shifted(kept[0], s, P, len(g)).reshape(rows.shape[1], -1)
                s0 += m * (k == s)
                s1 += m * (k + 1 == s)
    else:
        work = _work(dtype)
        kernels, gw, ki = _kernels(), g.to(work).contiguous(), k.to(torch.int32)
        reach = math.floor(max_delay) + 1
        if want_x:
            grad_x = kernels.linear_grad_input(gw, a.to(work).contiguous(), c.to(work).contiguous(), ki, shape[0], P,
                                               reach).to(dtype)
        if want_w or want_d:
            source = kernels.EventList(*kept, shape) if events else kept[0].to(work).contiguous()
            s0, s1 = (s.to(weight.dtype) for s in kernels.linear_grad_taps(gw, source, ki, P, reach))
    grad_w = (1 - f) * s0 + f * s1 if want_w else None
    grad_d = torch.where(inside, weight * (s1 - s0), 0) if want_d else None
    return grad_x, grad_w, grad_d


class DelayLinearFunction(torch.autograd.Function):
    """:func:`linear_forward` and :func:`linear_backward` in an eager call: keeps the parameters and what the tap
    gradients read (the input, or its events' by-input list; nothing where only the input's gradient is wanted)."""

    @staticmethod
    def forward(ctx, xs: torch.Tensor, weight: torch.Tensor, delay: torch.Tensor, bias: torch.Tensor | None,
                max_delay: float, P: int, triton: bool, layer: int) -> torch.Tensor:
        ctx.args, ctx.has_bias = (max_delay, P, triton), bias is not None
        ctx.shape, ctx.dtype = tuple(xs.shape), xs.dtype
        y, kept, ctx.events = linear_forward(xs, weight, delay, bias, max_delay, P, triton, layer,
                                             any(ctx.needs_input_grad[1:3]))
        ctx.save_for_backward(*kept, weight, delay)
        return y

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple:
        *kept, weight, delay = ctx.saved_tensors
        grads = linear_backward(g, tuple(kept), ctx.events, ctx.shape, ctx.dtype, weight, delay, *ctx.args,
                                ctx.needs_input_grad[:3])
        grad_b = g.sum((0, 1)) if ctx.has_bias and ctx.needs_input_grad[3] else None
        return *grads, grad_b, None, None, None, None


def channel_forward(xs: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int) -> torch.Tensor:
    """``y [T, B, C]`` of :class:`~flexsn_dsl.Delay` on the Triton kernels, from ``xs [P + T, B, C]``."""
    k, f, _ = _split(delay, max_delay)
    work = _work(xs.dtype)
    y = _kernels().channel_forward(xs.to(work).contiguous(), (1 - f).to(work).contiguous(), f.to(work).contiguous(),
                                   k.to(torch.int32).contiguous(), xs.shape[0] - P, P)
    return y.to(xs.dtype)


def channel_backward(g: torch.Tensor, xs: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int,
                     want_x: bool, want_d: bool) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """The gradients of ``xs`` and of the delay, each where wanted, from that of ``y``, ``g [T, B, C]``."""
    k, f, inside = _split(delay, max_delay)
    work = _work(xs.dtype)
    gw, ki = g.to(work).contiguous(), k.to(torch.int32).contiguous()
    grad_x = grad_d = None
    if want_x:
        grad_x = _kernels().channel_grad_input(gw, (1 - f).to(work).contiguous(), f.to(work).contiguous(), ki,
                                               xs.shape[0], P).to(xs.dtype)
    if want_d:
        sums = _kernels().channel_grad_delay(gw, xs.to(work).contiguous(), ki, P).to(delay.dtype)
        grad_d = torch.where(inside, sums, 0)
    return grad_x, grad_d


class DelayFunction(torch.autograd.Function):
    """:func:`channel_forward` and :func:`channel_backward` in an eager call: keeps the input and the delays."""

    @staticmethod
    def forward(ctx, xs: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int) -> torch.Tensor:
        ctx.args = (max_delay, P)
        ctx.save_for_backward(xs, delay)
        return channel_forward(xs, delay, max_delay, P)

    @staticmethod
    @once_differentiable
    def backward(ctx, g: torch.Tensor) -> tuple:
        xs, delay = ctx.saved_tensors
        return *channel_backward(g, xs, delay, *ctx.args, *ctx.needs_input_grad[:2]), None, None
