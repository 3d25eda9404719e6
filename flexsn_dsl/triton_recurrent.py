"""Launching the fused recurrent kernels of a spec with ``recurrent`` (the Triton backend).

A program owns ``BLOCK_B`` rows of the batch and all N features (padded to a power of two,
at least 16, for ``tl.dot``) and computes ``r_t = s_{t-1} @ W.T`` each step with ``tl.dot``
(float32: at the precision of ``$FLEXSN_DSL_RECURRENT_PRECISION``, 3xTF32 on tensor cores by default),
reading ``s_{t-1}`` back from the output it stored and the weight from L2 (on chip: the
weight of a layer is at most 1 MB, read by every program each step) in slices of
[_BLOCK_K, N], so that the shared memory of one program stays small for any N up to 512.
The backward runs the reverse recursion the same way with W. The weight gradient
Σ_t g_tᵀ s_{t-1} is one matrix product over the saved values.
"""
from __future__ import annotations

import functools
import math

import torch

from .compiler import Compiled
from .errors import SpecError
from .names import kernel_name
from .triton_autograd import _param_args, _seed_arg, _stack, kernel_params, new_seed, on_device
from .triton_plan import _REGISTRY, Kernels, _kernels_for
from .triton_settings import COMPILE_OPTIONS, _compute_dtype, _torch_compute_dtype, interpreting, launch_settings

BLOCK_B = 16      # rows of the batch per program (tl.dot needs at least 16)
MAX_N = 512       # features one program holds
W_SLICE = 8192    # weight elements a program holds at a time: [_BLOCK_K, N] (the weight stays in L2)


def unsupported(compiled: Compiled, n: int | None = None) -> str | None:
    """Why the fused recurrent kernels cannot run this spec with ``n`` neurons, or None when they
    can (from the model alone: no lowering, so that this runs inside torch.compile too)."""
    model = compiled.model
    if len(model.recurrent) != 1:
        return "the Triton backend runs specs with one recurrent input"
    (rec,) = model.recurrent.values()
    if rec.source not in [name for name, _ in model.outputs] or rec.source in model.inputs:
        return (f"the Triton backend feeds back outputs only: recurrent input {rec.name!r} comes from "
                f"{rec.source!r}; list {rec.source!r} in `outputs`")
    if n is not None and n > MAX_N:
        return (f"the Triton backend's recurrent kernel holds at most N = {MAX_N} neurons per layer (a program "
                f"holds all N features of its rows), got N = {n}: use layers of at most {MAX_N} neurons")
    return None


def _dot_dtype(dtype: torch.dtype):
    """The operands' type of the step's matrix product: 16-bit storage multiplies in 16 bits on the
    GPU (accumulating in float32) and in float32 in Triton's interpreter (whose 16-bit tl.dot is wrong)."""
    import triton.language as tl  # (after .triton_settings, which turns the interpreter on where there is no GPU)
    if dtype in (torch.float64, torch.float32) or interpreting():
        return _compute_dtype(dtype)
    return tl.float16 if dtype == torch.float16 else tl.bfloat16


def _dot_precision(x: torch.Tensor) -> str:
    """tl.dot's ``input_precision`` for the step's product on inputs like ``x``: the launch setting
    (``$FLEXSN_DSL_RECURRENT_PRECISION``, read and checked at every launch) for float32; "ieee" for
    float64 (tl.dot has no other) and 16-bit operands (multiplied in 16 bits whatever the setting),
    and on a GPU without TF32 tensor cores (before compute capability 8.0, where torch's
    ``allow_tf32`` has no effect either)."""
    precision = launch_settings().recurrent_precision
    if x.dtype != torch.float32 or (x.is_cuda and precision != "ieee" and not _tf32_cores(x.device.index)):
        return "ieee"
    return precision


@functools.lru_cache(maxsize=None)
def _tf32_cores(index: int) -> bool:
    """Whether CUDA device ``index`` has TF32 tensor cores (compute capability 8.0 and later)."""
    return torch.cuda.get_device_capability(index)[0] >= 8


