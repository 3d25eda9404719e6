"""Triton kernels of the delay layers (:mod:`flexsn_dsl.delays`): a stage of their own beside the neurons'.

A sequence ``xs [L, B, I]`` (contiguous) holds ``P`` steps of history and then the call's ``T`` steps; output
step ``t`` reads ``xs[P + t - k]`` and ``xs[P + t - k - 1]`` (zero before the first step). The interpolation is
folded into two taps per synapse, ``a = w (1 - f)`` and ``c = w f`` (computed by the caller, in the call's
dtype: the kernels hold no floating-point literal), so that

- :func:`linear_forward`: ``y[t, b, j] = bias[j] + sum_i a[j,i] xs[P+t-k, b, i] + c[j,i] xs[P+t-k-1, b, i]``,
  a loop over ``i`` for each tile of outputs ``j`` by steps ``t`` (of one ``b``);
- :func:`linear_grad_input`: the same sum transposed, written as a gather over ``j`` for each tile of inputs
  ``i`` by steps ``s``: ``xs[s]`` receives from ``y[s - P + k]`` (tap ``a``) and ``y[s - P + k + 1]`` (tap ``c``);
- :func:`linear_grad_taps`: ``S0[j,i] = sum_{t,b} g[t,b,j] xs[P+t-k, b, i]`` and ``S1`` (the same at
  ``-k-1``), each program summing one row ``j`` and block of ``i`` over ``b`` and blocks of ``t`` in a fixed
  order: deterministic, no atomics;
- :func:`channel_forward`, :func:`channel_grad_input`, :func:`channel_grad_delay`: the same for one delay
  per channel (``y[t, b, c] = a[c] xs[P+t-k, b, c] + f[c] xs[P+t-k-1, b, c]``), the delay's partial sums
  one row of blocks per program, summed by the caller.

Sparse inputs (spikes: SHD's are at about 1 %) take event kernels instead, where at most ``EVENT_DENSITY`` of
``xs``'s entries are nonzero (:func:`sparse`, decided once a call): each nonzero ``(s, b, i)`` is one event,
and the work is per event rather than per (step, input) pair. Zeros are skipped, not multiplied: a NaN or
infinite weight or gradient meets only the nonzero entries.

- :func:`linear_forward`: one program per ``b`` and block of outputs ``j`` adds each event of sample ``b``, in
  the order (s, i), to the two steps its taps reach (``y[s-P+k] += a v``, ``y[s-P+k+1] += c v``). Only that
  program writes those (b, j) columns, each element from one lane, so the sums run in one fixed order: the adds
  are atomic only so that a lane's successive adds to one element are ordered, and the result is deterministic;
- :func:`linear_grad_taps`: one program per input ``i`` and block of ``j`` gathers ``g`` at the steps each of
  channel ``i``'s events reached, in the order (b, s), into ``S0``/``S1`` in registers.

The dense linear kernels read time-major copies, ``xs`` and ``g`` as ``[B, n, steps]`` (made by the host functions
for the call, as are the forward's taps transposed to ``[I, J]``): a tile's axis along time is contiguous
in memory, so that its loads are coalesced whatever the delays (in ``[steps, B, n]`` each synapse's delay
puts a lane's load in its own row, ``B * n`` elements from its neighbour's). Nothing of size ``max_delay``
is allocated: the delays are indices. Offsets are int32 (each tensor below 2**31 elements, checked by the
host functions)."""
from __future__ import annotations

import torch

from .triton_settings import triton  # (Triton imported after the interpreter's switch)

import triton.language as tl  # noqa: E402

__all__ = ["channel_forward", "channel_grad_delay", "channel_grad_input", "linear_forward", "linear_grad_input",
           "linear_grad_taps", "sparse"]

STEPS = 64  # steps t (forward, taps) or s (grad of the input) of a linear kernel's tile: contiguous in memory
SYNAPSES = 32  # outputs j (forward) or inputs i (backward) of a linear kernel's tile
EVENT_SYNAPSES = 128  # outputs j of an event program: one element a lane (32 lanes x 4 warps), none repeated
# at most this fraction of the input's entries nonzero: the event kernels; more, the dense ones (a first estimate
# from the work each does, an event's two scattered adds against a dense step's two loads and two fmas per
# input: to be measured on the GPU, `benchmarks/delay_bench.py --event-density`)
EVENT_DENSITY = 0.02
# the event forward runs a program per sample and block of outputs, each through all its sample's events in
# turn: with fewer programs than this (a batch of one, streaming) the dense forward, spread over steps, runs
EVENT_PROGRAMS = 128
ROWS = 32  # rows (t, b) of a channel kernel's tile
COLS = 32  # channels of a channel kernel's tile


