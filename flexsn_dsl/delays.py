"""Learnable delays: :class:`DelayLinear` (one delay per synapse) and :class:`Delay` (one per channel).

A delay ``d`` (in steps, a float) is clamped to ``[0, max_delay]`` and read by linear interpolation between
the two whole steps around it: with ``k = floor(d)`` and ``f = d - k``, ``x`` delayed by ``d`` at step ``t`` is
``(1 - f) x[t - k] + f x[t - k - 1]`` (``x[t] = 0`` for ``t < 0``). A whole-step delay is exactly ``x[t - d]``;
the delay's gradient is that of the interpolation in ``f`` (at a whole step, towards the longer delay).

The passes of both backends are :mod:`flexsn_dsl.delay_passes`' (the Triton kernels, :mod:`flexsn_dsl.delay_kernels`,
for CUDA inputs or ``backend="triton"``); under torch.compile the layers call them as the operators of
:mod:`flexsn_dsl.delay_operators`. Nothing kept for the backward grows with ``max_delay``. Plain torch otherwise
(Triton's kernels are imported on their first use)."""
from __future__ import annotations

import itertools
import math
from typing import Any, Sequence

import torch
from torch import nn

from . import delay_operators, delay_passes

__all__ = ["BACKENDS", "Delay", "DelayLinear"]

BACKENDS = ("auto", "torch", "triton")
_LAYERS = itertools.count()  # each DelayLinear's number: a captured call follows its layer's last eager choice


def _check_backend(backend: str) -> str:
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    return backend


def _uses_triton(backend: str, x: torch.Tensor) -> bool:
    return backend == "triton" or (backend == "auto" and x.is_cuda)


def _history(xs: torch.Tensor, steps: int) -> torch.Tensor:
    """The last ``steps`` steps of ``xs`` (zeros before its first): the history of the next call."""
    if len(xs) >= steps:
        return xs[len(xs) - steps:]
    return torch.cat([xs.new_zeros((steps - len(xs), *xs.shape[1:])), xs])


def _with_history(x: torch.Tensor, history: torch.Tensor | None, steps: int, what: str) -> tuple[torch.Tensor, int]:
    """``(xs, P)``: the history (``P`` steps) and then ``x``."""
    if history is None:
        return x, 0
    if tuple(history.shape) != (steps, *x.shape[1:]):
        raise ValueError(f"{what}: history must have shape {[steps, *x.shape[1:]]} (the last {steps} steps of "
                         f"the input, as return_history=True gives it), got {list(history.shape)}")
    return torch.cat([history.to(x.dtype), x]), steps


class DelayLinear(nn.Module):
    """A linear layer over ``[T, B, in]`` (or ``[T, in]``) with one learnable delay per synapse:

    ``y[t, b, j] = bias[j] + sum_i weight[j, i] ((1 - f) x[t - k, b, i] + f x[t - k - 1, b, i])``, with
    ``d = clamp(delay[j, i], 0, max_delay)``, ``k = floor(d)``, ``f = d - k`` and ``x[t] = 0`` before the
    first step. ``weight`` initialises as ``nn.Linear``'s; ``delay`` (steps, a float) uniformly in
    ``[0, max_delay]`` (``delay_init="uniform"``) or at 0 (``"zero"``); with ``learn_delay=False`` it is a
    buffer of whole steps. ``layer(x, history=h)`` continues a sequence whose earlier part gave ``h``
    (``y, h = layer(x, return_history=True)``: the last ``floor(max_delay) + 1`` steps of the input).
    ``backend``: ``"auto"`` (Triton's kernels for CUDA tensors, torch otherwise), ``"triton"`` or ``"torch"``."""

    def __init__(self, in_features: int, out_features: int, max_delay: float, *, bias: bool = True,
                 learn_delay: bool = True, delay_init: str = "uniform", dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, backend: str = "auto"):
        super().__init__()
        if not (isinstance(max_delay, (int, float)) and math.isfinite(max_delay) and max_delay >= 0):
            raise ValueError(f"max_delay must be a finite number of steps >= 0, got {max_delay!r}")
        if delay_init not in ("uniform", "zero"):
            raise ValueError(f'delay_init must be "uniform" or "zero", got {delay_init!r}')
        self.in_features, self.out_features, self.max_delay = in_features, out_features, max_delay
        self.learn_delay, self.backend = learn_delay, _check_backend(backend)
        self.history_steps = math.floor(max_delay) + 1  # steps x[t - k - 1] reaches back at most
        self._layer = next(_LAYERS)
        linear = nn.Linear(in_features, out_features, bias=bias, dtype=dtype, device=device)
        self.weight = linear.weight
        self.bias = linear.bias
        delay = torch.zeros((out_features, in_features), dtype=self.weight.dtype, device=device)
        if delay_init == "uniform":
            with torch.no_grad():
                delay.uniform_(0, max_delay) if learn_delay else delay.random_(0, math.floor(max_delay) + 1)
        if learn_delay:
            self.delay = nn.Parameter(delay)
        else:
            self.register_buffer("delay", delay)

    def extra_repr(self) -> str:
        return (f"in_features={self.in_features}, out_features={self.out_features}, max_delay={self.max_delay}, "
                f"bias={self.bias is not None}, learn_delay={self.learn_delay}, backend={self.backend!r}")

    @torch.no_grad()
    def round_delays_(self) -> DelayLinear:
        """Rounds the (clamped) delays to whole steps in place, for deployment and NIR export; returns self."""
        self.delay.copy_(_rounded(self.delay, self.max_delay))
        return self

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None, return_history: bool = False):
        single = x.dim() == 2
        if single:
            x = x.unsqueeze(1)
            history = None if history is None else history.unsqueeze(1)
        if x.dim() != 3 or x.shape[-1] != self.in_features:
            raise ValueError(f"DelayLinear({self.in_features}, {self.out_features}): x must be [T, B, "
                             f"{self.in_features}] or [T, {self.in_features}], got {list(x.shape)}")
        x = x.to(self.weight.dtype)
        xs, P = _with_history(x, history, self.history_steps, "DelayLinear")
        call = delay_operators.delay_linear if torch.compiler.is_compiling() else \
            delay_passes.DelayLinearFunction.apply
        y = call(xs, self.weight, self.delay, self.bias, float(self.max_delay), P, _uses_triton(self.backend, xs),
                 self._layer)
        if single:
            y = y.squeeze(1)
        if not return_history:
            return y
        h = _history(xs, self.history_steps)
        return y, h.squeeze(1) if single else h