def _blocks(b: int) -> int:
    """Programs for ``b`` rows of the batch."""
    return -(-b // BLOCK_B)


def _padded(n: int) -> int:
    """N padded to a power of two >= 16 (tl.dot); N > MAX_N is refused when the module is built."""
    return max(16, 1 << (n - 1).bit_length())


def _forward(kernels: Kernels, xs, inits, prev, weight, params, shaped, layout, seed) -> list[torch.Tensor]:
    """Outputs (shaped like the inputs), then flat [T, B, N] saved values and the recurrent input,
    final states and the final value fed back. Empty ``inits``: the spec's constant initial states.
    ``seed``: :func:`~flexsn_dsl.triton_autograd.new_seed`'s for a spec with draws, else None."""
    info = kernels.info
    x = xs[0]
    T, N, shape = x.shape[0], x.shape[-1], x.shape
    B = math.prod(shape[1:-1])  # (T may be 0)
    flat = [t.reshape(T, B, N).contiguous() for t in xs]
    init = [s.reshape(B, N).contiguous() for s in inits]
    prev = prev.reshape(B, N).contiguous()
    outs = [x.new_empty(T, B, N) for _ in info.output_names]
    saved = [x.new_empty(T, B, N) for _ in info.saved_names] + [x.new_empty(_kept_r_shape(info, T, B, N))]
    finals = [x.new_empty(B, N) for _ in [*info.state_names, "fed"]]
    meta = _meta(x, T, B, N)  # (a bad launch setting is an error even when nothing is launched)
    if T and B and N:
        args = [*flat, *(init or [prev] * len(info.state_names)), prev, weight.contiguous(), *outs, *saved, *finals]
        args += _param_args(_stack(params), shaped, layout) + _seed_arg(seed)
        flags = {"_CONST_INIT": not init} if info.initial_values else {}
        kernel = getattr(kernels.module, kernel_name(kernels.name, "recurrent_forward"))
        kernel[(_blocks(B),)](*args, **meta, _TRAIN=True, **flags)
    else:
        starts = [s.clone() for s in init] if init else [x.new_full((B, N), v) for v in info.initial_values]
        finals = [*starts, prev.clone()]
    return [*(o.reshape(shape) for o in outs), *saved, *(f.reshape(shape[1:]) for f in finals)]


def _kept_r_shape(info, T: int, B: int, N: int) -> tuple[int, ...]:
    """The recurrent input's sequence is stored only when the backward reads it."""
    kept = ("input", len(info.input_names) - 1) in info.c2k_return_mapping
    return (T, B, N) if kept else (0,)


def _meta(x: torch.Tensor, T: int, B: int, N: int) -> dict:
    """The launch's sizes and constexprs (the launch settings read here); 8 warps from N = 256 (ptxas
    for sm_90a: a quarter of the register spills of 4 warps at N = 512 in float32)."""
    padded = _padded(N)
    warps = {} if interpreting() else {"num_warps": 8 if padded >= 256 else 4}
    return dict(_T=T, _B=B, _N=N, _BLOCK_B=BLOCK_B, _NP=padded, _BLOCK_K=min(padded, max(16, W_SLICE // padded)),
                _DTYPE=_compute_dtype(x.dtype), _DOT_DTYPE=_dot_dtype(x.dtype), _PRECISION=_dot_precision(x),
                **warps, **COMPILE_OPTIONS)


def _learnable_shaped(info) -> list[int]:
    """Indices (in ``info.shaped_names``) of the learnable shaped parameters."""
    return [k for k, n in enumerate(info.shaped_names) if n in info.param_names]


def _backward(kernels: Kernels, grads, saved, xs, outs, prev, weight, params, shaped, layout, init_grads: bool,
              seed):
    """Gradients of the inputs, the initial states (when ``init_grads``), the value fed back before
    the first step, the weight, the scalar parameters (a vector, empty when none) and each learnable
    shaped parameter's values."""
    info = kernels.info
    x = xs[0]
    T, N, shape = x.shape[0], x.shape[-1], x.shape
    B = math.prod(shape[1:-1])  # (T may be 0)
    n_out = len(info.output_names)
    flat_in = [t.reshape(T, B, N).contiguous() for t in xs] + [saved[-1]]
    flat_out = [o.reshape(T, B, N).contiguous() for o in outs]
    g_out = [x.new_zeros(T, B, N) if g is None else g.reshape(T, B, N).contiguous() for g in grads[:n_out]]
    finals = grads[n_out:]
    g_final = [x.new_zeros(B, N) if g is None else g.reshape(B, N).contiguous() for g in finals]
    grad_in = [x.new_zeros(T, B, N) for _ in info.input_names]
    grad_init = [g.clone() for g in g_final]  # T = 0: the final values are the initial ones
    blocks = _blocks(B)
    compute = _torch_compute_dtype(x.dtype)
    partial = x.new_zeros(blocks, info.num_params, dtype=compute)
    per_element = [x.new_zeros(B * N, dtype=compute) for _ in _learnable_shaped(info)]
    meta = _meta(x, T, B, N)
    if T and B and N:
        args = [*g_out, *g_final, *saved[:-1], *flat_in, *flat_out, weight.contiguous(), *grad_in, *grad_init]
        args += _param_args(_stack(params), shaped, layout)
        args += ([partial] if info.scalar_params else []) + per_element + _seed_arg(seed)
        kernel = getattr(kernels.module, kernel_name(kernels.name, "recurrent_backward"))
        kernel[(blocks,)](*args, **meta, _HAS_FINAL_GRADS=any(g is not None for g in finals),
                          _WRITE_INIT_GRADS=True)
    # the weight gradient: the sum over steps and rows of g_t^T s_{t-1}, one matrix product
    fed = flat_out[info.recurrent[0][2]]
    before = torch.cat([prev.reshape(1, B, N), fed])[:T]
    grad_w = grad_in[-1].reshape(T * B, N).to(compute).T @ before.reshape(T * B, N).to(compute)
    # a shaped parameter's value k is read at the offsets o with (o // inner) % size == k
    grad_shaped = [g.reshape(-1, layout[2 * k + 1], layout[2 * k]).sum((0, 2))
                   for g, k in zip(per_element, _learnable_shaped(info))]
    return [*(g.reshape(shape) for g in grad_in[:-1]), *(g.reshape(shape[1:]) for g in grad_init[:-1] if init_grads),
            grad_init[-1].reshape(shape[1:]), grad_w.to(weight.dtype), partial.sum(0), *grad_shaped]


# -- custom operators, so that eager calls and torch.compile(fullgraph=True) run the same opaque code --

@torch.library.custom_op("flexsn_dsl::recurrent_forward", mutates_args=())
def recurrent_forward(key: str, xs: list[torch.Tensor], inits: list[torch.Tensor], prev: torch.Tensor,
                      weight: torch.Tensor, params: list[torch.Tensor], shaped: list[torch.Tensor],
                      layout: list[int], seed: torch.Tensor | None) -> list[torch.Tensor]:
    """See :func:`_forward`; ``params`` holds each learnable scalar parameter as a 0-dim tensor,
    ``shaped`` and ``layout`` the shaped parameters (:func:`flexsn_dsl.triton_autograd.kernel_params`)."""
    with on_device(xs[0]):
        return _forward(_kernels_for(key, xs[0]), xs, inits, prev, weight, params, shaped, layout, seed)


@recurrent_forward.register_fake
def _recurrent_forward_fake(key, xs, inits, prev, weight, params, shaped, layout, seed):
    info = _REGISTRY[key].info
    x = xs[0]
    T, N = x.shape[0], x.shape[-1]
    flat = (T, math.prod(x.shape[1:-1]), N)
    return ([x.new_empty(x.shape) for _ in info.output_names] +
            [x.new_empty(flat) for _ in info.saved_names] + [x.new_empty(_kept_r_shape(info, *flat))] +
            [x.new_empty(x.shape[1:]) for _ in [*info.state_names, "fed"]])


@torch.library.custom_op("flexsn_dsl::recurrent_backward", mutates_args=())
def recurrent_backward(key: str, grads: list[torch.Tensor | None], saved: list[torch.Tensor], xs: list[torch.Tensor],
                       outs: list[torch.Tensor], prev: torch.Tensor, weight: torch.Tensor, params: list[torch.Tensor],
                       shaped: list[torch.Tensor], layout: list[int], init_grads: bool,
                       seed: torch.Tensor | None) -> list[torch.Tensor]:
    """See :func:`_backward`."""
    with on_device(xs[0]):
        return _backward(_kernels_for(key, xs[0]), grads, saved, xs, outs, prev, weight, params, shaped, layout,
                         init_grads, seed)


@recurrent_backward.register_fake
def _recurrent_backward_fake(key, grads, saved, xs, outs, prev, weight, params, shaped, layout, init_grads, seed):
    info = _REGISTRY[key].info
    x = xs[0]
    dtype = _torch_compute_dtype(x.dtype)
    return ([x.new_empty(x.shape) for _ in xs] + [x.new_empty(x.shape[1:]) for _ in info.state_names if init_grads] +
            [x.new_empty(x.shape[1:]), weight.new_empty(weight.shape), x.new_empty(len(params), dtype=dtype)] +
            [shaped[k].new_empty(shaped[k].shape, dtype=dtype) for k in _learnable_shaped(info)])


def _setup_context(ctx, inputs, output):
    key, xs, inits, prev, weight, params, shaped, layout, seed = inputs
    info = _REGISTRY[key].info
    n_out, n_saved = len(info.output_names), len(info.saved_names) + 1
    ctx.key, ctx.n_in, ctx.n_out, ctx.n_saved, ctx.n_inits = key, len(xs), n_out, n_saved, len(inits)
    ctx.n_params, ctx.layout = len(params), list(layout)
    ctx.save_for_backward(seed, *output[n_out:n_out + n_saved], *xs, *output[:n_out], prev, weight, *params, *shaped)


def _autograd(ctx, grads):
    info = _REGISTRY[ctx.key].info
    seed, *tensors = ctx.saved_tensors
    k, n_in, n_out = ctx.n_saved, ctx.n_in, ctx.n_out
    saved, xs, outs = tensors[:k], tensors[k:k + n_in], tensors[k + n_in:k + n_in + n_out]
    prev, weight = tensors[k + n_in + n_out], tensors[k + n_in + n_out + 1]
    params = tensors[k + n_in + n_out + 2:k + n_in + n_out + 2 + ctx.n_params]
    shaped = tensors[k + n_in + n_out + 2 + ctx.n_params:]
    wanted = list(grads[:n_out]) + list(grads[n_out + k:])  # outputs, final states, final value fed back
    result = recurrent_backward(ctx.key, wanted, saved, xs, outs, prev, weight, params, shaped, ctx.layout,
                                ctx.n_inits > 0, seed)
    grad_x, grad_init = result[:n_in], result[n_in:n_in + ctx.n_inits]
    grad_prev, grad_w, grad_params = result[n_in + ctx.n_inits:n_in + ctx.n_inits + 3]
    rest = iter(result[n_in + ctx.n_inits + 3:])  # the learnable shaped parameters' gradients
    grad_shaped = [next(rest) if name in info.param_names else None for name in info.shaped_names]
    # (torch takes a list of ints for one leaf, and an empty list for a list of no tensors)
    return (None, grad_x, grad_init, grad_prev, grad_w, [grad_params[i] for i in range(len(params))], grad_shaped,
            None if ctx.layout else [], None)


torch.library.register_autograd("flexsn_dsl::recurrent_forward", _autograd, setup_context=_setup_context)


def run_recurrent(compiled: Compiled, inputs, states: list[torch.Tensor], prev: torch.Tensor,
                  weight: torch.Tensor, params: dict[str, torch.Tensor]):
    """T steps of a recurrent spec with the fused kernels; returns (outputs, final states, [value fed back]).
    Empty ``states``: start from the spec's constant initial values."""
    scalars, shaped, layout = kernel_params(compiled, params, inputs[0])
    seed = new_seed(inputs[0]) if compiled.ir.used_draws else None
    results = recurrent_forward(compiled.module_name, list(inputs), list(states), prev, weight, scalars, shaped,
                                layout, seed)
    n_out, n_finals = len(compiled.model.outputs), len(compiled.model.states) + 1
    finals = results[len(results) - n_finals:]
    return list(results[:n_out]), list(finals[:-1]), [finals[-1]]


def check(compiled: Compiled, n: int | None = None) -> None:
    """Refuse a recurrent spec the fused kernels cannot run (with ``n`` neurons), saying why and
    what to do (backend='triton')."""
    reason = unsupported(compiled, n)
    if reason is not None:
        rec = next(iter(compiled.model.recurrent.values()))
        raise SpecError(f"{compiled.model.name}: {reason}", rec.pos,
                        'or use backend="torch" (or "auto", which falls back to it)'
                        ).with_source(compiled.model.text.splitlines())
