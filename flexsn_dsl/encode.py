"""Input encoders: values or signals turned into spike trains ``[T, ...]`` for a spiking network.

The top floor beside the runtime, on torch alone (nothing in the package imports it). Random
encoders draw from torch's generator (``torch.manual_seed`` makes them reproducible) or from the
``generator`` given.
"""
from __future__ import annotations

import torch


def _steps(T: int) -> int:
    if isinstance(T, bool) or not isinstance(T, int) or T < 1:
        raise ValueError(f"T must be a whole number of steps of at least 1, not {T!r}")
    return T


def _tensor(x) -> torch.Tensor:
    """A tensor as it is (on its own device); numbers and arrays as a tensor on the default device."""
    return x if isinstance(x, torch.Tensor) else torch.as_tensor(x)


def rate(x: torch.Tensor, T: int, generator: torch.Generator | None = None) -> torch.Tensor:
    """Rate (Bernoulli) coding: ``[T, *x.shape]`` spikes, each 1 with probability ``x`` clipped to
    [0, 1], independently at every step (snnTorch ``spikegen.rate``, SpikingJelly's Poisson encoder)."""
    x = _tensor(x)
    p = x.to(torch.get_default_dtype() if not x.is_floating_point() else x.dtype).clamp(0, 1)
    return torch.bernoulli(p.expand(_steps(T), *p.shape), generator=generator)


def latency(x: torch.Tensor, T: int) -> torch.Tensor:
    """Latency (time-to-first-spike) coding: ``[T, *x.shape]`` with one spike per element that has
    ``x > 0``, at step ``round((1 - x) * (T - 1))`` (x clipped to 1): larger inputs fire earlier,
    ``x = 1`` at step 0; ``x <= 0`` never fires."""
    x = _tensor(x)
    x = x.to(torch.get_default_dtype() if not x.is_floating_point() else x.dtype)
    T = _steps(T)
    when = torch.round((1 - x.clamp(max=1)) * (T - 1))
    steps = torch.arange(T, device=x.device, dtype=x.dtype).reshape(T, *([1] * x.dim()))
    return ((steps == when) & (x > 0)).to(x.dtype)


def delta(seq: torch.Tensor, threshold: float) -> torch.Tensor:
    """Delta modulation of a ``[T, ...]`` sequence: 1 at step t where ``seq[t] - seq[t - 1] >= threshold``
    (``seq[-1]`` taken as 0, so a first value at or above the threshold fires), else 0."""
    seq = _tensor(seq)
    if seq.dim() < 1:
        raise ValueError("delta needs a sequence [T, ...], not a scalar")
    seq = seq.to(torch.get_default_dtype() if not seq.is_floating_point() else seq.dtype)
    previous = torch.cat([torch.zeros_like(seq[:1]), seq[:-1]])
    return (seq - previous >= threshold).to(seq.dtype)
