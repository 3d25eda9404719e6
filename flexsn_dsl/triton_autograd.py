"""How a call's forward and backward run eagerly: the kernels' arguments (the runtime parameters as the kernels
take them, the seed of a spec with draws), the forward launch and the backward launch of a :class:`Plan`
(:func:`_forward`, :func:`_backward`; a time-parallel call's chunk kernels first, the tiled backward for
learnable shaped parameters), and the autograd Functions that run them: :class:`_TritonSteps` (the saved
values of every step) and :class:`_RecomputedSteps` (recompute: the states every chunk of steps, the saved
values computed again chunk by chunk in the backward). torch.compile runs the same passes through the
operators of :mod:`flexsn_dsl.triton_operators`."""
from __future__ import annotations

import contextlib
import math
from typing import Sequence

import torch

from .compiler import Compiled
from .triton_plan import Plan
from .triton_settings import _compute_dtype, _torch_compute_dtype, launch_settings


def shaped_view(value: torch.Tensor, step_shape: Sequence[int]) -> tuple[torch.Tensor, int, int]:
    """A shaped parameter (that broadcasts to ``step_shape``) as the values the kernels read:
    its elements over the dimensions from the first to the last it varies over, contiguous
    (a view where its shape allows; never the full step), and (inner, size): each value is
    shared by ``inner`` consecutive neurons, and the ``size`` values repeat in that order."""
    nd = len(step_shape)
    aligned = (1,) * (nd - value.dim()) + tuple(value.shape)
    varying = [d for d in range(nd) if aligned[d] != 1] or [0]
    first, last = varying[0], varying[-1] if aligned[varying[-1]] != 1 else -1
    dims = tuple(step_shape[first:last + 1])
    values = value.reshape(aligned[first:last + 1]).expand(dims).reshape(-1).contiguous()
    return values, max(math.prod(step_shape[last + 1:]), 1), math.prod(dims)


def shaped_period(layout: Sequence[int]) -> int:
    """The neurons after which every shaped parameter repeats: the largest inner * size (each is the
    product of the step's trailing dimensions from the first its parameter varies over, so the
    largest is a multiple of the others)."""
    return max(inner * size for inner, size in zip(layout[0::2], layout[1::2]))


def _shaped_gradient(partial: torch.Tensor, size: int) -> torch.Tensor:
    """A learnable shaped parameter's gradient from its partial sums [row tiles, segments, split]
    (segment j holds value j % size): the partial sums themselves where each value has one, else
    their sum over row tiles, repeats and column tiles (a fixed order: the same bits every run)."""
    if partial.numel() == size:
        return partial.view(size)
    return partial.view(partial.shape[0], -1, size, partial.shape[2]).sum((0, 1, 3))


def kernel_params(compiled: Compiled, params: dict[str, torch.Tensor], like: torch.Tensor):
    """The runtime parameters as the kernels take them, in the compute dtype of ``like`` (the
    inputs [T, ...]): each learnable scalar as a 0-dim tensor (INFO.scalar_params' order), and the
    shaped ones' values with their (inner, size) pairs (:func:`shaped_view`)."""
    model = compiled.model  # (not INFO, which imports the kernels: nothing to trace under torch.compile)
    dtype, device = _torch_compute_dtype(like.dtype), like.device
    cast = lambda p: p if p.dtype == dtype and p.device == device else p.to(device=device, dtype=dtype)  # noqa: E731
    scalars = [_scalar(cast(params[n])) for n in model.learnable if not model.parameters[n].shaped]
    shaped, layout = [], []
    for name in model.shaped:
        values, inner, size = shaped_view(cast(params[name]), like.shape[1:])
        shaped.append(values)
        layout += [inner, size]
    return scalars, shaped, layout


def _scalar(p: torch.Tensor) -> torch.Tensor:
    """A one-element parameter as a 0-dim tensor (itself when it is one: no view in the graph)."""
    return p if p.dim() == 0 else p.reshape(())


