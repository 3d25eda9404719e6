"""Triton kernels of the delay layers (:mod:`flexsn_dsl.delays`): a stage of their own beside the neurons'.

A sequence ``xs [L, B, I]`` (contiguous) holds ``P`` steps of history and then the call's ``T`` steps; output
step ``t`` reads ``xs[P + t - k]`` and ``xs[P + t - k - 1]`` (zero before the first step). The interpolation is
folded into two taps per synapse, ``a = w (1 - f)`` and ``c = w f`` (computed by the caller, in the call's
dtype: the kernels hold no floating-point literal), so that

- :func:`linear_forward`: ``y[t, b, j] = bias[j] + sum_i a[j,i] xs[P+t-k, b, i] + c[j,i] xs[P+t-k-1, b, i]``;
- :func:`linear_grad_input`: the same sum transposed: ``xs[s]`` receives from ``y[s - P + k]`` (tap ``a``) and
  ``y[s - P + k + 1]`` (tap ``c``);
- :func:`linear_grad_taps`: ``S0[j,i] = sum_{t,b} g[t,b,j] xs[P+t-k, b, i]`` and ``S1`` (the same at
  ``-k-1``), each program summing one row ``j`` and block of ``i`` over ``b`` and blocks of ``t`` in a fixed
  order: deterministic, no atomics;
- :func:`channel_forward`, :func:`channel_grad_input`, :func:`channel_grad_delay`: the same for one delay
  per channel (``y[t, b, c] = a[c] xs[P+t-k, b, c] + f[c] xs[P+t-k-1, b, c]``), the delay's partial sums
  one row of blocks per program, summed by the caller.

The first two are one kernel, :func:`_delayed_sum`, a loop over the summed axis for each tile of outputs by
steps (of one ``b``). Each input value it loads serves both taps: ``now[u] += a x`` and ``later[u] += c x``,
``later`` belonging to the next step (the forward) or the one before (the input's gradient); the two tiles are
added onto a zeroed output, each element receiving exactly two adds, which sum the same in either order. So
a synapse-step costs one load and two fmas (the tap and the offset of each synapse come in one contiguous row,
``(a, c, offset, 0)``, a tile's worth a load).

Sparse inputs (spikes: SHD's are at about 1 %) take event kernels instead, where few enough of ``xs``'s entries
are nonzero (:func:`event_kernels`, decided once a call, for the forward and the tap gradients apart): each
nonzero ``(s, b, i)`` is one event, and the work is per event rather than per (step, input) pair. Zeros are
skipped, not multiplied: a NaN or infinite weight or gradient meets only the nonzero entries.

- :func:`linear_forward`: one program per ``b``, block of outputs ``j`` and block of steps adds each event of
  sample ``b`` that reaches its steps, in the order (s, i), to the steps its taps reach (``y[s-P+k] += a v``,
  ``y[s-P+k+1] += c v``) among its own. Only that program writes those elements, each from one lane, so the sums
  run in one fixed order: the adds are atomic only so that a lane's successive adds to one element are ordered,
  and the result is deterministic. (The blocks are narrow, 32 outputs, so that the outputs the programs on the GPU
  add to stay in the L2 cache; an event is read by each block its taps can reach, at most
  ``(max_delay + 1) / steps + 2`` of them.)
- :func:`linear_grad_taps`: one program per input ``i``, block of ``j`` and block of ``EVENT_ROWS`` batch rows
  gathers ``g`` at the steps each of channel ``i``'s events reached, in the order (b, s) and ``TAP_EVENTS`` at a
  time, into partial sums of ``S0``/``S1`` in registers, which the host sums (a fixed order too). It reads ``g``
  time-major: each lane's two steps share a sector.

The events are listed in two passes over ``xs``, each a program per sample, block of inputs and chunk of steps,
copying nothing and sorting nothing: :func:`count_events` counts each program's events per step and per input (and
the host sums them up: where each program's events start in each list, and their number, the call's one wait for the
GPU, :func:`event_kernels`); :func:`list_events` writes them there, in each kernel's order at once: the forward's
list grouped by ``(b, s)`` in the order ``i``, the tap gradients' grouped by ``(i, b)`` in the order ``s`` (the layer
keeps that one for the backward instead of ``xs``).

The dense linear kernels read time-major copies, ``xs`` and ``g`` as ``[B, n, steps]`` padded with zeros on
both sides (made for the call by :func:`_time_major_rows`, in one pass): a tile's axis along time is contiguous
in memory, so that its loads are coalesced whatever the delays, and padded, so that no load needs a mask
(``xs[s]`` sits at ``reach + s``, ``reach = floor(max_delay) + 1`` steps of zeros before it). The padding is the
only size the longest delay adds, to a transient copy: nothing held for the backward grows with ``max_delay``,
and the delays are indices. Offsets are int32 (each tensor below 2**31 elements, checked by the host functions)."""
from __future__ import annotations