def _rounded(delay: torch.Tensor, max_delay: float) -> torch.Tensor:
    """Delays rounded to the nearest whole step (half to even) within ``[0, floor(max_delay)]``: a delay rounded
    up past a fractional ``max_delay`` would be clamped back to it, a fraction again."""
    return delay.round().clamp(0, math.floor(max_delay) if math.isfinite(max_delay) else None)


def _read_steps(module: Delay, _keys: Any = None) -> None:
    """Sets ``history_steps`` of fixed delays from their values (a load_state_dict post-hook too), so that a
    call reads nothing back from the device."""
    if not module.learnable:
        d = module.delay.detach().clamp(0, module.max_delay)
        module.history_steps = int(d.max()) if d.numel() and d.device.type != "meta" else 0


class Delay(nn.Module):
    """One delay per channel of a ``[T, B, ...]`` signal: ``delays`` (steps) has the shape of one step's channels
    (or broadcasts to it). Read as :class:`DelayLinear` reads its delays (clamped to ``[0, max_delay]``,
    linear interpolation); fixed delays (``learnable=False``, a buffer) are rounded to whole steps. The history
    (``history=``, ``return_history=True``) is the last ``history_steps`` steps of the input."""

    def __init__(self, delays: torch.Tensor | Sequence[float] | float, learnable: bool = False, *,
                 max_delay: float = math.inf, backend: str = "auto"):
        super().__init__()
        delays = torch.as_tensor(delays)
        delays = delays.to(delays.dtype if delays.is_floating_point() else torch.get_default_dtype())
        if not learnable:
            delays = _rounded(delays, max_delay)
        self.learnable, self.max_delay, self.backend = learnable, max_delay, _check_backend(backend)
        if learnable:
            self.delay = nn.Parameter(delays.clone())
        else:
            self.register_buffer("delay", delays.clone())
        _read_steps(self)
        self.register_load_state_dict_post_hook(_read_steps)

    def extra_repr(self) -> str:
        return f"channels={list(self.delay.shape)}, learnable={self.learnable}, backend={self.backend!r}"

    @torch.no_grad()
    def round_delays_(self) -> Delay:
        """Rounds the (clamped) delays to whole steps in place; returns self."""
        self.delay.copy_(_rounded(self.delay, self.max_delay))
        _read_steps(self)
        return self

    def _steps(self) -> int:
        """The history's length: the longest whole delay, and one more where delays are fractional."""
        if not self.learnable:
            return self.history_steps
        if math.isfinite(self.max_delay):
            return math.floor(self.max_delay) + 1
        return int(self.delay.detach().clamp(min=0).max()) + 1 if self.delay.numel() else 1

    def forward(self, x: torch.Tensor, history: torch.Tensor | None = None, return_history: bool = False):
        if x.dim() < 2:
            raise ValueError(f"Delay: x must be [T, B, ...], got {list(x.shape)}")
        channels = x.shape[2:]
        shape = self.delay.shape
        if len(shape) > len(channels) or any(d not in (1, c) for d, c in zip(reversed(shape), reversed(channels))):
            raise ValueError(f"Delay: its delays {list(shape)} do not broadcast to x's channels "
                             f"{list(channels)} (x: [T, B, ...]; delays of shape [C, 1, 1] delay each of C channels "
                             f"of a [T, B, C, H, W] signal)")
        steps = self._steps()
        xs, P = _with_history(x, history, steps, "Delay")
        delay = self.delay.to(x.dtype) if self.delay.dtype != x.dtype and x.is_floating_point() else self.delay
        if _uses_triton(self.backend, xs) and x.dtype.is_floating_point:
            flat = xs.reshape(*xs.shape[:2], -1)
            d = delay.expand(channels).reshape(-1)
            call = delay_operators.delay_channels if torch.compiler.is_compiling() else delay_passes.DelayFunction.apply
            y = call(flat, d, float(self.max_delay), P).reshape(len(x), *x.shape[1:])
        else:
            y = self._torch(xs, delay.expand(channels), P, len(x))
        return (y, _history(xs, steps)) if return_history else y

    def _torch(self, xs: torch.Tensor, delay: torch.Tensor, P: int, T: int) -> torch.Tensor:
        """The formula as gathers (reading no value back: a call works on meta tensors)."""
        d = delay.clamp(0, self.max_delay)
        k = d.detach().floor()
        f = d - k
        t = torch.arange(T, device=xs.device).view(-1, *([1] * (xs.dim() - 1)))
        s = (P + t - k.to(torch.int64)).expand(T, *xs.shape[1:])
        x0 = torch.where(s >= 0, xs.gather(0, s.clamp(min=0)), 0)
        x1 = torch.where(s >= 1, xs.gather(0, (s - 1).clamp(min=0)), 0)
        return (1 - f) * x0 + f * x1