@triton.jit
def _linear_forward(xt, a, c, k, bias, y, T, B, I, J, P,
                    HAS_BIAS: tl.constexpr, BLOCK_J: tl.constexpr, BLOCK_T: tl.constexpr):
    # a flat grid over (b, block of t, block of j), j the fastest: programs side by side read the same rows
    p, blocks_j, blocks_t = tl.program_id(0), tl.cdiv(J, BLOCK_J), tl.cdiv(T, BLOCK_T)
    b = p // (blocks_j * blocks_t)
    t = p // blocks_j % blocks_t * BLOCK_T + tl.arange(0, BLOCK_T)
    j = p % blocks_j * BLOCK_J + tl.arange(0, BLOCK_J)
    col = j < J
    inside = col[:, None] & (t < T)[None, :]
    acc = tl.zeros((BLOCK_J, BLOCK_T), dtype=y.dtype.element_ty)
    if HAS_BIAS:
        acc += tl.load(bias + j, mask=col, other=0)[:, None]
    for i in range(I):
        kj = tl.load(k + i * J + j, mask=col, other=0)  # (taps [I, J])
        aj = tl.load(a + i * J + j, mask=col, other=0)
        cj = tl.load(c + i * J + j, mask=col, other=0)
        s = (P + t)[None, :] - kj[:, None]
        at = xt + (b * I + i) * (P + T) + s
        x0 = tl.load(at, mask=inside & (s >= 0), other=0)
        x1 = tl.load(at - 1, mask=inside & (s >= 1), other=0)
        acc += aj[:, None] * x0 + cj[:, None] * x1
    tl.store(y + (t[None, :] * B + b) * J + j[:, None], acc, mask=inside)


@triton.jit
def _linear_grad_input(gt, a, c, k, gx, L, T, B, I, J, P, BLOCK_I: tl.constexpr, BLOCK_S: tl.constexpr):
    p, blocks_i, blocks_s = tl.program_id(0), tl.cdiv(I, BLOCK_I), tl.cdiv(L, BLOCK_S)
    b = p // (blocks_i * blocks_s)
    s = p // blocks_i % blocks_s * BLOCK_S + tl.arange(0, BLOCK_S)
    i = p % blocks_i * BLOCK_I + tl.arange(0, BLOCK_I)
    col = i < I
    inside = col[:, None] & (s < L)[None, :]
    acc = tl.zeros((BLOCK_I, BLOCK_S), dtype=gx.dtype.element_ty)
    for j in range(J):
        kj = tl.load(k + j * I + i, mask=col, other=0)
        aj = tl.load(a + j * I + i, mask=col, other=0)
        cj = tl.load(c + j * I + i, mask=col, other=0)
        t = (s - P)[None, :] + kj[:, None]  # y[t] reads xs[s] through tap a, y[t + 1] through tap c
        at = gt + (b * J + j) * T + t
        g0 = tl.load(at, mask=inside & (t >= 0) & (t < T), other=0)
        g1 = tl.load(at + 1, mask=inside & (t >= -1) & (t < T - 1), other=0)
        acc += aj[:, None] * g0 + cj[:, None] * g1
    tl.store(gx + (s[None, :] * B + b) * I + i[:, None], acc, mask=inside)


@triton.jit
def _linear_grad_taps(gt, xt, k, s0, s1, T, B, I, J, P, BLOCK_I: tl.constexpr, BLOCK_T: tl.constexpr):
    p, blocks_i = tl.program_id(0), tl.cdiv(I, BLOCK_I)
    j = p // blocks_i
    i = p % blocks_i * BLOCK_I + tl.arange(0, BLOCK_I)
    col = i < I
    kj = tl.load(k + j * I + i, mask=col, other=0)
    acc0 = tl.zeros((BLOCK_I, BLOCK_T), dtype=s0.dtype.element_ty)  # (summed over t once, at the end)
    acc1 = tl.zeros((BLOCK_I, BLOCK_T), dtype=s0.dtype.element_ty)
    for b in range(B):
        for t0 in range(0, T, BLOCK_T):
            t = t0 + tl.arange(0, BLOCK_T)
            row = t < T
            g = tl.load(gt + (b * J + j) * T + t, mask=row, other=0)
            s = (P + t)[None, :] - kj[:, None]
            inside = col[:, None] & row[None, :]
            at = xt + (b * I + i[:, None]) * (P + T) + s
            x0 = tl.load(at, mask=inside & (s >= 0), other=0)
            x1 = tl.load(at - 1, mask=inside & (s >= 1), other=0)
            acc0 += x0 * g[None, :]
            acc1 += x1 * g[None, :]
    tl.store(s0 + j * I + i, tl.sum(acc0, axis=1), mask=col)
    tl.store(s1 + j * I + i, tl.sum(acc1, axis=1), mask=col)


