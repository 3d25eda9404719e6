"""The passes of :mod:`flexsn_dsl.triton_autograd` as operators for torch.compile(fullgraph=True), which it
treats as opaque (or, on a GPU, traces into): ``fused_steps``, what a compiled model calls, with the autograd
of :class:`_CompiledSteps`, over a forward and a backward operator each. A spec's kernels are found by the key
the operators take (:func:`flexsn_dsl.triton_plan.register`)."""
from __future__ import annotations

import copy
import math
from typing import Optional

import torch

from .triton_autograd import _backward, _contiguous, _forward, _needs_grad, _stack, _without_zero_grads, on_device
from .triton_plan import _REGISTRY, Plan, _cdiv, _kernels_for, _plan_for, kept_inputs
from .triton_settings import interpreting, launch_settings

# ``fused_forward`` and ``fused_backward`` are plain operators (no autograd of their own): the dispatcher
# calls them with fewer Python steps than a torch.library.custom_op (measured on the CPU: 13.5 against 30 us a
# forward call). ``fused_steps`` (what a compiled model calls) gives them autograd: torch.compile decomposes
# it into them with the formula of _CompiledSteps, so that a compiled graph calls the plain ones only.
_LIBRARY = torch.library.Library("flexsn_dsl", "FRAGMENT")
_LIBRARY.define("fused_steps(str key, bool store_seqs, Tensor[] xs, Tensor[] inits, Tensor[] params, Tensor[] shaped, "
                "SymInt[] layout, Tensor? seed) -> Tensor[]")
_LIBRARY.define("fused_forward(str key, bool store_seqs, Tensor[] xs, Tensor[] inits, Tensor? params, "
                "Tensor[] shaped, SymInt[] layout, bool training, Tensor? seed) -> Tensor[]")
_LIBRARY.define("fused_backward(str key, bool store_seqs, Tensor?[] grads, Tensor[] saved, Tensor?[] xs, "
                "Tensor[] outs, Tensor? params, Tensor[] shaped, SymInt[] layout, bool init_grads, Tensor? seed) "
                "-> Tensor[]")


