"""The Triton backend's entry: :func:`run_triton` (a call over T steps, eager or under torch.compile) and
:func:`direct_call` (the module's shortcut for calls like the last one); :func:`register` and
:func:`interpreting`, which runtime.py and the generated kernel modules import from here.

A call goes through these modules in turn:

- :mod:`flexsn_dsl.triton_settings`: the launch settings from the environment, the bounds of every launch,
  Triton's interpreter where there is no GPU;
- :mod:`flexsn_dsl.triton_plan`: how a call is planned: the kernels of a spec and the launch plan of each
  input shape (block sizes, time tiles, chunks, grids, keywords);
- :mod:`flexsn_dsl.triton_launch`: how a planned kernel is launched (Triton's JIT, or directly on a GPU);
- :mod:`flexsn_dsl.triton_autograd`: how the forward and backward run eagerly: the kernels' arguments, the
  launches of each pass, the autograd Functions (recompute included);
- :mod:`flexsn_dsl.triton_operators`: the same passes as operators for torch.compile;
- this module: the call itself. The recurrent kernels launch from :mod:`flexsn_dsl.triton_recurrent`."""
from __future__ import annotations

from typing import Callable, Sequence

import torch

from .compiler import Compiled
from .triton_autograd import (_RecomputedSteps, _TritonSteps, _forward, _forward_chunks, _needs_grad, _seed_arg,
                              _stack, _without_zero_grads, kernel_params, new_seed, on_device)
from .triton_operators import fused_steps
from .triton_plan import _kernels, register
from .triton_settings import interpreting, launch_settings

__all__ = ["direct_call", "interpreting", "register", "run_triton"]


def direct_call(compiled: Compiled, like: torch.Tensor) -> Callable[[torch.Tensor], tuple | None] | None:
    """The call :func:`run_triton` makes for a spec with one input, no runtime parameters and constant
    initial states, from those constants, with less host work per call: ``call(x)`` gives (outputs,
    final states), or None where ``x`` needs the general path: not the shape, dtype or device of
    ``like`` (the inputs [T, ...] it was built for), not contiguous, another mode (``like`` decides:
    training when it needs a gradient, as :func:`run_triton` decides), another current device or other
    launch settings (the caller never calls it under torch.compile). A training call is the general
    path's autograd Function with the arguments worked out once; an inference call allocates and
    launches. None where the spec has more than that, or ``like`` no steps or neurons or another
    layout, or (training) the input's gradient is known to be zero (the general path detaches it)."""
    model = compiled.model
    if len(model.inputs) != 1 or model.runtime_params or model.recurrent or model.draws or not like.is_contiguous():
        return None
    settings = launch_settings()
    plan = _kernels(compiled, like.device.type).plan(like.shape, like.dtype, settings)
    training = _needs_grad([like])
    if not plan.info.initial_values or plan.T == 0 or plan.n == 0 or (training and plan.info.zero_grads):
        return None
    shape, dtype, device, index = like.shape, like.dtype, like.device, like.get_device()
    variant, flags = plan.forwards[False, False, True]
    n_out, n_st, step = plan.n_out, plan.n_st, plan.step_sizes
    steps = (plan, False, 1, (), 0, 0)  # _TritonSteps' call: no state sequences, one input, no parameters
    current = torch.cuda.current_device if like.is_cuda else (lambda: index)

    def call(x: torch.Tensor) -> tuple | None:
        if (x.shape != shape or x.dtype != dtype or x.device != device or not x.is_contiguous()
                or (x.requires_grad and torch.is_grad_enabled()) is not training
                or launch_settings() is not settings or current() != index):
            return None
        if training:
            results = _TritonSteps.apply(steps, x)
            return results[:n_out], results[n_out:]
        outs = [torch.empty_like(x) for _ in range(n_out)]
        finals = [x.new_empty(step) for _ in range(n_st)]
        chunks = _forward_chunks(plan, [x], [x] * n_st, True, [], False)
        plan.launch(variant, [x, *[x] * n_st, *outs, *finals, *chunks], flags)  # (x for the initial states: unread)
        return outs, finals
    return call


def run_triton(compiled: Compiled, inputs: Sequence[torch.Tensor], states: list[torch.Tensor],
               params: dict[str, torch.Tensor], store_seqs: bool, chunk: int = 0):
    """Run T steps with the generated kernels; returns (outputs, final states, state sequences).
    Empty ``states``: start from the spec's constant initial values. ``params`` holds every runtime
    parameter (learnable scalars, and shaped ones that broadcast to a step). ``chunk`` > 0: a training
    call keeps the states every ``chunk`` steps instead of the saved values of every step
    (:class:`_RecomputedSteps`)."""
    model = compiled.model
    like = inputs[0]
    param_list, shaped, layout = kernel_params(compiled, params, like) if params else ([], [], [])
    n_out, n_st = len(model.outputs), len(model.states)
    seed = new_seed(like) if compiled.ir.used_draws else None  # (none where sympy folded every draw away: 0 * randn())
    if torch.compiler.is_compiling():  # an opaque operator; registered by FlexSN.__init__
        if chunk:
            raise RuntimeError(f"{model.name}: recompute does not run under torch.compile on the Triton backend: "
                               "compile a module loaded without recompute, or run this one eagerly")
        results = fused_steps(compiled.module_name, store_seqs, list(inputs), list(states), param_list, shaped,
                              layout, seed)
        seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
        return list(results[:n_out]), list(results[len(results) - n_st:]), seqs
    # (a bad launch setting is an error even for calls that launch nothing: T=0)
    plan = _kernels(compiled, "cuda" if like.is_cuda else like.device.type).plan(like.shape, like.dtype,
                                                                                  launch_settings())
    inputs, param_list, shaped = _without_zero_grads(compiled, plan.info, inputs, param_list, shaped)
    if not _needs_grad(inputs, states, shaped, param_list):
        with on_device(like):
            outs, _, seqs, finals, _ = _forward(plan, inputs, states, _stack(param_list), shaped, layout, False,
                                                store_seqs, seed=seed)
        return outs, finals, seqs
    call = (plan, store_seqs, len(inputs), tuple(layout), len(shaped), len(param_list))
    with on_device(like):  # (the backward runs on the autograd engine's thread for that device)
        if chunk > 0 and plan.T > 0 and plan.n > 0:
            results = _RecomputedSteps.apply((*call, chunk), *_seed_arg(seed), *param_list, *shaped, *inputs, *states)
        else:
            results = _TritonSteps.apply(call, *_seed_arg(seed), *param_list, *shaped, *inputs, *states)
    outs = list(results[:n_out])
    seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
    return outs, list(results[len(results) - n_st:]), seqs