def on_device(like: torch.Tensor) -> contextlib.AbstractContextManager:
    """Make ``like``'s GPU the current one for the launches inside (Triton launches on the current
    device, whatever device the tensors are on): a CUDA device guard when it is not current, else
    nothing (CPU tensors, the usual one-GPU-per-process case). Called where kernels launch, never
    while torch.compile traces."""
    if like.is_cuda:
        index = like.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return contextlib.nullcontext()


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def new_seed(like: torch.Tensor) -> torch.Tensor:
    """The ``_seed`` of a call of a spec with draws: int64 [seed, first step], the seed drawn from torch's
    default generator of ``like``'s device (so ``torch.manual_seed`` makes the call reproducible)."""
    seed = torch.randint(0, 1 << 62, (1,), device=like.device, dtype=torch.int64)
    return torch.cat([seed, seed.new_zeros(1)])


def _forward(plan: Plan, xs, inits, params, shaped, layout, training: bool, store_seqs: bool, traced: bool = False,
             seed: torch.Tensor | None = None):
    """Run the forward kernels; returns (outputs, saved values, state sequences, final states, the
    inputs as the kernels read them). Empty ``inits`` (for a spec whose initial states are all
    constants) starts from those constants without reading any initial-state tensor. ``traced``:
    see :meth:`Plan.launch`; ``seed``: :func:`new_seed`'s, for a spec with draws."""
    n_st = plan.n_st
    const_init = not inits and n_st > 0
    if const_init and not plan.info.initial_values:
        raise ValueError(f"{plan.info.neuron}: no initial states given, and not all of them are constants")
    xs = [_contiguous(x) for x in xs]
    like = xs[0]  # contiguous: empty_like gives the same layout, and costs less than new_empty
    outs = [torch.empty_like(like) for _ in range(plan.n_out)]
    saved = [torch.empty_like(like) for _ in range(plan.n_saved)] if training else []
    seqs = [torch.empty_like(like) for _ in range(n_st)] if store_seqs else []
    finals = [like.new_empty(plan.step_sizes) for _ in range(n_st)]
    if plan.T == 0:
        finals = [f.fill_(v) for f, v in zip(finals, plan.info.initial_values)] if const_init else \
            [s.clone() for s in inits]
    elif plan.n > 0:
        _launch_forward(plan, xs, [_contiguous(s) for s in inits], outs, saved, seqs, finals, params, shaped, layout,
                        training, store_seqs, traced, seed)
    return outs, saved, seqs, finals, xs


def _seed_arg(seed: torch.Tensor | None) -> list:
    return [] if seed is None else [seed]


def _launch_forward(plan: Plan, xs, inits, outs, saved, seqs, finals, params, shaped, layout, training: bool,
                    store_seqs: bool, traced: bool = False, seed: torch.Tensor | None = None) -> None:
    """Launch the forward kernel of ``plan`` (T >= 1) writing into the tensors given (contiguous); empty
    ``inits``: the spec's constant initial states; ``seed``: the draws' (:func:`new_seed`)."""
    const_init = not inits and plan.n_st > 0
    inits = [xs[0]] * plan.n_st if const_init else inits  # (any pointer: unread when constant)
    variant, flags = plan.forwards[training, store_seqs, const_init]
    tail = [*_param_args(params, shaped, layout), *_seed_arg(seed)]
    chunks = _forward_chunks(plan, xs, inits, const_init, tail, traced)
    plan.launch(variant, [*xs, *inits, *outs, *saved, *seqs, *finals, *chunks, *tail], flags, traced)