def _fused_forward(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                   params: torch.Tensor | None, shaped: list[torch.Tensor], layout: list[int],
                   training: bool, seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Outputs, saved values (when ``training``), state sequences (if stored), final states. ``inits``
    is empty when the states start from the spec's constant initial values; ``params`` is the
    learnable scalar parameters' vector (None when none); ``shaped`` and ``layout`` are the shaped
    parameters' values and (inner, size) pairs (:func:`~flexsn_dsl.triton_autograd.shaped_view`);
    ``seed``: :func:`~flexsn_dsl.triton_autograd.new_seed`'s for a spec with draws, else None."""
    with on_device(xs[0]):
        return _forward_results(_plan_for(key, xs[0]), False, store_seqs, xs, inits, params, shaped, layout, training,
                                seed)


def _forward_results(plan: Plan, traced: bool, store_seqs: bool, xs, inits, params, shaped, layout,
                     training: bool, seed) -> list[torch.Tensor]:
    """:func:`_forward`'s results as the forward operators return them (see :func:`_fused_forward`)."""
    outs, saved, seqs, finals, _ = _forward(plan, xs, inits, params, shaped, layout, training, store_seqs, traced,
                                            seed)
    return [*outs, *saved, *seqs, *finals]


def _fused_forward_fake(key, store_seqs, xs, inits, params, shaped, layout, training, seed):
    info = _REGISTRY[key].info
    x = xs[0]
    return ([x.new_empty(x.shape) for _ in info.output_names] +
            ([x.new_empty(x.shape) for _ in info.saved_names] if training else []) +
            ([x.new_empty(x.shape) for _ in info.state_names] if store_seqs else []) +
            [x.new_empty(x.shape[1:]) for _ in info.state_names])


def _fused_backward(key: str, store_seqs: bool, grads: list[torch.Tensor | None], saved: list[torch.Tensor],
                    xs: list[torch.Tensor | None], outs: list[torch.Tensor], params: torch.Tensor | None,
                    shaped: list[torch.Tensor], layout: list[int], init_grads: bool,
                    seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Gradients of inputs, initial states (when ``init_grads``), the scalar parameters (when ``params``
    is given), then each learnable shaped parameter, from the upstream gradients (None where there
    are none); ``seed``: the forward's."""
    with on_device(outs[0]):
        return _backward_results(_plan_for(key, outs[0]), False, store_seqs, grads, saved, xs, outs, params, shaped,
                                 layout, init_grads, seed)


def _backward_results(plan: Plan, traced: bool, store_seqs: bool, grads, saved, xs, outs, params, shaped, layout,
                      init_grads: bool, seed) -> list[torch.Tensor]:
    """:func:`_backward`'s results as the backward operators return them (see :func:`_fused_backward`)."""
    grad_x, grad_init, grad_params, grad_shaped = _backward(
        plan, store_seqs, grads, saved, [None if x is None else _contiguous(x) for x in xs], outs, params, shaped,
        layout, init_grads, traced, seed=seed)
    return [*grad_x, *grad_init, *([grad_params] if params is not None else []),
            *[g for g in grad_shaped if g is not None]]


def _fused_backward_fake(key, store_seqs, grads, saved, xs, outs, params, shaped, layout, init_grads, seed):
    info = _REGISTRY[key].info
    x = outs[0]
    return ([x.new_empty(x.shape) for _ in xs] +
            ([x.new_empty(x.shape[1:]) for _ in info.state_names] if init_grads else []) +
            ([params.new_empty(params.shape)] if params is not None else []) +
            [v.new_empty(v.shape) for v, name in zip(shaped, info.shaped_names) if name in info.param_names])


for _name, _impl, _fake in (("fused_forward", _fused_forward, _fused_forward_fake),
                            ("fused_backward", _fused_backward, _fused_backward_fake)):
    for _device in ("CPU", "CUDA"):
        _LIBRARY.impl(_name, _impl, _device)
    torch.library.register_fake(f"flexsn_dsl::{_name}", _fake, lib=_LIBRARY)
fused_forward = torch.ops.flexsn_dsl.fused_forward.default
fused_backward = torch.ops.flexsn_dsl.fused_backward.default


# On a GPU, torch.compile gets the same two operators as ``torch.library.triton_op``s instead: it traces
# into them (the allocations and ``wrap_triton`` launches), and inductor issues the kernels from the
# compiled step with its own launcher, with no Python call of ours per launch. The interpreter on the CPU
# cannot be traced that way (its kernels are not JIT functions), nor can autotuning (its block size is
# chosen at the first launch); both keep the opaque operators, as do specs with learnable parameters
# under dynamic shapes (their partial sums made a compiled step recompile for each size on the H200; the
# tiled backward's tiles depend on the sizes). The launch settings are read when the step is compiled.
def _traced_plan(key: str, like: torch.Tensor) -> Plan:
    """The plan a traced operator launches with: for dynamic shapes, the plan of the sizes torch.compile
    traced with (block size, flags), its sizes, grid and number of programs made symbolic."""
    shape = like.shape
    if all(type(d) is int for d in shape):
        return _plan_for(key, like)
    plan = copy.copy(_kernels_for(key, like).plan(torch.Size(map(_size_hint, shape)), like.dtype, launch_settings()))
    plan.shape, plan.T, plan.step = shape, shape[0], shape[1:]
    plan.step_sizes, plan.n = tuple(plan.step), math.prod(plan.step)
    plan.programs = _cdiv(plan.n, plan.block)
    plan.grid = (plan.programs,)
    if plan.chunk:  # a time-parallel plan: one chunk of all the steps (the chunk kernels' sizes are not symbolic)
        plan.chunk, plan.chunks, plan.grid = plan.T, 1, (plan.programs, 1)
    return plan


def _size_hint(size) -> int:
    """The value a size had when torch.compile traced it (a symbolic one's hint; no guard)."""
    return size if type(size) is int else size.node.hint


def _traced_forward(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                    params: Optional[torch.Tensor], shaped: list[torch.Tensor], layout: list[int],
                    training: bool, seed: Optional[torch.Tensor]) -> list[torch.Tensor]:
    return _forward_results(_traced_plan(key, xs[0]), True, store_seqs, xs, inits, params, shaped, layout, training,
                            seed)


def _traced_backward(key: str, store_seqs: bool, grads: list[Optional[torch.Tensor]], saved: list[torch.Tensor],
                     xs: list[Optional[torch.Tensor]], outs: list[torch.Tensor], params: Optional[torch.Tensor],
                     shaped: list[torch.Tensor], layout: list[int], init_grads: bool,
                     seed: Optional[torch.Tensor]) -> list[torch.Tensor]:
    return _backward_results(_traced_plan(key, outs[0]), True, store_seqs, grads, saved, xs, outs, params, shaped,
                             layout, init_grads, seed)


# (registered only where they can run: a triton_op's registration imports inductor, about 0.6 s of every
# process on a machine without a GPU, where no traced operator is ever called)
_TRACED: tuple | None = None
if torch.cuda.is_available() and not interpreting():
    torch.library.triton_op("flexsn_dsl::traced_forward", _traced_forward, mutates_args=())
    torch.library.triton_op("flexsn_dsl::traced_backward", _traced_backward, mutates_args=())
    _TRACED = (torch.ops.flexsn_dsl.traced_forward.default, torch.ops.flexsn_dsl.traced_backward.default)


def _operators(key: str, like: torch.Tensor) -> tuple:
    """The (forward, backward) operators a compiled step of spec ``key`` calls on inputs like ``like``."""
    if (_TRACED and like.is_cuda and not interpreting() and not launch_settings().autotune
            and (not _REGISTRY[key].info.param_names or all(type(d) is int for d in like.shape))):
        return _TRACED
    return fused_forward, fused_backward


class _CompiledSteps(torch.autograd.Function):
    """The autograd of ``fused_steps`` (traced by torch.compile, not run at each call). ``call``: (key,
    store_seqs, number of inputs, of initial states, of scalar parameters, layout); tensor arguments: the
    seed (or None), inputs, initial states, scalar parameters (0-dim each) and shaped parameters' values."""

    @staticmethod
    def forward(ctx, call: tuple, seed, *tensors):
        key, store_seqs, n_x, n_init, n_params, layout = call
        info = _REGISTRY[key].info
        a, b, c = n_x, n_x + n_init, n_x + n_init + n_params
        xs, inits, params, shaped = list(tensors[:a]), list(tensors[a:b]), tensors[b:c], list(tensors[c:])
        param_vec = _stack(list(params))
        forward, backward = _operators(key, xs[0])
        results = forward(key, store_seqs, xs, inits, param_vec, shaped, list(layout), True, seed)
        n_out, n_saved = info.num_outputs, len(info.saved_names)
        ctx.call, ctx.backward_op = call, backward
        ctx.save_for_backward(seed, param_vec, *shaped, *results[n_out:n_out + n_saved],
                              *[x if keep else None for x, keep in zip(xs, kept_inputs(info))], *results[:n_out])
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*results[:n_out], *results[n_out + n_saved:])

    @staticmethod
    def backward(ctx, *grads):
        key, store_seqs, n_x, n_init, n_params, layout = ctx.call
        info = _REGISTRY[key].info
        seed, param_vec, *tensors = ctx.saved_tensors
        n_shaped = len(layout) // 2  # ((inner, size) per shaped parameter)
        k = n_shaped + len(info.saved_names)
        shaped, saved, xs, outs = tensors[:n_shaped], tensors[n_shaped:k], tensors[k:k + n_x], tensors[k + n_x:]
        result = ctx.backward_op(key, store_seqs, list(grads), saved, xs, outs, param_vec, shaped, list(layout),
                                 n_init > 0, seed)
        grad_x, grad_init = result[:n_x], result[n_x:n_x + n_init]
        grad_params = result[n_x + n_init].unbind(0) if n_params else ()
        rest = iter(result[n_x + n_init + (1 if n_params else 0):])  # the learnable shaped parameters' gradients
        grad_shaped = [next(rest) if name in info.param_names else None for name in info.shaped_names]
        return (None, None, *grad_x, *grad_init, *grad_params, *grad_shaped)


def _fused_steps(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                 params: list[torch.Tensor], shaped: list[torch.Tensor], layout: list[int],
                 seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Outputs, state sequences (if stored), final states; ``params`` holds each learnable scalar parameter
    as a 0-dim tensor (one each, so that each gets its own gradient); see :func:`_fused_forward`. Where no
    gradient is needed, the inference kernels (nothing saved)."""
    compiled = _REGISTRY[key]
    xs, params, shaped = _without_zero_grads(compiled, compiled.info, xs, params, shaped)
    if not _needs_grad(xs, inits, params, shaped):
        return _operators(key, xs[0])[0](key, store_seqs, xs, inits, _stack(params), shaped, layout, False, seed)
    call = (key, store_seqs, len(xs), len(inits), len(params), tuple(layout))
    return list(_CompiledSteps.apply(call, seed, *xs, *inits, *params, *shaped))


_LIBRARY.impl("fused_steps", _fused_steps, "CompositeImplicitAutograd")
fused_steps = torch.ops.flexsn_dsl.fused_steps.default