import math
import warnings
from collections import OrderedDict
from typing import NamedTuple

import torch

from .triton_settings import triton  # (Triton imported after the interpreter's switch)

import triton.language as tl  # noqa: E402

__all__ = ["EventChoice", "EventCounts", "EventList", "channel_forward", "channel_grad_delay", "channel_grad_input",
           "count_events", "event_kernels", "linear_forward", "linear_grad_input", "linear_grad_taps", "list_events"]

STEPS = 128  # steps of a dense linear kernel's tile (one warp, four a lane): contiguous in memory
SYNAPSES = 8  # outputs j (forward) or inputs i (backward) of a dense linear kernel's tile
TAP_SYNAPSES = 16  # inputs i of a dense tap-gradient tile (twice the others': half the time on an H100)
EVENT_SYNAPSES = 128  # outputs j of an event tap-gradient program: one element a lane (32 lanes x 4 warps)
# the event kernels where the input is this sparse or sparser, at the crossovers with the dense kernels measured on
# an H100 (`benchmarks/delay_bench.py --kernels`, BENCHMARKS.md): the tap gradients' where the input's density is
# at most EVENT_TAPS (about 0.079 for 700 -> 256 and 0.077 for 256 -> 256 at reach 65, higher at 513); the
# forward's where its density times the cost of its events per event it adds is at most EVENT_FORWARD. A block of
# EVENT_STEPS steps reads the events of its steps and of the reach before them, and an event read but not added
# costs EVENT_READ of one added: so the cost is 1 + EVENT_READ * (EVENT_STEPS + reach) / EVENT_STEPS (crossovers
# 0.0177 at reach 65, 0.0151 at 257, 0.0127 at 513; measured 0.0173-0.0183, 0.0144 and 0.0131-0.0133)
EVENT_TAPS = 0.075
EVENT_FORWARD = 0.020
EVENT_READ = 0.064
# the event forward runs a program per sample, block of outputs and block of steps, each through the events that
# reach its steps in turn: with fewer programs than this (a batch of one, streaming) the dense forward runs
EVENT_PROGRAMS = 128
# its blocks: EVENT_OUTPUTS outputs (one warp, one a lane) by EVENT_STEPS steps. Few outputs, so that the
# elements the programs on the GPU add to at once stay in the L2 cache (700 -> 256 at density 0.01 on an H100,
# reach 65: 31.6 ms in blocks of 128 x 128, 13.9 ms in blocks of 128 x 16), and many steps, so that an event is
# read by few blocks: at density 0.01 on an H200 (BENCHMARKS.md), blocks of 32 x 64 against 128 x 16 took 10.6
# against 10.9 ms at reach 65, 11.2 against 14.3 ms at 257 and 12.1 against 22.7 ms at 513 (`delay_bench.py --blocks`)
EVENT_OUTPUTS = 32
EVENT_STEPS = 64
TAP_EVENTS = 16  # events an event tap-gradient program loads at once (1 to 16: 8.2 to 7.5 ms at density 0.01)
LIST_INPUTS = 128  # inputs of an event-counting or listing program (count_events, list_events): a row a step
LIST_CHUNK = 256  # steps of such a program, in tiles of COUNT_STEPS (counting) or LIST_STEPS (listing) steps
COUNT_STEPS = 16
# the listing walks its steps one at a time in one warp: both lists of SHD's input at 1 % (1,383 x 256 x 700) took
# 1.18 ms on an H100 so, 2.49 ms in tiles of 16 steps and 4 warps (the by-step list alone: 0.78 against 1.97 ms),
# 1.26 to 25.7 ms in the 16 other shapes tried, tiles of 1 to 32 steps in 1 to 4 warps (BENCHMARKS.md)
LIST_STEPS = 1
LIST_WARPS = 1
EVENT_ROWS = 32  # batch rows of an event tap-gradient program (its partial sums summed after: shorter chains)
ROWS = 32  # rows (t, b) of a channel kernel's tile
COLS = 32  # channels of a channel kernel's tile
COPY_TILE = 32  # steps, and channels, of a time-major copy's tile


@triton.jit
def _tap_row(taps, n, BLOCK: tl.constexpr):
    """Synapses ``n`` of one row of ``taps [rows, cols, 4]``, ``(a, c, offset)`` each: one contiguous load."""
    both, offset_ = tl.split(tl.reshape(tl.load(taps + n[:, None] * 4 + tl.arange(0, 4)[None, :]), (BLOCK, 2, 2)))
    a, offset = tl.split(both)
    c, _ = tl.split(offset_)
    return a, c, offset.to(tl.int32)