def _forward_chunks(plan: Plan, xs, inits, const_init: bool, tail: list, traced: bool) -> list:
    """A time-parallel launch's chunk arguments: the states before each chunk and its steps, worked out
    first where there are several chunks (each chunk's map, then the maps applied in turn); ``tail``: the
    parameter and seed arguments. None for the sequential kernels."""
    if not plan.chunk:
        return []
    like = xs[0]
    if plan.chunks == 1:
        return [like, plan.chunk]  # (unread)
    compute = _torch_compute_dtype(like.dtype)
    maps = like.new_empty((plan.chunks, plan.map_rows, plan.n), dtype=compute)
    starts = like.new_empty((plan.chunks, plan.n_st, plan.n), dtype=compute)
    plan.launch_chunks("scan_summary", [*xs, maps, plan.chunk, *tail, plan.T, plan.n], plan.summary_flags, traced)
    plan.launch_chunks("scan_carry", [*inits, maps, starts, plan.chunks, plan.n], plan.carry_flags[const_init], traced)
    return [starts, plan.chunk]


def _param_args(params, shaped, layout) -> list:
    """Kernel arguments of the runtime parameters: the scalar vector (if any), then (tensor, inner, size) per
    shaped one."""
    args = [params] if params is not None else []
    for k, values in enumerate(shaped):
        args += [values, layout[2 * k], layout[2 * k + 1]]
    return args


def _stack(params: list[torch.Tensor]) -> torch.Tensor | None:
    return torch.stack(params) if params else None


def _present(grads: Sequence[torch.Tensor | None], shape: Sequence[int],
             like: torch.Tensor) -> list[torch.Tensor] | None:
    """Upstream gradients (of ``shape``) as the kernels read them: None when none was given, zeros for a missing one."""
    for g in grads:
        if g is not None:
            return [like.new_zeros(shape) if g is None else _contiguous(g) for g in grads]
    return None


