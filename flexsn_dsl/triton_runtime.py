"""Launching the generated kernels: block sizes, the autograd Function, the interpreter on CPU."""
from __future__ import annotations

import functools
import math
import os
from typing import NamedTuple, Sequence

import torch

if "TRITON_INTERPRET" not in os.environ and not torch.cuda.is_available():
    # No GPU: run generated kernels through Triton's interpreter. Set before the first
    # `import triton` (older Triton versions read it only then).
    os.environ["TRITON_INTERPRET"] = "1"

import triton  # noqa: E402

from .compiler import Compiled
from .names import kernel_name

CPU_BLOCK = 1024
MAX_STAGES = 16
MIN_COLS = 32  # the narrowest tile of the tiled backward: 128 contiguous bytes of float32 per row


class LaunchSettings(NamedTuple):
    autotune: bool  # $FLEXSN_DSL_AUTOTUNE=1: autotune block sizes (GPU only)
    stages: int     # $FLEXSN_DSL_STAGES: pipelining stages of the time loop (0: heuristic)


def launch_settings() -> LaunchSettings:
    """The launch settings from the environment, read at each launch (the torch backend never reads
    them); a ValueError saying what to set for a value that is not one of the allowed ones."""
    return _parse_settings(os.environ.get("FLEXSN_DSL_AUTOTUNE", ""), os.environ.get("FLEXSN_DSL_STAGES", ""))


@functools.lru_cache(maxsize=16)
def _parse_settings(autotune: str, stages: str) -> LaunchSettings:
    if autotune.strip() not in ("", "0", "1"):
        raise ValueError(f"FLEXSN_DSL_AUTOTUNE={autotune!r} is not 0 or 1: set it to 1 to autotune block sizes "
                         "on the GPU, to 0 or nothing for the built-in choice")
    text = stages.strip()
    if text and not (text.isascii() and text.isdigit() and int(text) <= MAX_STAGES):
        raise ValueError(f"FLEXSN_DSL_STAGES={stages!r} is not a whole number from 0 to {MAX_STAGES}: set it to the "
                         "pipelining depth of the time loop (e.g. 2), or to 0 or nothing for the built-in choice")
    return LaunchSettings(autotune=autotune.strip() == "1", stages=int(text or 0))