@triton.jit
def _delayed_sum(src, taps, bias, out, N, B, M, Q, W, SHIFT: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_Q: tl.constexpr, BLOCK_U: tl.constexpr):
    # out[u, b, q] += sum_r a src[b, r, o + u] and out[u + SHIFT, b, q] += sum_r c src[b, r, o + u] over the M
    # rows r ((a, c, o) the taps of (r, q)), over steps u from -1 (SHIFT 1: a step before the first reaches the
    # first) or 0; a flat grid over (b, block of u, block of q), q the fastest: programs side by side read the
    # same rows
    p, blocks_q = tl.program_id(0), tl.cdiv(Q, BLOCK_Q)
    blocks_u = tl.cdiv(N + (SHIFT > 0), BLOCK_U)
    b = p // (blocks_q * blocks_u)
    u = p // blocks_q % blocks_u * BLOCK_U + tl.arange(0, BLOCK_U) - (SHIFT > 0)
    q = p % blocks_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    now = tl.zeros((BLOCK_Q, BLOCK_U), dtype=out.dtype.element_ty)
    later = tl.zeros((BLOCK_Q, BLOCK_U), dtype=out.dtype.element_ty)
    if HAS_BIAS:
        now += tl.load(bias + q, mask=q < Q, other=0)[:, None]
    row = src + b * M * W + u[None, :]
    for r in range(M):  # (the taps padded to whole blocks of q, the rows to whole blocks of u: no masks)
        a, c, o = _tap_row(taps + r * blocks_q * BLOCK_Q * 4, q, BLOCK_Q)
        x = tl.load(row + r * W + o[:, None])
        now += a[:, None] * x
        later += c[:, None] * x
    # each element receives two adds, now's and later's, onto zero: the same sum in either order
    at = out + (u[None, :] * B + b) * Q + q[:, None]
    col = (q < Q)[:, None]
    tl.atomic_add(at, now, mask=col & ((u >= 0) & (u < N))[None, :], sem="relaxed")
    v = u + SHIFT
    tl.atomic_add(at + SHIFT * B * Q, later, mask=col & ((v >= 0) & (v < N))[None, :], sem="relaxed")


@triton.jit
def _linear_grad_taps(gp, xp, o, s0, s1, B, I, J, W, TG, BLOCK_I: tl.constexpr, BLOCK_V: tl.constexpr):
    # S0[j, i] = sum_{b, v} xp[b, i, o - 1 + v] gp[b, j, v] and S1 with gp[b, j, v + 1] (gp[v] = g[v - 1]); one
    # program per row j and block of i, summing over b and blocks of v in a fixed order
    p, blocks_i = tl.program_id(0), tl.cdiv(I, BLOCK_I)
    j = p // blocks_i
    i = p % blocks_i * BLOCK_I + tl.arange(0, BLOCK_I)
    rows = tl.minimum(i, I - 1)  # (rows past I read row I - 1, not stored)
    first = tl.load(o + j * blocks_i * BLOCK_I + i) - 1
    acc0 = tl.zeros((BLOCK_I, BLOCK_V), dtype=s0.dtype.element_ty)  # (summed over v once, at the end)
    acc1 = tl.zeros((BLOCK_I, BLOCK_V), dtype=s0.dtype.element_ty)
    v = tl.arange(0, BLOCK_V)
    for b in range(B):
        xrow = xp + (b * I + rows) * W + first
        grow = gp + (b * J + j) * TG
        for v0 in range(0, TG - 1, BLOCK_V):
            x = tl.load(xrow[:, None] + (v0 + v)[None, :])
            acc0 += x * tl.load(grow + v0 + v)[None, :]
            acc1 += x * tl.load(grow + v0 + 1 + v)[None, :]
    col = i < I
    tl.store(s0 + j * I + i, tl.sum(acc0, axis=1), mask=col)
    tl.store(s1 + j * I + i, tl.sum(acc1, axis=1), mask=col)


@triton.jit
def _linear_forward_events(start, s_of, i_of, v_of, a, c, k, y, T, B, J, L, P, R,  # (R: reach)
                           BLOCK_J: tl.constexpr, BLOCK_T: tl.constexpr):
    # one program per sample b, block of outputs j and block of steps: the events of b that reach those steps
    b, j = tl.program_id(0), tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J)
    t0 = tl.program_id(2) * BLOCK_T
    t1 = tl.minimum(t0 + BLOCK_T, T)
    col = j < J
    for e in range(tl.load(start + b * L + tl.maximum(t0 + P - R, 0)), tl.load(start + b * L + t1 + P)):
        s, i, v = tl.load(s_of + e), tl.load(i_of + e), tl.load(v_of + e)  # (in the order (s, i))
        t = s - P + tl.load(k + i * J + j, mask=col, other=0)  # (taps [I, J]) the step tap a reaches
        at = y + (t * B + b) * J + j
        tl.atomic_add(at, tl.load(a + i * J + j, mask=col, other=0) * v, mask=col & (t >= t0) & (t < t1),
                      sem="relaxed")
        tl.atomic_add(at + B * J, tl.load(c + i * J + j, mask=col, other=0) * v,
                      mask=col & (t + 1 >= t0) & (t + 1 < t1), sem="relaxed")