def _own(read: list[torch.Tensor], given: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The upstream gradients among ``read`` (as :func:`_present` made them from ``given``) that this call made
    itself: zeros for a missing one, a contiguous copy of a broadcast or strided one. Nothing else holds them."""
    return [g for g, original in zip(read, given) if g is not original]


def _input_grads(xs: list[torch.Tensor], spare: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors for the inputs' gradients: a ``spare`` upstream gradient of the same shape and dtype where there is
    one, each used once (every backward kernel's step reads an output's upstream gradient before it writes an
    input's gradient at the same place, in the same program, and nothing reads it after), else new ones. A
    loss such as ``out.sum()`` gives a broadcast gradient, which the kernels read as a contiguous copy: the
    input's gradient then takes that copy's memory instead of a [T, ...] tensor more."""
    spare = list(spare)
    grads = []
    for x in xs:
        k = next((k for k, g in enumerate(spare) if g.shape == x.shape and g.dtype == x.dtype), None)
        grads.append(torch.empty_like(x) if k is None else spare.pop(k))
    return grads


def _backward(plan: Plan, store_seqs: bool, grads, saved, xs, outs, params, shaped, layout, init_grads: bool,
              traced: bool = False, into: tuple[list, list] | None = None, sums: torch.Tensor | None = None,
              seed: torch.Tensor | None = None):
    """Gradients of the inputs, initial states (when ``init_grads``, else []), scalar parameters
    and learnable shaped parameters (in ``shaped``'s order, None for the fixed ones) from the
    upstream gradients (None where there are none) of the outputs, state sequences (when stored)
    and final states; ``xs`` and ``outs`` as :func:`_forward` returned them, None for those the
    kernel does not read (:func:`~flexsn_dsl.triton_plan.kept_inputs`, ``kept_outputs``). ``traced``: see
    :meth:`Plan.launch`. ``into``: the (contiguous) tensors to write the gradients of the inputs and initial
    states into (T >= 1); ``sums``: each learnable parameter's running gradient sums per neuron [P, N] in the
    compute dtype, which the kernel starts from and updates (``_CARRY_SUMS``)."""
    T, n, shape, step = plan.T, plan.n, plan.shape, plan.step_sizes
    n_out, n_st = plan.n_out, plan.n_st
    like = next(t for t in (*outs, *saved, *xs) if t is not None)  # of the inputs' shape, dtype, device; contiguous
    xs = [like if x is None else x for x in xs]  # (any pointer for an input the kernel does not read)
    outs = [like if o is None else o for o in outs]  # (and for an output: kept_outputs)
    grad_outs = _present(grads[:n_out], shape, like) or [like.new_zeros(shape) for _ in range(n_out)]
    grad_seqs = _present(grads[n_out:n_out + n_st], shape, like) if store_seqs else None
    grad_finals = _present(grads[len(grads) - n_st:], step, like) if n_st else None
    grad_params = None
    learnable = plan.learnable
    if T == 0 or n == 0:
        grad_x = [torch.zeros_like(x) for x in xs]
        grad_init = ([g.clone() for g in grad_finals] if grad_finals else [like.new_zeros(step) for _ in range(n_st)]) \
            if init_grads else []
        grad_params = params.new_zeros(params.shape) if params is not None else None
        grad_shaped = [torch.zeros_like(v) if grad else None for v, grad in zip(shaped, learnable)]
    else:
        grad_x, grad_init = into or (_input_grads(xs, [] if traced else _own(grad_outs, grads[:n_out])),
                                     [like.new_empty(step) for _ in range(n_st)] if init_grads else [])
        unused = like  # a valid pointer for arguments a flag leaves unread (one the kernel does not write)
        args = [*grad_outs, *(grad_seqs or [unused] * n_st), *(grad_finals or [unused] * n_st), *saved, *xs,
                *outs, *grad_x, *(grad_init or [unused] * n_st)]
        param_args = _param_args(params, shaped, layout) if params is not None or shaped else []
        if plan.tiled:
            args += param_args
            tiling = plan.source.tiling(n, shaped_period(layout))
            partial = params.new_zeros((tiling.programs, params.shape[0])) if params is not None else None
            partials = {}  # learnable shaped parameter k -> partial sums [row tiles, segments, split]
            for k, (values, grad) in enumerate(zip(shaped, learnable)):
                if grad:
                    partials[k] = values.new_zeros(tiling.partial_shape(layout[2 * k]))
            args += [partial] if partial is not None else []
            args += [a for p in partials.values() for a in (p, p.shape[2])]
            args += ([like if sums is None else sums] if plan.carries else []) + _seed_arg(seed)
            plan.source.launch_tiled(tiling, T, args + [T, n, tiling.period], traced, plan.wide,
                                     _DTYPE=_compute_dtype(like.dtype), _HAS_STATE_GRADS=grad_seqs is not None,
                                     _HAS_FINAL_GRADS=grad_finals is not None, _WRITE_INIT_GRADS=init_grads,
                                     **({"_CARRY_SUMS": sums is not None} if plan.carries else {}))
            programs = tiling.programs
            grad_shaped = [_shaped_gradient(partials[k], v.numel()) if k in partials else None
                           for k, v in enumerate(shaped)]
        else:
            args += _backward_chunks(plan, grad_outs, grad_seqs, grad_finals, saved, xs, outs, param_args, seed,
                                     traced) + param_args
            partial = params.new_zeros((plan.programs, params.shape[0])) if params is not None else None
            flags = plan.carrying_flags if sums is not None else plan.backward_flags
            carried = [like if sums is None else sums] if plan.carries else []
            programs = plan.launch("backward", args + ([partial, *carried] if partial is not None else []) +
                                   _seed_arg(seed),
                                   flags[grad_seqs is not None, grad_finals is not None, init_grads], traced)
            grad_shaped = [None] * len(shaped)
        if partial is not None:  # only the rows this launch wrote (autotuning tries other block sizes)
            grad_params = partial[:programs].sum(0)
    return grad_x, grad_init, grad_params, grad_shaped


def _backward_chunks(plan: Plan, grad_outs, grad_seqs, grad_finals, saved, xs, outs, param_args: list, seed,
                     traced: bool) -> list:
    """:func:`_forward_chunks` for the backward: the state gradients after each chunk (each chunk's adjoint
    map, then the maps applied in turn from the last chunk)."""
    if not plan.chunk:
        return []
    like, n_st = outs[0], plan.n_st
    if plan.chunks == 1:
        return [like, plan.chunk]  # (unread)
    compute = _torch_compute_dtype(like.dtype)
    maps = like.new_empty((plan.chunks, plan.map_rows, plan.n), dtype=compute)
    starts = like.new_empty((plan.chunks, n_st, plan.n), dtype=compute)
    plan.launch_chunks("scan_adjoint_summary", [*grad_outs, *(grad_seqs or [like] * n_st), *saved, *xs, *outs, maps,
                                                plan.chunk, *param_args, *_seed_arg(seed), plan.T, plan.n],
                       plan.adjoint_summary_flags[grad_seqs is not None], traced)
    plan.launch_chunks("scan_adjoint_carry", [*(grad_finals or [like] * n_st), maps, starts, plan.chunks, plan.n],
                       plan.adjoint_carry_flags[grad_finals is not None], traced)
    return [starts, plan.chunk]


class _TritonSteps(torch.autograd.Function):
    """Fused multi-step forward and backward (eager). ``call``: (plan, store_seqs, number of inputs,
    layout, number of shaped parameters, number of scalar parameters); tensor arguments: the seed (a spec
    with draws: :func:`new_seed`, kept for the backward, which regenerates the draws), each learnable
    scalar parameter (0-dim; stacked here, so that the graph has no node of its own for that), the
    shaped parameters' values (:func:`shaped_view`), the inputs, the initial states."""

    @staticmethod
    def forward(ctx, call: tuple, *tensors):
        plan, store_seqs, n_inputs, layout, n_shaped, n_params = call
        seed, tensors = (tensors[0], tensors[1:]) if plan.info.draws else (None, tensors)
        n_x = n_params + n_shaped + n_inputs
        params = _stack(list(tensors[:n_params]))
        shaped, xs, inits = tensors[n_params:n_params + n_shaped], tensors[n_params + n_shaped:n_x], tensors[n_x:]
        outs, saved, seqs, finals, xs = _forward(plan, xs, inits, params, shaped, layout, True, store_seqs, seed=seed)
        ctx.call, ctx.n_saved, ctx.n_inits = call, len(saved), len(inits)
        ctx.save_for_backward(seed, params, *shaped, *saved,
                              *[x if keep else None for x, keep in zip(xs, plan.kept_inputs)],
                              *[o if keep else None for o, keep in zip(outs, plan.kept_outputs)])
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        plan, store_seqs, n_in, layout, n_shaped, n_params = ctx.call
        seed, params, *tensors = ctx.saved_tensors
        k = n_shaped + ctx.n_saved
        shaped, saved, xs, outs = tensors[:n_shaped], tensors[n_shaped:k], tensors[k:k + n_in], tensors[k + n_in:]
        n_seed = 0 if seed is None else 1
        init_grads = ctx.n_inits > 0 and any(ctx.needs_input_grad[1 + n_seed + n_params + n_shaped + n_in:])
        grad_x, grad_init, grad_params, grad_shaped = _backward(plan, store_seqs, grads, saved, xs, outs, params,
                                                                shaped, layout, init_grads, seed=seed)
        return (None, *[None] * n_seed, *(grad_params.unbind(0) if grad_params is not None else ()), *grad_shaped,
                *grad_x, *(grad_init or [None] * ctx.n_inits))


def _chunk_plans(plan: Plan, chunk: int, dtype: torch.dtype) -> list[tuple[int, Plan]]:
    """The plan of each chunk of ``chunk`` steps of a call of ``plan`` (the last one shorter where
    ``chunk`` does not divide T), with its first step. Never autotuned: autotuning runs a kernel several
    times, which would add the running sums that the backward carries (``_CARRY_SUMS``) more than once."""
    settings = launch_settings()._replace(autotune=False, time_parallel=False)  # (the kernels that carry sums)
    return [(t0, plan.source.plan(torch.Size((min(chunk, plan.T - t0), *plan.step)), dtype, settings))
            for t0 in range(0, plan.T, chunk)]


def _seed_from(seed: torch.Tensor | None, t0: int) -> torch.Tensor | None:
    """The seed of a launch over the steps from ``t0`` on: the draws of those steps of the whole call."""
    return None if seed is None else seed + seed.new_tensor([0, t0])


def _checkpointed_forward(plan: Plan, chunk: int, xs, inits, params, shaped, layout, store_seqs: bool, seed=None):
    """The inference kernel over one chunk of steps at a time, each from the states the last one ended
    with (the first from ``inits``, contiguous, or the constant initial states where there are none):
    (outputs, state sequences (if stored), final states, checkpoints: the states before each
    chunk after the first, kept in the compute dtype so that a chunk restarts from the very values
    a single launch carries from step to step)."""
    like = xs[0]
    step, n_st = plan.step_sizes, plan.n_st
    compute = _torch_compute_dtype(like.dtype)
    outs = [torch.empty_like(like) for _ in range(plan.n_out)]
    seqs = [torch.empty_like(like) for _ in range(n_st)] if store_seqs else []
    finals = [like.new_empty(step) for _ in range(n_st)]
    checkpoints: list[torch.Tensor] = []
    starts = inits
    for t0, sub in _chunk_plans(plan, chunk, like.dtype):
        t1 = t0 + sub.T
        ends = finals if t1 == plan.T else [like.new_empty(step, dtype=compute) for _ in range(n_st)]
        _launch_forward(sub, [x[t0:t1] for x in xs], starts, [o[t0:t1] for o in outs], [], [s[t0:t1] for s in seqs],
                        ends, params, shaped, layout, False, store_seqs, seed=_seed_from(seed, t0))
        if t1 < plan.T:
            checkpoints += ends
            starts = ends
    return outs, seqs, finals, checkpoints


def _checkpointed_backward(plan: Plan, chunk: int, store_seqs: bool, grads, xs, outs, inits, checkpoints, params,
                           shaped, layout, init_grads: bool, seed=None):
    """:func:`_backward` from :func:`_checkpointed_forward`'s checkpoints: for each chunk, last to first,
    the training forward kernel again from the chunk's first states (its saved values into buffers of one
    chunk), then the backward kernel over the chunk from the state gradients and running parameter-gradient
    sums the later chunk left (kept in the compute dtype): every gradient is that of one launch over all
    steps, bit for bit (the same terms added in the same order; the last chunk's launch reduces the sums)."""
    like = outs[0]
    step, n_out, n_st = plan.step_sizes, plan.n_out, plan.n_st
    compute = _torch_compute_dtype(like.dtype)
    chunks = _chunk_plans(plan, chunk, like.dtype)
    longest = (chunks[0][1].T, *step)
    saved = [like.new_empty(longest) for _ in range(plan.n_saved)]
    scratch = [like.new_empty(longest) for _ in range(n_out)]  # the outputs computed again (equal to ``outs``)
    ends = [like.new_empty(step, dtype=compute) for _ in range(n_st)]  # the final states computed again: unread
    grad_x = [torch.empty_like(x) for x in xs]
    carry = list(grads[len(grads) - n_st:])  # the gradients of the states after the chunk
    kept = [x if keep else None for x, keep in zip(xs, plan.kept_inputs)]
    names = plan.info.param_names
    sums = like.new_zeros((len(names), plan.n), dtype=compute) if names else None
    for k in reversed(range(len(chunks))):
        t0, sub = chunks[k]
        t1, length = t0 + sub.T, sub.T
        starts = list(inits) if k == 0 else checkpoints[(k - 1) * n_st:k * n_st]
        chunk_saved = [s[:length] for s in saved]
        at = _seed_from(seed, t0)
        _launch_forward(sub, [x[t0:t1] for x in xs], starts, [o[:length] for o in scratch], chunk_saved, [], ends,
                        params, shaped, layout, True, False, seed=at)
        begin = ([like.new_empty(step) for _ in range(n_st)] if init_grads else []) if k == 0 else \
            [like.new_empty(step, dtype=compute) for _ in range(n_st)]
        window = [None if g is None else g[t0:t1] for g in grads[:n_out + (n_st if store_seqs else 0)]] + carry
        _, _, grad_params, grad_shaped = _backward(
            sub, store_seqs, window, chunk_saved, [None if x is None else x[t0:t1] for x in kept],
            [o[t0:t1] for o in outs], params, shaped, layout, bool(begin), into=([g[t0:t1] for g in grad_x], begin),
            sums=sums, seed=at)
        carry = begin
    return grad_x, carry, grad_params, grad_shaped


class _RecomputedSteps(torch.autograd.Function):
    """:class:`_TritonSteps` keeping for the backward only the inputs, outputs, parameters and the states
    at the start of every chunk of steps (:func:`_checkpointed_forward`); the backward computes the saved
    values again, one chunk at a time (:func:`_checkpointed_backward`). ``call``: _TritonSteps' call and
    the steps of a chunk."""

    @staticmethod
    def forward(ctx, call: tuple, *tensors):
        plan, store_seqs, n_inputs, layout, n_shaped, n_params, chunk = call
        seed, tensors = (tensors[0], tensors[1:]) if plan.info.draws else (None, tensors)
        n_x = n_params + n_shaped + n_inputs
        params = _stack(list(tensors[:n_params]))
        shaped, xs, inits = tensors[n_params:n_params + n_shaped], tensors[n_params + n_shaped:n_x], tensors[n_x:]
        xs, inits = [_contiguous(x) for x in xs], [_contiguous(s) for s in inits]
        outs, seqs, finals, checkpoints = _checkpointed_forward(plan, chunk, xs, inits, params, shaped, layout,
                                                                store_seqs, seed)
        ctx.call, ctx.n_inits = call, len(inits)
        ctx.save_for_backward(seed, params, *shaped, *xs, *outs, *inits, *checkpoints)
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        plan, store_seqs, n_in, layout, n_shaped, n_params, chunk = ctx.call
        seed, params, *tensors = ctx.saved_tensors
        a, b, c = n_shaped + n_in, n_shaped + n_in + plan.n_out, n_shaped + n_in + plan.n_out + ctx.n_inits
        shaped, xs, outs, inits, checkpoints = tensors[:n_shaped], tensors[n_shaped:a], tensors[a:b], tensors[b:c], \
            tensors[c:]
        n_seed = 0 if seed is None else 1
        init_grads = ctx.n_inits > 0 and any(ctx.needs_input_grad[1 + n_seed + n_params + n_shaped + n_in:])
        grad_x, grad_init, grad_params, grad_shaped = _checkpointed_backward(
            plan, chunk, store_seqs, grads, xs, outs, inits, checkpoints, params, shaped, layout, init_grads, seed)
        return (None, *[None] * n_seed, *(grad_params.unbind(0) if grad_params is not None else ()), *grad_shaped,
                *grad_x, *(grad_init or [None] * ctx.n_inits))


def _without_zero_grads(compiled: Compiled, info, inputs, scalars, shaped) -> tuple:
    """The inputs, learnable scalars and shaped parameters' values (:func:`kernel_params`), those that
    have no gradient (``info.zero_grads``) detached: not in the graph, so no gradient (None), as on
    the torch backend."""
    zero = info.zero_grads
    if not zero:
        return inputs, scalars, shaped
    model = compiled.model
    names = [n for n in model.learnable if not model.parameters[n].shaped]
    detach = lambda names, values: [v.detach() if n in zero else v for n, v in zip(names, values)]  # noqa: E731
    return detach(model.inputs, inputs), detach(names, scalars), detach(model.shaped, shaped)


def _needs_grad(*groups: Sequence[torch.Tensor]) -> bool:
    """Whether a call on these tensors builds a graph: grad mode on and one of them requires a gradient."""
    return torch.is_grad_enabled() and any(t.requires_grad for group in groups for t in group)