@triton.jit
def _linear_forward_events(start, s_of, i_of, v_of, a, c, k, y, T, B, J, P, BLOCK_J: tl.constexpr):
    b, j = tl.program_id(0), tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    col = j < J
    for e in range(tl.load(start + b), tl.load(start + b + 1)):  # sample b's events, in the order (s, i)
        s, i, v = tl.load(s_of + e), tl.load(i_of + e), tl.load(v_of + e)
        t = s - P + tl.load(k + i * J + j, mask=col, other=0)  # (taps [I, J]) the step tap a reaches
        at = y + (t * B + b) * J + j
        tl.atomic_add(at, tl.load(a + i * J + j, mask=col, other=0) * v, mask=col & (t >= 0) & (t < T), sem="relaxed")
        tl.atomic_add(at + B * J, tl.load(c + i * J + j, mask=col, other=0) * v, mask=col & (t >= -1) & (t < T - 1),
                      sem="relaxed")


@triton.jit
def _linear_grad_taps_events(start, b_of, s_of, v_of, g, k, s0, s1, T, B, I, J, P, BLOCK_J: tl.constexpr):
    i, j = tl.program_id(0), tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    col = j < J
    kj = tl.load(k + j * I + i, mask=col, other=0)
    acc0 = tl.zeros((BLOCK_J,), dtype=s0.dtype.element_ty)
    acc1 = tl.zeros((BLOCK_J,), dtype=s0.dtype.element_ty)
    for e in range(tl.load(start + i), tl.load(start + i + 1)):  # channel i's events, in the order (b, s)
        b, s, v = tl.load(b_of + e), tl.load(s_of + e), tl.load(v_of + e)
        t = s - P + kj
        at = g + (t * B + b) * J + j
        acc0 += v * tl.load(at, mask=col & (t >= 0) & (t < T), other=0)
        acc1 += v * tl.load(at + B * J, mask=col & (t >= -1) & (t < T - 1), other=0)
    tl.store(s0 + j * I + i, acc0, mask=col)
    tl.store(s1 + j * I + i, acc1, mask=col)


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


def _int32(*sizes: int) -> None:
    """Raises where an index of the call would not fit the kernels' int32 offsets."""
    if max(sizes) >= 2**31:
        raise ValueError(f"the delay kernels index with int32: each tensor of the call must have fewer than 2**31 "
                         f"elements, got {max(sizes)}; call the layer on fewer steps or a smaller batch")


def sparse(xs: torch.Tensor) -> bool:
    """Whether the event kernels take ``xs``: at most ``EVENT_DENSITY`` of its entries nonzero. Counting them waits
    for the GPU, so a call decides once (its backward follows the forward's choice), and never while a CUDA graph
    is captured or torch.compile traces (the dense kernels, which wait for nothing, run there)."""
    if EVENT_DENSITY <= 0 or torch.compiler.is_compiling() or (xs.is_cuda and torch.cuda.is_current_stream_capturing()):
        return False
    return torch.count_nonzero(xs).item() <= EVENT_DENSITY * xs.numel()


def _events(xs: torch.Tensor, order: tuple[int, int, int]) -> tuple[torch.Tensor, ...]:
    """The nonzero entries of ``xs [L, B, I]`` as events sorted by the axes in ``order`` (the first groups them):
    ``(start, the second axis's index, the third's, value)``, ``start[g]`` the first event of group ``g``."""
    moved = xs.permute(order)
    group, second, third = moved.nonzero(as_tuple=True)  # (row-major order: sorted by group, second, third)
    counts = torch.bincount(group, minlength=moved.shape[0])
    start = torch.cat([counts.new_zeros(1), counts.cumsum(0)]).to(torch.int32)
    return start, second.to(torch.int32), third.to(torch.int32), moved[group, second, third].contiguous()


def _time_major(x: torch.Tensor) -> torch.Tensor:
    """``x [steps, B, n]`` as ``[B, n, steps]``, contiguous: each (b, n)'s steps in a row (a transient copy)."""
    return x.permute(1, 2, 0).contiguous()


def linear_forward(xs: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None,
                   T: int, P: int, events: bool = False) -> torch.Tensor:
    """``y [T, B, J]`` of the delayed linear map (the module's forward, see the module docstring); ``events``:
    the event kernel (``sparse(xs)``), where the batch gives it ``EVENT_PROGRAMS`` programs or more."""
    L, B, I = xs.shape
    J = a.shape[0]
    y = xs.new_empty((T, B, J))
    if y.numel():
        _int32(L * B * I, T * B * J)
        if events and B * _blocks(J, EVENT_SYNAPSES) >= EVENT_PROGRAMS:
            y = bias.expand(T, B, J).contiguous() if bias is not None else torch.zeros_like(y)
            _linear_forward_events[(B, _blocks(J, EVENT_SYNAPSES))](*_events(xs, (1, 0, 2)),  # by b, then (s, i)
                                                                   a.T.contiguous(), c.T.contiguous(),
                                                                   k.T.contiguous(), y, T, B, J, P,
                                                                   BLOCK_J=EVENT_SYNAPSES, num_warps=4)
            return y
        grid = (B * _blocks(J, SYNAPSES) * _blocks(T, STEPS),)
        _linear_forward[grid](_time_major(xs), a.T.contiguous(), c.T.contiguous(), k.T.contiguous(),
                              bias if bias is not None else a, y, T, B, I, J, P,
                              HAS_BIAS=bias is not None, BLOCK_J=SYNAPSES, BLOCK_T=STEPS)
    return y