@triton.jit
def _linear_grad_taps_events(start, b_of, s_of, v_of, g, k, s0, s1, T, B, I, J, P,
                             BLOCK_J: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_E: tl.constexpr):
    # one program per input i, block of outputs j and block of batch rows: partial sums, one row of s0/s1 each;
    # BLOCK_E events at a time (their loads together), summed in a fixed order; g time-major ([B, J, T]: the two
    # taps' steps t and t + 1 of a lane in one sector)
    i, j, part = tl.program_id(0), tl.program_id(1) * BLOCK_J + tl.arange(0, BLOCK_J), tl.program_id(2)
    col = j < J
    kj = tl.load(k + j * I + i, mask=col, other=0)
    acc0 = tl.zeros((BLOCK_J,), dtype=s0.dtype.element_ty)
    acc1 = tl.zeros((BLOCK_J,), dtype=s0.dtype.element_ty)
    rows = start + i * B + part * BLOCK_B
    last = tl.load(rows + tl.minimum(BLOCK_B, B - part * BLOCK_B))
    for e0 in range(tl.load(rows), last, BLOCK_E):  # (in the order (b, s))
        e = e0 + tl.arange(0, BLOCK_E)
        has = e < last
        b, s, v = tl.load(b_of + e, mask=has, other=0), tl.load(s_of + e, mask=has, other=0), tl.load(
            v_of + e, mask=has, other=0)
        t = s[None, :] - P + kj[:, None]
        at = g + (b[None, :] * J + j[:, None]) * T + t
        m = col[:, None] & has[None, :]
        acc0 += tl.sum(v[None, :] * tl.load(at, mask=m & (t >= 0) & (t < T), other=0), axis=1)
        acc1 += tl.sum(v[None, :] * tl.load(at + 1, mask=m & (t >= -1) & (t < T - 1), other=0), axis=1)
    tl.store(s0 + (part * J + j) * I + i, acc0, mask=col)
    tl.store(s1 + (part * J + j) * I + i, acc1, mask=col)


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


@triton.jit
def _events_tile(x, b, s0, i, L, B, I, BLOCK_S: tl.constexpr):
    """Steps ``s0`` to ``s0 + BLOCK_S`` of sample ``b`` at inputs ``i``: (the steps s, ``x[s, b, i]``, 1 where that
    is nonzero and 0 elsewhere (int32))."""
    s = s0 + tl.arange(0, BLOCK_S)
    v = tl.load(x + (s[:, None] * B + b) * I + i[None, :], mask=(s < L)[:, None] & (i < I)[None, :], other=0)
    return s, v, (v != 0).to(tl.int32)


@triton.jit
def _listing_program(L, BLOCK_I: tl.constexpr, CHUNK: tl.constexpr):
    """A counting or listing program's place (a flat grid over (b, chunk of steps), then blocks of inputs): (b, its
    chunk, the chunks, its block, the blocks, the inputs ``i``, its first step and the step past its last)."""
    p, block, blocks = tl.program_id(0), tl.program_id(1), tl.num_programs(1)
    chunks = tl.cdiv(L, CHUNK)
    b, chunk = p // chunks, p % chunks
    return (b, chunk, chunks, block, blocks, block * BLOCK_I + tl.arange(0, BLOCK_I), chunk * CHUNK,
            tl.minimum(chunk * CHUNK + CHUNK, L))


@triton.jit
def _linear_count_events(x, by_step, by_input, L, B, I, BLOCK_S: tl.constexpr, BLOCK_I: tl.constexpr,
                         CHUNK: tl.constexpr):
    # by_step[b, s, block] = the events x[s, b, i] of the program's block of i; by_input[i, b, chunk] = those of
    # its chunk of s (a program per (b, chunk of steps), flat, and block of inputs)
    b, chunk, chunks, block, blocks, i, first, last = _listing_program(L, BLOCK_I, CHUNK)
    seen = tl.zeros((BLOCK_I,), dtype=tl.int32)
    for s0 in range(first, last, BLOCK_S):
        s, _, n = _events_tile(x, b, s0, i, L, B, I, BLOCK_S)
        tl.store(by_step + (b * L + s) * blocks + block, tl.sum(n, axis=1), mask=s < L)
        seen += tl.sum(n, axis=0)
    tl.store(by_input + (i * B + b) * chunks + chunk, seen, mask=i < I)


