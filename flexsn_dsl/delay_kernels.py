"""Triton kernels of the delay layers (:mod:`flexsn_dsl.delays`): a stage of their own beside the neurons'.

A sequence ``xs [L, B, I]`` (contiguous) holds ``P`` steps of history and then the call's ``T`` steps; output
step ``t`` reads ``xs[P + t - k]`` and ``xs[P + t - k - 1]`` (zero before the first step). The interpolation is
folded into two taps per synapse, ``a = w (1 - f)`` and ``c = w f`` (computed by the caller, in the call's
dtype: the kernels hold no floating-point literal), so that

- :func:`linear_forward`: ``y[t, b, j] = bias[j] + sum_i a[j,i] xs[P+t-k, b, i] + c[j,i] xs[P+t-k-1, b, i]``,
  a gather and sum over ``i`` for each tile of rows ``(t, b)`` and outputs ``j``;
- :func:`linear_grad_input`: the same sum transposed, written as a gather over ``j``: ``xs[s]`` receives from
  ``y[s - P + k]`` (tap ``a``) and ``y[s - P + k + 1]`` (tap ``c``);
- :func:`linear_grad_taps`: ``S0[j,i] = sum_{t,b} g[t,b,j] xs[P+t-k, b, i]`` and ``S1`` (the same at
  ``-k-1``), each program reducing over all rows of one tile of synapses: deterministic, no atomics;
- :func:`channel_forward`, :func:`channel_grad_input`, :func:`channel_grad_delay`: the same for one delay
  per channel (``y[t, b, c] = a[c] xs[P+t-k, b, c] + f[c] xs[P+t-k-1, b, c]``), the delay's partial sums
  one row of blocks per program, summed by the caller.

Nothing of size ``max_delay`` is allocated: the delays are indices. Offsets are int32 (``L * B * I`` below
2**31, checked by the callers)."""
from __future__ import annotations

import torch

from .triton_settings import triton  # (Triton imported after the interpreter's switch)

import triton.language as tl  # noqa: E402

__all__ = ["channel_forward", "channel_grad_delay", "channel_grad_input", "linear_forward", "linear_grad_input",
           "linear_grad_taps"]

ROWS = 32  # rows (t, b) of a tile
COLS = 32  # outputs j (forward), inputs i (grad of the input) or channels of a tile
TAPS = 16  # synapses (j and i) of a reduction tile, each way


@triton.jit
def _linear_forward(xs, a, c, k, bias, y, T, B, I, J, P,
                    HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_J: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    row, col = n < T * B, j < J
    t, b = n // B, n % B
    inside = row[:, None] & col[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_J), dtype=y.dtype.element_ty)
    if HAS_BIAS:
        acc += tl.load(bias + j, mask=col, other=0)[None, :]
    for i in range(I):
        kj = tl.load(k + j * I + i, mask=col, other=0)
        aj = tl.load(a + j * I + i, mask=col, other=0)
        cj = tl.load(c + j * I + i, mask=col, other=0)
        s = (P + t)[:, None] - kj[None, :]
        x0 = tl.load(xs + (s * B + b[:, None]) * I + i, mask=inside & (s >= 0), other=0)
        x1 = tl.load(xs + ((s - 1) * B + b[:, None]) * I + i, mask=inside & (s >= 1), other=0)
        acc += aj[None, :] * x0 + cj[None, :] * x1
    tl.store(y + n[:, None] * J + j[None, :], acc, mask=inside)