def linear_grad_input(g: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, L: int, P: int
                      ) -> torch.Tensor:
    """The gradient of ``xs [L, B, I]`` from that of ``y``, ``g [T, B, J]``."""
    T, B, J = g.shape
    I = a.shape[1]
    gx = g.new_empty((L, B, I))
    if gx.numel():
        _int32(L * B * I, T * B * J)
        grid = (B * _blocks(I, SYNAPSES) * _blocks(L, STEPS),)
        _linear_grad_input[grid](_time_major(g), a.contiguous(), c.contiguous(), k.contiguous(), gx, L, T, B, I, J,
                                 P, BLOCK_I=SYNAPSES, BLOCK_S=STEPS)
    return gx


def linear_grad_taps(g: torch.Tensor, xs: torch.Tensor, k: torch.Tensor, P: int, events: bool = False
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S0, S1)``, each ``[J, I]``: the input at ``-k`` and at ``-k-1`` steps, summed against ``g`` over
    (t, b); the weight's gradient is ``(1 - f) S0 + f S1``, the delay's ``w (S1 - S0)``. ``events``: the event
    kernel (``sparse(xs)``)."""
    T, B, J = g.shape
    L, _, I = xs.shape
    s0, s1 = g.new_empty((J, I)), g.new_empty((J, I))
    if s0.numel():
        _int32(L * B * I, T * B * J)
        if events:
            _linear_grad_taps_events[(I, _blocks(J, EVENT_SYNAPSES))](*_events(xs, (2, 1, 0)),  # by i, then (b, s)
                                                                     g.contiguous(), k.contiguous(), s0, s1,
                                                                     T, B, I, J, P, BLOCK_J=EVENT_SYNAPSES,
                                                                     num_warps=4)
            return s0, s1
        _linear_grad_taps[(J * _blocks(I, SYNAPSES),)](_time_major(g), _time_major(xs), k.contiguous(), s0, s1,
                                                       T, B, I, J, P, BLOCK_I=SYNAPSES, BLOCK_T=STEPS)
    return s0, s1


def channel_forward(xs: torch.Tensor, a: torch.Tensor, f: torch.Tensor, k: torch.Tensor, T: int, P: int
                    ) -> torch.Tensor:
    """``y [T, B, C]`` with ``y[t, b, c] = a[c] xs[P+t-k[c], b, c] + f[c] xs[P+t-k[c]-1, b, c]``."""
    _, B, C = xs.shape
    y = xs.new_empty((T, B, C))
    if y.numel():
        _int32(xs.numel())
        _channel_forward[(_blocks(T * B, ROWS), _blocks(C, COLS))](xs, a, f, k, y, T, B, C, P,
                                                                    BLOCK_N=ROWS, BLOCK_C=COLS)
    return y


def channel_grad_input(g: torch.Tensor, a: torch.Tensor, f: torch.Tensor, k: torch.Tensor, L: int, P: int
                       ) -> torch.Tensor:
    """The gradient of ``xs [L, B, C]`` from that of ``y``, ``g [T, B, C]``."""
    T, B, C = g.shape
    gx = g.new_empty((L, B, C))
    if gx.numel():
        _int32(gx.numel())
        _channel_grad_input[(_blocks(L * B, ROWS), _blocks(C, COLS))](g, a, f, k, gx, L, T, B, C, P,
                                                                       BLOCK_N=ROWS, BLOCK_C=COLS)
    return gx


def channel_grad_delay(g: torch.Tensor, xs: torch.Tensor, k: torch.Tensor, P: int) -> torch.Tensor:
    """``[C]``: ``sum_{t,b} g[t,b,c] (xs[P+t-k-1, b, c] - xs[P+t-k, b, c])``, in blocks of rows summed in order."""
    T, B, C = g.shape
    part = g.new_zeros((_blocks(T * B, ROWS), C))
    if T * B and C:
        _int32(xs.numel())
        _channel_grad_delay[(part.shape[0], _blocks(C, COLS))](g, xs, k, part, T, B, C, P,
                                                               BLOCK_N=ROWS, BLOCK_C=COLS)
    return part.sum(0)
