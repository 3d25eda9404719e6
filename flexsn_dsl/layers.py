"""Torch layers for the networks around the neurons, which take sequences ``[T, B, ...]``.

Plain torch: nothing here generates code, and no other module of the package is imported
(``nir`` builds its per-step layers from :class:`PerStep`).
"""
from __future__ import annotations

import torch
from torch import nn

__all__ = ["PerStep"]


class PerStep(nn.Module):
    """Applies stateless layers to every step of a sequence ``[T, B, ...]`` at once.

    Time is folded into the batch: the layers run once on ``[T*B, ...]`` and the result is
    unfolded to ``[T, B, ...]``, as SpikingJelly's ``layer.SeqToANNContainer`` does. The layers
    must not carry anything from step to step (convolutions, linear layers, pooling, dropout;
    ``BatchNorm`` normalises over all T*B rows); neurons go between PerStep layers, not in them.

    ``PerStep(layer)`` keeps the layer as ``.layer``; ``PerStep(a, b, ...)`` keeps
    ``nn.Sequential(a, b, ...)`` there.
    """

    def __init__(self, *layers: nn.Module):
        super().__init__()
        if not layers:
            raise TypeError("PerStep needs at least one layer, e.g. PerStep(nn.Conv2d(3, 8, 3))")
        self.layer = layers[0] if len(layers) == 1 else nn.Sequential(*layers)

    def extra_repr(self) -> str:
        return "time folded into the batch: [T, B, ...] -> [T*B, ...]"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.unflatten(self.layer(x.flatten(0, 1)), 0, x.shape[:2])  # (the function: no Python wrapper)