def _compute_dtype(dtype: torch.dtype):
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _torch_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class Kernels:
    """The kernels of one compiled spec for one kind of device."""

    def __init__(self, compiled: Compiled, device: torch.device):
        self.interpret = interpreting()
        if device.type != "cuda" and not self.interpret:
            raise RuntimeError("backend='triton' on CPU tensors runs Triton's interpreter, which must be on "
                               "before Triton is imported: set TRITON_INTERPRET=1 (or import flexsn_dsl first)")
        self.module = compiled.triton_module()
        self.info = self.module.INFO
        self.name = compiled.model.name

    def config(self, n: int, stages: int = 0) -> dict:
        """Launch meta-parameters: a block size that gives every SM a few programs (``stages``: the
        time loop's pipelining depth, 0 for the heuristic)."""
        if self.interpret:
            return {"_BLOCK": min(CPU_BLOCK, max(16, 1 << (max(n, 1) - 1).bit_length())), "_STAGES": 1}
        # Measured on an H200 (BENCHMARKS.md): 1024-wide blocks of 4 warps are within a few percent of
        # the best config when there are enough neurons; with few neurons (long sequences), small
        # blocks of one warp and a 4-stage pipelined time loop keep the most loads in flight.
        sms = _sm_count()
        block = 1024
        while block > 64 and triton.cdiv(n, block) < 4 * sms:
            block //= 2
        warps = 4 if block >= 512 else (2 if block >= 256 else 1)
        return {"_BLOCK": block, "num_warps": warps, "_STAGES": stages or (2 if block >= 512 else 4)}

    def _autotuned(self, settings: LaunchSettings) -> bool:
        return settings.autotune and not self.interpret

    def launch(self, variant: str, n: int, args: list, **constexprs) -> int:
        """Launch over n neurons in blocks; returns the number of programs."""
        settings = launch_settings()
        kernel = getattr(self.module, kernel_name(self.name, variant))
        if self._autotuned(settings):
            kernel = _tuned(kernel)
            kernel[lambda meta: (triton.cdiv(n, meta["_BLOCK"]),)](*args, _STAGES=settings.stages or 2, **constexprs)
            return triton.cdiv(n, kernel.best_config.kwargs["_BLOCK"])
        config = self.config(n, settings.stages)
        grid = (triton.cdiv(n, config["_BLOCK"]),)
        kernel[grid](*args, **config, **constexprs)
        return grid[0]

    def launch_tiled(self, variant: str, tiling: "Tiling", args: list, **constexprs) -> None:
        """Launch the tiled backward (a spec with learnable shaped parameters) over its tiles. Its tile
        is the block of the built-in choice for the same neurons (not autotuned)."""
        config = self.config(tiling.rows * tiling.period, launch_settings().stages)
        del config["_BLOCK"]
        kernel = getattr(self.module, kernel_name(self.name, variant))
        kernel[tiling.grid](*args, _ROWS=tiling.tile_rows, _COLS=tiling.tile_cols, **config, **constexprs)

    def blocks(self, n: int) -> int:
        """An upper bound on the programs a launch over n neurons uses (partial parameter gradients)."""
        block = 64 if self._autotuned(launch_settings()) else self.config(n)["_BLOCK"]  # autotuning: the smallest
        return triton.cdiv(n, block)

    def tiling(self, n: int, period: int) -> "Tiling":
        """The tiles of the tiled backward over n neurons seen as rows of ``period``: as many rows per tile
        as fit (a power of two), at least MIN_COLS columns, rows times columns the block of a launch over n."""
        block = self.config(n)["_BLOCK"]
        rows = n // period
        tile_rows = min(1 << (rows - 1).bit_length(), max(block // MIN_COLS, 1))
        return Tiling(period, rows, tile_rows, block // tile_rows)


class Tiling(NamedTuple):
    """The tiled backward's geometry: ``rows`` rows of ``period`` neurons, tiles of ``tile_rows`` by ``tile_cols``."""

    period: int
    rows: int
    tile_rows: int
    tile_cols: int

    @property
    def grid(self) -> tuple[int, int]:
        return triton.cdiv(self.period, self.tile_cols), triton.cdiv(self.rows, self.tile_rows)

    @property
    def programs(self) -> int:
        return math.prod(self.grid)

    def split(self, inner: int) -> int:
        """The most column tiles that the ``inner`` columns sharing one value of a shaped parameter span."""
        cols = self.tile_cols
        if cols % inner == 0 or inner % cols == 0:  # segments aligned with the tiles
            return max(inner // cols, 1)
        return (inner - 1 + cols - 1) // cols + 1

    def partial_shape(self, inner: int) -> tuple[int, int, int]:
        """The partial sums of a learnable shaped parameter: [row tiles, segments, split]."""
        return self.grid[1], self.period // inner, self.split(inner)


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter in this process."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _tuned(kernel):
    configs = [triton.Config({"_BLOCK": b}, num_warps=w) for b, w in
               ((64, 2), (128, 2), (256, 2), (512, 4), (1024, 4), (2048, 8))]
    return triton.autotune(configs=configs, key=["_N", "_DTYPE"])(kernel)


@functools.lru_cache(maxsize=None)
def _kernels(compiled: Compiled, device_type: str) -> Kernels:
    return Kernels(compiled, torch.device(device_type))


def _flat(x: torch.Tensor, T: int) -> torch.Tensor:
    return x.reshape(T, math.prod(x.shape[1:])).contiguous()  # not -1: T may be 0


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


def _forward(kernels: Kernels, xs, inits, params, shaped, layout, training: bool, store_seqs: bool):
    """Run the forward kernels. Empty ``inits`` (for a spec whose initial states are all
    constants) starts from those constants without reading any initial-state tensor."""
    info = kernels.info
    T = xs[0].shape[0]
    shape = xs[0].shape[1:]
    n = math.prod(shape)
    like = xs[0]
    const_init = not inits and info.num_states > 0
    if const_init and not info.initial_values:
        raise ValueError(f"{info.neuron}: no initial states given, and not all of them are constants")
    flat_x = [_flat(x, T) for x in xs]
    outs = [like.new_empty((T, n)) for _ in info.output_names]
    saved = [like.new_empty((T, n)) for _ in info.saved_names] if training else []
    seqs = [like.new_empty((T, n)) for _ in info.state_names] if store_seqs else []
    finals = [like.new_empty((n,)) for _ in info.state_names]
    flat_init = finals if const_init else [s.reshape(-1).contiguous() for s in inits]  # unread when constant
    if T == 0:
        finals = [f.fill_(v) for f, v in zip(finals, info.initial_values)] if const_init else \
            [s.clone() for s in flat_init]
    elif n > 0:
        variant = ("forward" if training else "inference") + ("" if store_seqs else "_final_state")
        args = [*flat_x, *flat_init, *outs, *saved, *seqs, *finals, *_param_args(info, params, shaped, layout)]
        flags = {"_CONST_INIT": const_init} if info.initial_values else {}
        kernels.launch(variant, n, args + [T, n], _DTYPE=_compute_dtype(like.dtype), **flags)
    view = lambda t: t.reshape(T, *shape)  # noqa: E731
    return [view(o) for o in outs], saved, [view(s) for s in seqs], [f.reshape(shape) for f in finals], flat_x


def _param_args(info, params, shaped, layout) -> list:
    """Kernel arguments of the runtime parameters: the scalar vector, then (tensor, inner, size) per shaped one."""
    args = [params] if info.scalar_params else []
    for k, values in enumerate(shaped):
        args += [values, layout[2 * k], layout[2 * k + 1]]
    return args


def _present(grads: list, shape: tuple[int, ...], like: torch.Tensor) -> list[torch.Tensor] | None:
    """Upstream gradients reshaped to ``shape``: None when none was given, zeros for a missing one."""
    if all(g is None for g in grads):
        return None
    return [g.reshape(shape).contiguous() if g is not None else like.new_zeros(shape) for g in grads]


def _backward(kernels: Kernels, store_seqs: bool, shape, grads, saved, flat_x, flat_out, params, shaped, layout,
              init_grads: bool):
    """Gradients of the inputs, initial states (when ``init_grads``, else []), scalar parameters
    and learnable shaped parameters (in ``shaped``'s order, None for the fixed ones) from the
    upstream gradients (None where there are none) of the outputs, state sequences (when stored)
    and final states."""
    info = kernels.info
    T = shape[0]
    n = math.prod(shape[1:])
    n_out, n_st = info.num_outputs, info.num_states
    like = flat_x[0]
    grad_outs = _present(list(grads[:n_out]), (T, n), like) or [like.new_zeros((T, n)) for _ in range(n_out)]
    grad_seqs = _present(list(grads[n_out:n_out + n_st]), (T, n), like) if store_seqs else None
    grad_finals = _present(list(grads[len(grads) - n_st:]), (n,), like) if n_st else None
    grad_params = None
    learnable = [name in info.param_names for name in info.shaped_names]
    if T == 0 or n == 0:
        grad_x = [torch.zeros_like(x) for x in flat_x]
        grad_init = [g.clone() for g in grad_finals] if grad_finals else [like.new_zeros((n,)) for _ in range(n_st)]
        grad_params = params.new_zeros(params.shape) if params is not None else None
        grad_shaped = [torch.zeros_like(v) if grad else None for v, grad in zip(shaped, learnable)]
    else:
        grad_x = [torch.empty_like(x) for x in flat_x]
        grad_init = [like.new_empty((n,)) for _ in range(n_st)] if init_grads else []
        unused = grad_x[0]  # a valid pointer for arguments a flag leaves unread
        args = [*grad_outs, *(grad_seqs or [unused] * n_st), *(grad_finals or [unused] * n_st), *saved, *flat_x,
                *flat_out, *grad_x, *(grad_init or [unused] * n_st)]
        args += _param_args(info, params, shaped, layout)
        flags = dict(_DTYPE=_compute_dtype(like.dtype), _HAS_STATE_GRADS=grad_seqs is not None,
                     _HAS_FINAL_GRADS=grad_finals is not None, _WRITE_INIT_GRADS=init_grads)
        if info.learnable_shaped:
            tiling = kernels.tiling(n, shaped_period(layout))
            partial = params.new_zeros((tiling.programs, info.num_params)) if info.scalar_params else None
            partials = {}  # learnable shaped parameter k -> partial sums [row tiles, segments, split]
            for k, (values, grad) in enumerate(zip(shaped, learnable)):
                if grad:
                    partials[k] = values.new_zeros(tiling.partial_shape(layout[2 * k]))
            args += [partial] if partial is not None else []
            args += [a for p in partials.values() for a in (p, p.shape[2])]
            kernels.launch_tiled("backward", tiling, args + [T, n, tiling.period], **flags)
            programs = tiling.programs
            grad_shaped = [_shaped_gradient(partials[k], v.numel()) if k in partials else None
                           for k, v in enumerate(shaped)]
        else:
            partial = params.new_zeros((kernels.blocks(n), info.num_params)) if info.scalar_params else None
            programs = kernels.launch("backward", n, args + ([partial] if partial is not None else []) + [T, n],
                                      **flags)
            grad_shaped = [None] * len(shaped)
        if partial is not None:  # only the rows this launch wrote (autotuning tries other block sizes)
            grad_params = partial[:programs].sum(0)
    grad_init = [g.reshape(shape[1:]) for g in grad_init] if init_grads else []
    return [g.reshape(shape) for g in grad_x], grad_init, grad_params, grad_shaped


class _TritonSteps(torch.autograd.Function):
    """Fused multi-step forward and backward (eager). Tensor arguments: the scalar parameters,
    the ``n_shaped`` shaped parameters' values (:func:`shaped_view`), the inputs, the initial states."""

    @staticmethod
    def forward(ctx, kernels: Kernels, store_seqs: bool, n_inputs: int, layout: tuple[int, ...], n_shaped: int,
                params, *tensors):
        shaped, xs, inits = tensors[:n_shaped], list(tensors[n_shaped:n_shaped + n_inputs]), \
            list(tensors[n_shaped + n_inputs:])
        outs, saved, seqs, finals, flat_x = _forward(kernels, xs, inits, params, shaped, layout, True, store_seqs)
        ctx.kernels, ctx.store_seqs, ctx.n_inputs, ctx.n_saved = kernels, store_seqs, n_inputs, len(saved)
        ctx.layout, ctx.n_shaped = layout, n_shaped
        ctx.shape = xs[0].shape
        ctx.n_inits = len(inits)
        ctx.save_for_backward(params, *shaped, *saved, *flat_x, *[_flat(o, ctx.shape[0]) for o in outs])
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        params, *tensors = ctx.saved_tensors
        shaped, tensors = tensors[:ctx.n_shaped], tensors[ctx.n_shaped:]
        k, n_in = ctx.n_saved, ctx.n_inputs
        init_grads = any(ctx.needs_input_grad[6 + ctx.n_shaped + n_in:])
        grad_x, grad_init, grad_params, grad_shaped = _backward(
            ctx.kernels, ctx.store_seqs, ctx.shape, grads, tensors[:k], tensors[k:k + n_in], tensors[k + n_in:],
            params, shaped, ctx.layout, init_grads)
        return (None, None, None, None, None, grad_params, *grad_shaped, *grad_x,
                *(grad_init or [None] * ctx.n_inits))


# -- the same, as custom operators, so that torch.compile(fullgraph=True) treats them as opaque --
_REGISTRY: dict[str, Compiled] = {}


def _kernels_for(key: str, like: torch.Tensor) -> Kernels:
    return _kernels(_REGISTRY[key], like.device.type)


@torch.library.custom_op("flexsn_dsl::fused_forward", mutates_args=())
def fused_forward(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                  params: list[torch.Tensor], shaped: list[torch.Tensor], layout: list[int]) -> list[torch.Tensor]:
    """Training forward: outputs, saved values, state sequences (if stored), final states.
    ``inits`` is empty when the states start from the spec's constant initial values; ``params``
    holds each learnable scalar parameter as a 0-dim tensor (one each, so that each gets its own
    gradient); ``shaped`` and ``layout`` are the shaped parameters' values and (inner, size) pairs
    (:func:`shaped_view`)."""
    outs, saved, seqs, finals, _ = _forward(_kernels_for(key, xs[0]), xs, inits, _stack(params), shaped, layout,
                                            True, store_seqs)
    return [*outs, *saved, *seqs, *finals]


def _stack(params: list[torch.Tensor]) -> torch.Tensor | None:
    return torch.stack(params) if params else None


@fused_forward.register_fake
def _fused_forward_fake(key, store_seqs, xs, inits, params, shaped, layout):
    info = _REGISTRY[key].info
    x = xs[0]
    T, n = x.shape[0], math.prod(x.shape[1:])
    return ([x.new_empty(x.shape) for _ in info.output_names] + [x.new_empty((T, n)) for _ in info.saved_names] +
            ([x.new_empty(x.shape) for _ in info.state_names] if store_seqs else []) +
            [x.new_empty(x.shape[1:]) for _ in info.state_names])


@torch.library.custom_op("flexsn_dsl::fused_backward", mutates_args=())
def fused_backward(key: str, store_seqs: bool, grads: list[torch.Tensor | None], saved: list[torch.Tensor],
                   xs: list[torch.Tensor], outs: list[torch.Tensor], params: torch.Tensor | None,
                   shaped: list[torch.Tensor], layout: list[int], init_grads: bool) -> list[torch.Tensor]:
    """Gradients of inputs, initial states (when ``init_grads``), the scalar parameters (an empty
    tensor when none), then each learnable shaped parameter, from the upstream gradients (None
    where there are none)."""
    shape = xs[0].shape
    T = shape[0]
    grad_x, grad_init, grad_params, grad_shaped = _backward(
        _kernels_for(key, xs[0]), store_seqs, shape, grads, saved, [_flat(x, T) for x in xs],
        [_flat(o, T) for o in outs], params, shaped, layout, init_grads)
    return [*grad_x, *grad_init, grad_params if grad_params is not None else xs[0].new_empty(0),
            *[g for g in grad_shaped if g is not None]]


@fused_backward.register_fake
def _fused_backward_fake(key, store_seqs, grads, saved, xs, outs, params, shaped, layout, init_grads):
    info = _REGISTRY[key].info
    x = xs[0]
    return ([x.new_empty(x.shape) for _ in xs] +
            ([x.new_empty(x.shape[1:]) for _ in info.state_names] if init_grads else []) +
            [params.new_empty(params.shape) if params is not None else x.new_empty(0)] +
            [v.new_empty(v.shape) for v, name in zip(shaped, info.shaped_names) if name in info.param_names])


def _setup_context(ctx, inputs, output):
    key, store_seqs, xs, inits, params, shaped, layout = inputs
    info = _REGISTRY[key].info
    n_out, n_saved = info.num_outputs, len(info.saved_names)
    ctx.key, ctx.store_seqs, ctx.n_inputs, ctx.n_out = key, store_seqs, len(xs), n_out
    ctx.n_params, ctx.n_shaped, ctx.layout = len(params), len(shaped), list(layout)
    ctx.n_inits = len(inits)
    ctx.save_for_backward(*output[n_out:n_out + n_saved], *xs, *output[:n_out], *shaped, *params)
    ctx.n_saved = n_saved


def _fused_autograd(ctx, grads):
    info = _REGISTRY[ctx.key].info
    tensors = list(ctx.saved_tensors)
    params = tensors[len(tensors) - ctx.n_params:]
    tensors = tensors[:len(tensors) - ctx.n_params]
    shaped = tensors[len(tensors) - ctx.n_shaped:]
    tensors = tensors[:len(tensors) - ctx.n_shaped]
    k, n_in = ctx.n_saved, ctx.n_inputs
    saved, xs, outs = tensors[:k], tensors[k:k + n_in], tensors[k + n_in:]
    n_out, n_st = info.num_outputs, info.num_states
    wanted = list(grads[:n_out]) + (list(grads[n_out + k:n_out + k + n_st]) if ctx.store_seqs else []) + \
        list(grads[len(grads) - n_st:])
    result = fused_backward(ctx.key, ctx.store_seqs, wanted, saved, xs, outs, _stack(params), shaped, ctx.layout,
                            ctx.n_inits > 0)
    zero = info.zero_grads
    grad_x = [None if name in zero else g for name, g in zip(info.input_names, result[:n_in])]
    grad_init = result[n_in:n_in + ctx.n_inits]
    scalar_grads = result[n_in + ctx.n_inits]
    grad_params = [None if name in zero else scalar_grads[i] for i, name in enumerate(info.scalar_params)]
    rest = iter(result[n_in + ctx.n_inits + 1:])  # the learnable shaped parameters' gradients
    grad_shaped = [next(rest) if name in info.param_names else None for name in info.shaped_names]
    grad_shaped = [None if name in zero else g for name, g in zip(info.shaped_names, grad_shaped)]
    # (torch takes a list of ints for one leaf, and an empty list for a list of no tensors)
    return None, None, grad_x, grad_init, grad_params, grad_shaped, None if ctx.layout else []


torch.library.register_autograd("flexsn_dsl::fused_forward", _fused_autograd, setup_context=_setup_context)


def register(compiled: Compiled) -> str:
    """Make a spec's kernels reachable by name from the custom operators (for torch.compile)."""
    _REGISTRY[compiled.module_name] = compiled
    return compiled.module_name


def kernel_params(compiled: Compiled, params: dict[str, torch.Tensor], like: torch.Tensor):
    """The runtime parameters as the kernels take them, in the compute dtype of ``like`` (the
    inputs [T, ...]): each learnable scalar as a 0-dim tensor (INFO.scalar_params' order), and the
    shaped ones' values with their (inner, size) pairs (:func:`shaped_view`)."""
    model = compiled.model
    dtype = _torch_compute_dtype(like.dtype)
    scalars = [params[n].to(device=like.device, dtype=dtype).reshape(())
               for n in model.learnable if not model.parameters[n].shaped]
    shaped, layout = [], []
    for name in model.shaped:
        values, inner, size = shaped_view(params[name].to(device=like.device, dtype=dtype), like.shape[1:])
        shaped.append(values)
        layout += [inner, size]
    return scalars, shaped, layout


def run_triton(compiled: Compiled, inputs: Sequence[torch.Tensor], states: list[torch.Tensor],
               params: dict[str, torch.Tensor], store_seqs: bool):
    """Run T steps with the generated kernels; returns (outputs, final states, state sequences).
    Empty ``states``: start from the spec's constant initial values. ``params`` holds every runtime
    parameter (learnable scalars, and shaped ones that broadcast to a step)."""
    model = compiled.model  # (not INFO, which imports the kernels: nothing to trace under torch.compile)
    scalars = [n for n in model.learnable if not model.parameters[n].shaped]  # INFO.scalar_params
    like = inputs[0]
    param_list, shaped, layout = kernel_params(compiled, params, like)
    n_out, n_st = len(model.outputs), len(model.states)
    if torch.compiler.is_compiling():  # opaque custom operators; registered by FlexSN.__init__
        results = fused_forward(compiled.module_name, store_seqs, list(inputs), list(states), param_list, shaped,
                                layout)
        seqs = list(results[len(results) - 2 * n_st:len(results) - n_st]) if store_seqs else []
        return list(results[:n_out]), list(results[len(results) - n_st:]), seqs
    launch_settings()  # a bad setting is an error even for calls that launch nothing (T=0)
    kernels = _kernels(compiled, like.device.type)
    zero = kernels.info.zero_grads  # not in the graph: no gradient (None), as on the torch backend
    inputs = [x.detach() if name in zero else x for name, x in zip(model.inputs, inputs)]
    param_vec = _stack([p.detach() if name in zero else p for name, p in zip(scalars, param_list)])
    shaped = [v.detach() if name in zero else v for name, v in zip(model.shaped, shaped)]
    tensors = [*inputs, *states]
    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in (*tensors, *shaped)) or (param_vec is not None and param_vec.requires_grad))
    if not needs_grad:
        with torch.no_grad():
            outs, _, seqs, finals, _ = _forward(kernels, list(inputs), states, param_vec, shaped, layout, False,
                                                store_seqs)
        return outs, finals, seqs
    results = _TritonSteps.apply(kernels, store_seqs, len(inputs), tuple(layout), len(shaped), param_vec, *shaped,
                                 *tensors)
    outs = list(results[:n_out])
    seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
    finals = list(results[len(results) - n_st:])
    return outs, finals, seqs