@triton.jit
def _linear_grad_input(g, a, c, k, gx, L, T, B, I, J, P, BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    row, col = n < L * B, i < I
    s, b = n // B, n % B
    inside = row[:, None] & col[None, :]
    acc = tl.zeros((BLOCK_N, BLOCK_I), dtype=gx.dtype.element_ty)
    for j in range(J):
        kj = tl.load(k + j * I + i, mask=col, other=0)
        aj = tl.load(a + j * I + i, mask=col, other=0)
        cj = tl.load(c + j * I + i, mask=col, other=0)
        t = (s - P)[:, None] + kj[None, :]  # y[t] reads xs[s] through tap a, y[t + 1] through tap c
        g0 = tl.load(g + (t * B + b[:, None]) * J + j, mask=inside & (t >= 0) & (t < T), other=0)
        g1 = tl.load(g + ((t + 1) * B + b[:, None]) * J + j, mask=inside & (t >= -1) & (t < T - 1), other=0)
        acc += aj[None, :] * g0 + cj[None, :] * g1
    tl.store(gx + n[:, None] * I + i[None, :], acc, mask=inside)


@triton.jit
def _linear_grad_taps(g, xs, k, s0, s1, T, B, I, J, P,
                      BLOCK_J: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_N: tl.constexpr):
    j = tl.program_id(0) * BLOCK_J + tl.arange(0, BLOCK_J)
    i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    pair = (j < J)[:, None] & (i < I)[None, :]
    kji = tl.load(k + j[:, None] * I + i[None, :], mask=pair, other=0)
    acc0 = tl.zeros((BLOCK_J, BLOCK_I), dtype=s0.dtype.element_ty)
    acc1 = tl.zeros((BLOCK_J, BLOCK_I), dtype=s0.dtype.element_ty)
    for n0 in range(0, T * B, BLOCK_N):
        n = n0 + tl.arange(0, BLOCK_N)
        row = n < T * B
        t, b = n // B, n % B
        gt = tl.load(g + n[None, :] * J + j[:, None], mask=row[None, :] & (j < J)[:, None], other=0)
        s = (P + t)[None, None, :] - kji[:, :, None]
        inside = pair[:, :, None] & row[None, None, :]
        at = (b[None, None, :] + s * B) * I + i[None, :, None]
        x0 = tl.load(xs + at, mask=inside & (s >= 0), other=0)
        x1 = tl.load(xs + at - B * I, mask=inside & (s >= 1), other=0)
        acc0 += tl.sum(gt[:, None, :] * x0, axis=2)
        acc1 += tl.sum(gt[:, None, :] * x1, axis=2)
    at = j[:, None] * I + i[None, :]
    tl.store(s0 + at, acc0, mask=pair)
    tl.store(s1 + at, acc1, mask=pair)


@triton.jit
def _taps_of_channels(xs, k, T, B, C, P, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """This program's tile of rows ``n`` (t, b) by channels ``ch``: (n, ch, the tile's mask, the channels'
    mask, ``xs[P+t-k]``, ``xs[P+t-k-1]``)."""
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row, col = n < T * B, ch < C
    t, b = n // B, n % B
    inside = row[:, None] & col[None, :]
    kc = tl.load(k + ch, mask=col, other=0)
    s = (P + t)[:, None] - kc[None, :]
    at = (s * B + b[:, None]) * C + ch[None, :]
    x0 = tl.load(xs + at, mask=inside & (s >= 0), other=0)
    x1 = tl.load(xs + at - B * C, mask=inside & (s >= 1), other=0)
    return n, ch, inside, col, x0, x1


@triton.jit
def _channel_forward(xs, a, f, k, y, T, B, C, P, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    n, ch, inside, col, x0, x1 = _taps_of_channels(xs, k, T, B, C, P, BLOCK_N, BLOCK_C)
    out = tl.load(a + ch, mask=col, other=0)[None, :] * x0 + tl.load(f + ch, mask=col, other=0)[None, :] * x1
    tl.store(y + n[:, None] * C + ch[None, :], out, mask=inside)


@triton.jit
def _channel_grad_input(g, a, f, k, gx, L, T, B, C, P, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    n = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    ch = tl.program_id(1) * BLOCK_C + tl.arange(0, BLOCK_C)
    row, col = n < L * B, ch < C
    s, b = n // B, n % B
    inside = row[:, None] & col[None, :]
    kc = tl.load(k + ch, mask=col, other=0)
    t = (s - P)[:, None] + kc[None, :]
    at = (t * B + b[:, None]) * C + ch[None, :]
    g0 = tl.load(g + at, mask=inside & (t >= 0) & (t < T), other=0)
    g1 = tl.load(g + at + B * C, mask=inside & (t >= -1) & (t < T - 1), other=0)
    out = tl.load(a + ch, mask=col, other=0)[None, :] * g0 + tl.load(f + ch, mask=col, other=0)[None, :] * g1
    tl.store(gx + n[:, None] * C + ch[None, :], out, mask=inside)


@triton.jit
def _channel_grad_delay(g, xs, k, part, T, B, C, P, BLOCK_N: tl.constexpr, BLOCK_C: tl.constexpr):
    """``part[p, c] = sum over program p's rows of g[t, b, c] (xs[P+t-k-1] - xs[P+t-k])``."""
    n, ch, inside, col, x0, x1 = _taps_of_channels(xs, k, T, B, C, P, BLOCK_N, BLOCK_C)
    gt = tl.load(g + n[:, None] * C + ch[None, :], mask=inside, other=0)
    tl.store(part + tl.program_id(0) * C + ch, tl.sum(gt * (x1 - x0), axis=0), mask=col)


def _blocks(n: int, block: int) -> int:
    return max(1, -(-n // block))


def linear_forward(xs: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None,
                   T: int, P: int) -> torch.Tensor:
    """``y [T, B, J]`` of the delayed linear map (the module's forward, see the module docstring)."""
    _, B, I = xs.shape
    J = a.shape[0]
    y = xs.new_empty((T, B, J))
    if y.numel():
        grid = (_blocks(T * B, ROWS), _blocks(J, COLS))
        _linear_forward[grid](xs, a, c, k, bias if bias is not None else a, y, T, B, I, J, P,
                              HAS_BIAS=bias is not None, BLOCK_N=ROWS, BLOCK_J=COLS)
    return y


def linear_grad_input(g: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, L: int, P: int
                      ) -> torch.Tensor:
    """The gradient of ``xs [L, B, I]`` from that of ``y``, ``g [T, B, J]`` (contiguous)."""
    T, B, J = g.shape
    I = a.shape[1]
    gx = g.new_empty((L, B, I))
    if gx.numel():
        grid = (_blocks(L * B, ROWS), _blocks(I, COLS))
        _linear_grad_input[grid](g, a, c, k, gx, L, T, B, I, J, P, BLOCK_N=ROWS, BLOCK_I=COLS)
    return gx


def linear_grad_taps(g: torch.Tensor, xs: torch.Tensor, k: torch.Tensor, P: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S0, S1)``, each ``[J, I]``: the input at ``-k`` and at ``-k-1`` steps, summed against ``g`` over
    (t, b); the weight's gradient is ``(1 - f) S0 + f S1``, the delay's ``w (S1 - S0)``."""
    T, B, J = g.shape
    I = xs.shape[2]
    s0, s1 = g.new_empty((J, I)), g.new_empty((J, I))
    if s0.numel():
        grid = (_blocks(J, TAPS), _blocks(I, TAPS))
        _linear_grad_taps[grid](g, xs, k, s0, s1, T, B, I, J, P, BLOCK_J=TAPS, BLOCK_I=TAPS, BLOCK_N=ROWS)
    return s0, s1


def channel_forward(xs: torch.Tensor, a: torch.Tensor, f: torch.Tensor, k: torch.Tensor, T: int, P: int
                    ) -> torch.Tensor:
    """``y [T, B, C]`` with ``y[t, b, c] = a[c] xs[P+t-k[c], b, c] + f[c] xs[P+t-k[c]-1, b, c]``."""
    _, B, C = xs.shape
    y = xs.new_empty((T, B, C))
    if y.numel():
        _channel_forward[(_blocks(T * B, ROWS), _blocks(C, COLS))](xs, a, f, k, y, T, B, C, P,
                                                                    BLOCK_N=ROWS, BLOCK_C=COLS)
    return y


def channel_grad_input(g: torch.Tensor, a: torch.Tensor, f: torch.Tensor, k: torch.Tensor, L: int, P: int
                       ) -> torch.Tensor:
    """The gradient of ``xs [L, B, C]`` from that of ``y``, ``g [T, B, C]``."""
    T, B, C = g.shape
    gx = g.new_empty((L, B, C))
    if gx.numel():
        _channel_grad_input[(_blocks(L * B, ROWS), _blocks(C, COLS))](g, a, f, k, gx, L, T, B, C, P,
                                                                       BLOCK_N=ROWS, BLOCK_C=COLS)
    return gx


def channel_grad_delay(g: torch.Tensor, xs: torch.Tensor, k: torch.Tensor, P: int) -> torch.Tensor:
    """``[C]``: ``sum_{t,b} g[t,b,c] (xs[P+t-k-1, b, c] - xs[P+t-k, b, c])``, in blocks of rows summed in order."""
    T, B, C = g.shape
    part = g.new_zeros((_blocks(T * B, ROWS), C))
    if T * B and C:
        _channel_grad_delay[(part.shape[0], _blocks(C, COLS))](g, xs, k, part, T, B, C, P,
                                                               BLOCK_N=ROWS, BLOCK_C=COLS)
    return part.sum(0)