@triton.jit
def _linear_list_events(x, by_step, by_input, step_s, step_i, step_v, input_b, input_s, input_v, L, B, I,
                        STEP_LIST: tl.constexpr, INPUT_LIST: tl.constexpr, BLOCK_S: tl.constexpr,
                        BLOCK_I: tl.constexpr, CHUNK: tl.constexpr):
    # the events counted by _linear_count_events, each written at its place in each list: by_step and by_input
    # hold where each program's events start in them (the by-step list in the order (b, s, i), the by-input list
    # in the order (i, b, s)); a program walks its steps in order, and a tile's events go in order along i (to
    # the by-step list) and along s (to the by-input list)
    b, chunk, chunks, block, blocks, i, first, last = _listing_program(L, BLOCK_I, CHUNK)
    at_input = tl.load(by_input + (i * B + b) * chunks + chunk, mask=i < I, other=0)
    for s0 in range(first, last, BLOCK_S):
        s, v, n = _events_tile(x, b, s0, i, L, B, I, BLOCK_S)
        has = n != 0
        if STEP_LIST:
            at = tl.load(by_step + (b * L + s) * blocks + block, mask=s < L, other=0)[:, None] + tl.cumsum(n, 1) - n
            tl.store(step_s + at, tl.broadcast_to(s[:, None], (BLOCK_S, BLOCK_I)), mask=has)
            tl.store(step_i + at, tl.broadcast_to(i[None, :], (BLOCK_S, BLOCK_I)), mask=has)
            tl.store(step_v + at, v, mask=has)
        if INPUT_LIST:
            at = at_input[None, :] + tl.cumsum(n, 0) - n
            tl.store(input_b + at, tl.full((BLOCK_S, BLOCK_I), 0, tl.int32) + b, mask=has)
            tl.store(input_s + at, tl.broadcast_to(s[:, None], (BLOCK_S, BLOCK_I)), mask=has)
            tl.store(input_v + at, v, mask=has)
            at_input += tl.sum(n, axis=0)


@triton.jit
def _time_major_rows(x, rows, L, B, N, W, before, BLOCK_S: tl.constexpr, BLOCK_N: tl.constexpr):
    # rows[b, n, w] = x[w - before, b, n] (zero outside x's steps): a tile of steps by channels of one b, read
    # along n and written along w; a flat grid over (b, block of n, block of w)
    p, blocks_n, blocks_w = tl.program_id(0), tl.cdiv(N, BLOCK_N), tl.cdiv(W, BLOCK_S)
    b = p // (blocks_n * blocks_w)
    n = p // blocks_w % blocks_n * BLOCK_N + tl.arange(0, BLOCK_N)
    w = p % blocks_w * BLOCK_S + tl.arange(0, BLOCK_S)
    s = w - before
    inside = (n < N)[None, :]
    tile = tl.load(x + (s[:, None] * B + b) * N + n[None, :], mask=inside & ((s >= 0) & (s < L))[:, None], other=0)
    tl.store(rows + (b * N + n[None, :]) * W + w[:, None], tile, mask=inside & (w < W)[:, None])


