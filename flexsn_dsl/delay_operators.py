"""The delay layers' passes (:mod:`flexsn_dsl.delay_passes`) as operators for torch.compile, which treats them as
opaque: :class:`~flexsn_dsl.DelayLinear` (both backends) and :class:`~flexsn_dsl.Delay` (the Triton backend; its
torch backend is traced) compile into one graph (``fullgraph=True``; a learnable ``Delay`` needs a finite
``max_delay``), and each call still chooses its kernels when it runs, the event kernels included (their choice
waits for the GPU, which a traced graph cannot). The compiled forward keeps the input for the backward, whose
operator lists the events again where the tap gradients take them."""
from __future__ import annotations

from typing import Optional

import torch

from . import delay_passes

__all__ = ["delay_channels", "delay_linear"]


def _grads(wanted: list[bool], likes: list[torch.Tensor], grads) -> list[torch.Tensor]:
    """The operators' gradients: each wanted one (contiguous, as the fake ones are), and an empty tensor for each
    other (an operator returns tensors)."""
    return [g.contiguous() if want else like.new_empty(0) for want, like, g in zip(wanted, likes, grads)]


@torch.library.custom_op("flexsn_dsl::delay_linear", mutates_args=())
def delay_linear(xs: torch.Tensor, weight: torch.Tensor, delay: torch.Tensor, bias: Optional[torch.Tensor],
                 max_delay: float, P: int, triton: bool, layer: int) -> torch.Tensor:
    """:class:`~flexsn_dsl.DelayLinear`'s forward: ``y [T, B, J]`` from ``xs [P + T, B, I]``."""
    return delay_passes.linear_forward(xs, weight, delay, bias, max_delay, P, triton, layer, False)[0]


@delay_linear.register_fake
def _(xs, weight, delay, bias, max_delay, P, triton, layer):
    return xs.new_empty((xs.shape[0] - P, xs.shape[1], weight.shape[0]))


@torch.library.custom_op("flexsn_dsl::delay_linear_backward", mutates_args=())
def delay_linear_backward(g: torch.Tensor, xs: torch.Tensor, weight: torch.Tensor, delay: torch.Tensor,
                          max_delay: float, P: int, triton: bool, layer: int, wanted: list[bool]
                          ) -> list[torch.Tensor]:
    """The gradients of ``xs``, the weight and the delay (each where ``wanted``, else empty) from that of ``y``."""
    kept, events = (xs,), False
    if triton and any(wanted[1:]):
        kept, events = delay_passes.taps_source(xs, max_delay, P, weight.shape[0], layer)
    grads = delay_passes.linear_backward(g, kept, events, tuple(xs.shape), xs.dtype, weight, delay, max_delay, P,
                                         triton, tuple(wanted))
    return _grads(wanted, [xs, weight, delay], grads)


@delay_linear_backward.register_fake
def _(g, xs, weight, delay, max_delay, P, triton, layer, wanted):
    likes = [xs, weight, delay]
    return _grads(wanted, likes, [t.new_empty(t.shape) for t in likes])


def _keep_linear(ctx, inputs, output) -> None:
    xs, weight, delay, bias, max_delay, P, triton, layer = inputs
    ctx.args, ctx.has_bias = (max_delay, P, triton, layer), bias is not None
    ctx.save_for_backward(xs, weight, delay)


def _linear_backward(ctx, g: torch.Tensor) -> tuple:
    xs, weight, delay = ctx.saved_tensors
    wanted = list(ctx.needs_input_grad[:3])
    grads = delay_linear_backward(g, xs, weight, delay, *ctx.args, wanted) if any(wanted) else [None] * 3
    grad_b = g.sum((0, 1)) if ctx.has_bias and ctx.needs_input_grad[3] else None
    return *(grad if want else None for want, grad in zip(wanted, grads)), grad_b, None, None, None, None


delay_linear.register_autograd(_linear_backward, setup_context=_keep_linear)


@torch.library.custom_op("flexsn_dsl::delay_channels", mutates_args=())
def delay_channels(xs: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int) -> torch.Tensor:
    """:class:`~flexsn_dsl.Delay`'s forward on the Triton kernels: ``y [T, B, C]`` from ``xs [P + T, B, C]``."""
    return delay_passes.channel_forward(xs, delay, max_delay, P)


@delay_channels.register_fake
def _(xs, delay, max_delay, P):
    return xs.new_empty((xs.shape[0] - P, *xs.shape[1:]))


@torch.library.custom_op("flexsn_dsl::delay_channels_backward", mutates_args=())
def delay_channels_backward(g: torch.Tensor, xs: torch.Tensor, delay: torch.Tensor, max_delay: float, P: int,
                            wanted: list[bool]) -> list[torch.Tensor]:
    """The gradients of ``xs`` and the delay (each where ``wanted``, else empty) from that of ``y``."""
    return _grads(wanted, [xs, delay], delay_passes.channel_backward(g, xs, delay, max_delay, P, *wanted))


@delay_channels_backward.register_fake
def _(g, xs, delay, max_delay, P, wanted):
    likes = [xs, delay]
    return _grads(wanted, likes, [t.new_empty(t.shape) for t in likes])


def _keep_channels(ctx, inputs, output) -> None:
    xs, delay, max_delay, P = inputs
    ctx.args = (max_delay, P)
    ctx.save_for_backward(xs, delay)


def _channels_backward(ctx, g: torch.Tensor) -> tuple:
    xs, delay = ctx.saved_tensors
    wanted = list(ctx.needs_input_grad[:2])
    grads = delay_channels_backward(g, xs, delay, *ctx.args, wanted)
    return *(grad if want else None for want, grad in zip(wanted, grads)), None, None


delay_channels.register_autograd(_channels_backward, setup_context=_keep_channels)