def _blocks(n: int, block: int) -> int:
    return max(1, -(-n // block))


def _warps(lanes: int) -> int:
    """Warps of a program whose tile has ``lanes`` elements, one a lane."""
    return max(1, min(8, lanes // 32))


def _int32(*sizes: int) -> None:
    """Raises where an index of the call would not fit the kernels' int32 offsets."""
    if max(sizes) >= 2**31:
        raise ValueError(f"the delay kernels index with int32: each tensor of the call must have fewer than 2**31 "
                         f"elements, got {max(sizes)}; call the layer on fewer steps or a smaller batch")


class EventCounts(NamedTuple):
    """An input's events counted (:func:`count_events`): their number (None where it was not read back), and where
    the events of each listing program start in each list (int32, exclusive prefix sums, the number last):
    ``by_step [B * L * blocks + 1]`` per (b, s, block of inputs), ``by_input [I * B * chunks + 1]`` per (i, b, chunk
    of steps)."""
    count: int | None
    by_step: torch.Tensor
    by_input: torch.Tensor


class EventChoice(NamedTuple):
    """Whether the event kernels take a call's forward and its tap gradients (:func:`event_kernels`), and its input's
    events counted (None where none were: the dense kernels take both, or the call is captured in a CUDA graph)."""
    forward: bool
    taps: bool
    counts: EventCounts | None


def _forward_grid(B: int, J: int, T: int) -> tuple[int, int, int]:
    """The event forward's programs: a sample, a block of ``EVENT_OUTPUTS`` outputs and of ``EVENT_STEPS`` steps."""
    return B, _blocks(J, EVENT_OUTPUTS), _blocks(T, EVENT_STEPS)


def _capturing(xs: torch.Tensor) -> bool:
    """Whether ``xs``'s work is being captured as a CUDA graph."""
    return xs.is_cuda and torch.cuda.is_current_stream_capturing()


# each layer's last eager choice per input, which a captured call of that layer and input follows (key: the layer's
# number, the input's shape, dtype and device, and the output steps); the oldest dropped past CHOICES_KEPT
CHOICES_KEPT = 256
_chosen: OrderedDict[tuple, tuple[bool, bool]] = OrderedDict()


def event_kernels(xs: torch.Tensor, reach: int, steps: int, outputs: int, layer: int) -> EventChoice:
    """Whether the event kernels take the forward and the tap gradients of ``xs`` (taps reaching ``reach`` steps
    back, ``steps`` output steps of ``outputs`` outputs, for the layer numbered ``layer``), from its density
    (``EVENT_FORWARD``, ``EVENT_TAPS``); the forward only where the batch gives it ``EVENT_PROGRAMS`` programs or
    more. Counting its events waits for the GPU, so a call counts once (its backward follows the forward's choice).
    A call captured in a CUDA graph cannot wait: it takes the choice of the layer's last eager call on an input of
    its shape (the capture's warm-up), with no counts (the caller counts the events it lists without reading their
    number back: :func:`count_events`, :func:`list_events`); with no such call before it, the dense kernels, and a
    warning. Under torch.compile the layers' operators call it when the graph runs, not while it is traced."""
    if EVENT_FORWARD <= 0 and EVENT_TAPS <= 0:
        return EventChoice(False, False, None)
    key = (layer, tuple(xs.shape), xs.dtype, xs.device, steps)
    if _capturing(xs):
        chosen = _chosen.get(key)
        if chosen is None:
            warnings.warn(f"flexsn-dsl: DelayLinear captured in a CUDA graph without an eager call on an input of this "
                          f"shape before it runs its dense kernels: a captured call cannot count its events, so it "
                          f"follows the choice of the layer's last eager call. Warm the step up eagerly before "
                          f"capturing it (as torch's CUDA-graph docs show): inputs sparser than about "
                          f"{EVENT_FORWARD:g} (the forward) to {EVENT_TAPS:g} (the weight and delay gradients) then "
                          f"take the faster event kernels (docs/delays.md).", stacklevel=6)
            return EventChoice(False, False, None)
        return EventChoice(*chosen, None)
    counts = count_events(xs)
    density = counts.count / max(xs.numel(), 1)
    per_add = 1 + EVENT_READ * (EVENT_STEPS + reach) / EVENT_STEPS
    programs = math.prod(_forward_grid(xs.shape[1], outputs, steps))
    choice = EventChoice(EVENT_FORWARD > 0 and density * per_add <= EVENT_FORWARD and programs >= EVENT_PROGRAMS,
                         EVENT_TAPS > 0 and density <= EVENT_TAPS, counts)
    _chosen[key] = choice[:2]
    _chosen.move_to_end(key)
    if len(_chosen) > CHOICES_KEPT:
        _chosen.popitem(last=False)
    return choice


def _listing(xs: torch.Tensor) -> tuple[tuple[int, int], int, int]:
    """The grid of the listing programs over ``xs [L, B, I]``, and their blocks of inputs and chunks of steps."""
    L, B, I = xs.shape
    blocks, chunks = _blocks(I, LIST_INPUTS), _blocks(L, LIST_CHUNK)
    return (B * chunks, blocks), blocks, chunks


def count_events(xs: torch.Tensor, read: bool = True) -> EventCounts:
    """The nonzero entries (events) of ``xs [L, B, I]`` (contiguous), counted per listing program in one pass, and
    where each program's events start in each list (summed on the GPU; their number read back where ``read``: one
    wait)."""
    L, B, I = xs.shape
    grid, blocks, chunks = _listing(xs)
    by_step = xs.new_zeros(B * L * blocks + 1, dtype=torch.int32)
    by_input = xs.new_zeros(I * B * chunks + 1, dtype=torch.int32)
    if not xs.numel():
        return EventCounts(0, by_step, by_input)
    _int32(xs.numel(), len(by_step), len(by_input))
    per_step, per_input = torch.empty_like(by_step[1:]), torch.empty_like(by_input[1:])
    _linear_count_events[grid](xs, per_step, per_input, L, B, I, BLOCK_S=COUNT_STEPS, BLOCK_I=LIST_INPUTS,
                               CHUNK=LIST_CHUNK, num_warps=4)
    torch.cumsum(per_step, 0, dtype=torch.int32, out=by_step[1:])
    torch.cumsum(per_input, 0, dtype=torch.int32, out=by_input[1:])
    return EventCounts(int(by_step[-1].item()) if read else None, by_step, by_input)


class EventList(NamedTuple):
    """An input's events grouped by two of its axes, for one event kernel (:func:`list_events`): group ``g``'s
    events are ``start[g]`` to ``start[g + 1]`` (int32); per event, its index along the group's second axis and
    along the remaining one (int32), and its value; and the input's shape ``(L, B, I)``. The by-step list: groups
    ``(b, s)``, per event ``(s, i)``, in the order ``i``; the by-input list: groups ``(i, b)``, per event ``(b, s)``,
    in the order ``s``."""
    start: torch.Tensor
    second: torch.Tensor
    third: torch.Tensor
    values: torch.Tensor
    shape: tuple[int, int, int]


def list_events(xs: torch.Tensor, counts: EventCounts, by_step: bool, by_input: bool
                ) -> tuple[EventList | None, EventList | None]:
    """The events of ``xs [L, B, I]`` (contiguous; ``counts`` its :func:`count_events`) in the by-step list (the
    forward's) and the by-input list (the tap gradients'), each where asked for (None elsewhere): one pass over
    ``xs`` writes both, nothing waiting for the GPU. Where the count was not read back, each list has room for every
    entry of ``xs`` (its tail unused: the kernels read as far as ``start``'s last offset)."""
    L, B, I = xs.shape
    grid, blocks, chunks = _listing(xs)
    n = xs.numel() if counts.count is None else counts.count

    def new(offsets: torch.Tensor, every: int) -> EventList:
        return EventList(offsets[::every].contiguous(), offsets.new_empty(n), offsets.new_empty(n), xs.new_empty(n),
                         (L, B, I))
    step = new(counts.by_step, blocks) if by_step else None
    inputs = new(counts.by_input, chunks) if by_input else None
    if n and (by_step or by_input):
        unused = [counts.by_step[:1]] * 3  # (the arguments of a list not asked for: never written)
        _linear_list_events[grid](xs, counts.by_step, counts.by_input, *(step[1:4] if step else unused),
                                  *(inputs[1:4] if inputs else unused), L, B, I, STEP_LIST=by_step,
                                  INPUT_LIST=by_input, BLOCK_S=LIST_STEPS, BLOCK_I=LIST_INPUTS, CHUNK=LIST_CHUNK,
                                  num_warps=LIST_WARPS)
    return step, inputs


def _time_major(x: torch.Tensor, before: int, steps: int) -> torch.Tensor:
    """``x [n_steps, B, n]`` (contiguous) as ``[B, n, steps]``, ``x[s]`` at ``before + s`` and zeros elsewhere (a
    transient copy): each (b, n)'s steps in a row. One pass of :func:`_time_major_rows`, whose tiles read and write
    whole lines (a strided copy reads one element a line)."""
    n_steps, B, n = x.shape
    rows = x.new_empty((B, n, steps))
    if rows.numel():
        _int32(x.numel(), rows.numel())
        grid = (B * _blocks(n, COPY_TILE) * _blocks(steps, COPY_TILE),)
        _time_major_rows[grid](x, rows, n_steps, B, n, steps, before, BLOCK_S=COPY_TILE, BLOCK_N=COPY_TILE,
                               num_warps=4)
    return rows


def _input_rows(xs: torch.Tensor, T: int, P: int, reach: int) -> tuple[torch.Tensor, int]:
    """``(rows, tiles)``: ``xs`` time-major with ``xs[s]`` at ``reach + s``, long enough for ``tiles`` tiles of
    ``STEPS`` output steps from step -1 (its tap ``c`` reaches step 0), read at ``reach + P - k`` and one before."""
    tiles = _blocks(T + 1, STEPS)
    W = reach + P + tiles * STEPS
    _check(reach, P, xs.shape[1] * xs.shape[2] * W)
    return _time_major(xs, reach, W), tiles


def _tap_rows(a: torch.Tensor, c: torch.Tensor, offset: torch.Tensor, fill: int) -> torch.Tensor:
    """``[rows, cols rounded up to SYNAPSES, 4]``: ``(a, c, offset, 0)`` per synapse in ``a``'s dtype (the offsets
    whole numbers below 2**24, exact), the columns past ``cols`` zero taps at offset ``fill``."""
    rows, cols = a.shape
    taps = a.new_zeros((rows, _blocks(cols, SYNAPSES) * SYNAPSES, 4))
    taps[:, :, 2] = fill
    taps[:, :cols, 0], taps[:, :cols, 1], taps[:, :cols, 2] = a, c, offset
    return taps


def _check(reach: int, P: int, *sizes: int) -> None:
    """Raises where an index of the call would not fit the kernels' int32 offsets (or a float32 one)."""
    _int32(*sizes)
    if reach + P >= 2**24:
        raise ValueError(f"the delay kernels take steps below 2**24: max_delay plus the history's steps is {reach + P}")


def linear_forward(xs: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, bias: torch.Tensor | None,
                   T: int, P: int, reach: int, events: EventList | None = None) -> torch.Tensor:
    """``y [T, B, J]`` of the delayed linear map (the module's forward, see the module docstring), ``reach`` > every
    ``k``; ``events``: ``xs``'s by-step list (:func:`list_events`), for the event kernel (None: the dense one)."""
    L, B, I = xs.shape
    J = a.shape[0]
    if events is not None and T * B * J:
        grid = _forward_grid(B, J, T)
        _check(reach, P, L * B * I, T * B * J)
        y = xs.new_empty((T, B, J)).copy_(bias) if bias is not None else xs.new_zeros((T, B, J))
        if events.values.numel():
            _linear_forward_events[grid](*events[:4],  # by (b, s), then i
                                         a.T.contiguous(), c.T.contiguous(), k.T.contiguous(), y, T, B, J, L, P,
                                         reach, BLOCK_J=EVENT_OUTPUTS, BLOCK_T=EVENT_STEPS,
                                         num_warps=_warps(EVENT_OUTPUTS))
        return y
    y = xs.new_zeros((T, B, J))
    if y.numel():
        _int32(T * B * J)
        rows, tiles = _input_rows(xs, T, P, reach)
        taps = _tap_rows(a.T, c.T, (reach + P - k).T, reach + P)  # xs[s] at reach + s: offset reach + P - k
        _delayed_sum[(B * _blocks(J, SYNAPSES) * tiles,)](rows, taps, bias if bias is not None else y, y,
                                                          T, B, I, J, rows.shape[2],
                                                          SHIFT=1, HAS_BIAS=bias is not None, BLOCK_Q=SYNAPSES,
                                                          BLOCK_U=STEPS, num_warps=1)
    return y


def linear_grad_input(g: torch.Tensor, a: torch.Tensor, c: torch.Tensor, k: torch.Tensor, L: int, P: int,
                      reach: int) -> torch.Tensor:
    """The gradient of ``xs [L, B, I]`` from that of ``y``, ``g [T, B, J]``."""
    T, B, J = g.shape
    I = a.shape[1]
    gx = g.new_zeros((L, B, I))
    if gx.numel():
        tiles = _blocks(L, STEPS)
        W = tiles * STEPS + reach
        _check(reach, P, B * J * W, L * B * I)
        # g[t] at P + t: xs[s] reaches y[s - P + k] through tap a, y[s - P + k + 1] through tap c (to gx[s] from
        # step s + 1's sum: SHIFT -1)
        _delayed_sum[(B * _blocks(I, SYNAPSES) * tiles,)](_time_major(g, P, W), _tap_rows(a, c, k, 0), gx, gx,
                                                          L, B, J, I, W, SHIFT=-1, HAS_BIAS=False, BLOCK_Q=SYNAPSES,
                                                          BLOCK_U=STEPS, num_warps=1)
    return gx


def linear_grad_taps(g: torch.Tensor, xs: torch.Tensor | EventList, k: torch.Tensor, P: int, reach: int
                     ) -> tuple[torch.Tensor, torch.Tensor]:
    """``(S0, S1)``, each ``[J, I]``: the input at ``-k`` and at ``-k-1`` steps, summed against ``g`` over
    (t, b); the weight's gradient is ``(1 - f) S0 + f S1``, the delay's ``w (S1 - S0)``. ``xs``: the input, for the
    dense kernel, or its by-input list of events (:func:`list_events`), for the event kernel."""
    T, B, J = g.shape
    L, _, I = xs.shape
    if not J * I:
        return g.new_empty((J, I)), g.new_empty((J, I))
    if isinstance(xs, EventList):
        if not xs.values.numel():
            return g.new_zeros((J, I)), g.new_zeros((J, I))
        _int32(L * B * I, T * B * J)
        parts = _blocks(B, EVENT_ROWS)
        p0, p1 = g.new_empty((parts, J, I)), g.new_empty((parts, J, I))
        _linear_grad_taps_events[(I, _blocks(J, EVENT_SYNAPSES), parts)](*xs[:4],
                                                                        _time_major(g.contiguous(), 0, T),
                                                                        k.contiguous(), p0, p1,
                                                                        T, B, I, J, P, BLOCK_J=EVENT_SYNAPSES,
                                                                        BLOCK_B=EVENT_ROWS, BLOCK_E=TAP_EVENTS,
                                                                        num_warps=_warps(EVENT_SYNAPSES))
        return p0.sum(0), p1.sum(0)  # (by (i, b), then s)
    rows, tiles = _input_rows(xs, T, P, reach)  # (the forward's rows)
    _int32(B * J * (tiles * STEPS + 1))
    offset = k.new_full((J, _blocks(I, TAP_SYNAPSES) * TAP_SYNAPSES), reach + P)
    offset[:, :I] = reach + P - k
    s0, s1 = g.new_empty((J, I)), g.new_empty((J, I))
    _linear_grad_taps[(J * _blocks(I, TAP_SYNAPSES),)](_time_major(g, 1, tiles * STEPS + 1), rows, offset, s0, s1,
                                                       B, I, J, rows.shape[2], tiles * STEPS + 1,
                                                       BLOCK_I=TAP_SYNAPSES, BLOCK_V=STEPS, num_warps=1)
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
