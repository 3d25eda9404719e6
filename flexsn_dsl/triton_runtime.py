"""Launching the generated kernels: block sizes, the autograd Function, the interpreter on CPU."""
from __future__ import annotations

import functools
import os
from typing import Sequence

import torch

from .compiler import Compiled

CPU_BLOCK = 1024


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

    def kernel(self, variant: str):
        kernel = getattr(self.module, f"{self.name}_{variant}_kernel")
        return kernel if self.interpret else _tuned(kernel)

    def launch(self, variant: str, n: int, args: list, **constexprs) -> None:
        kernel = self.kernel(variant)
        if self.interpret:
            block = min(CPU_BLOCK, max(16, 1 << (max(n, 1) - 1).bit_length()))
            grid = (triton_cdiv(n, block),)
            kernel[grid](*args, _BLOCK=block, **constexprs)
        else:
            kernel[lambda meta: (triton_cdiv(n, meta["_BLOCK"]),)](*args, **constexprs)

    def blocks(self, n: int) -> int:
        """Number of programs a launch over n neurons uses (for partial parameter gradients)."""
        if self.interpret:
            block = min(CPU_BLOCK, max(16, 1 << (max(n, 1) - 1).bit_length()))
            return triton_cdiv(n, block)
        return triton_cdiv(n, 16)  # upper bound for any tuned block (>= 16)


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter in this process."""
    import triton
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_cdiv(a: int, b: int) -> int:
    return (a + b - 1) // b


@functools.lru_cache(maxsize=None)
def _tuned(kernel):
    import triton
    configs = [triton.Config({"_BLOCK": b}, num_warps=w) for b, w in
               ((128, 1), (256, 2), (512, 4), (1024, 4), (2048, 8))]
    return triton.autotune(configs=configs, key=["_N", "_DTYPE"], reset_to_zero=_zero_args(kernel))(kernel)


def _zero_args(kernel) -> list[str] | None:
    names = [a for a in kernel.arg_names if a == "params__grad"]
    return names or None


@functools.lru_cache(maxsize=None)
def _kernels(compiled: Compiled, device_type: str) -> Kernels:
    return Kernels(compiled, torch.device(device_type))


def _flat(x: torch.Tensor, T: int) -> torch.Tensor:
    return x.reshape(T, -1).contiguous()


def _forward(kernels: Kernels, xs, inits, params, training: bool, store_seqs: bool):
    info = kernels.info
    T = xs[0].shape[0]
    shape = xs[0].shape[1:]
    n = xs[0][0].numel() if T else inits[0].numel()
    like = xs[0]
    flat_x = [_flat(x, T) for x in xs]
    flat_init = [s.reshape(-1).contiguous() for s in inits]
    outs = [like.new_empty((T, n)) for _ in info.output_names]
    saved = [like.new_empty((T, n)) for _ in info.saved_names] if training else []
    seqs = [like.new_empty((T, n)) for _ in info.state_names] if store_seqs else []
    finals = [like.new_empty((n,)) for _ in info.state_names]
    if T == 0:
        finals = [s.clone() for s in flat_init]
    elif n > 0:
        variant = ("forward" if training else "inference") + ("" if store_seqs else "_final_state")
        args = [*flat_x, *flat_init, *outs, *saved, *seqs, *finals]
        if info.param_names:
            args.append(params)
        kernels.launch(variant, n, args + [T, n], _DTYPE=_compute_dtype(like.dtype))
    view = lambda t: t.reshape(T, *shape)  # noqa: E731
    return [view(o) for o in outs], saved, [view(s) for s in seqs], [f.reshape(shape) for f in finals], flat_x


class _TritonSteps(torch.autograd.Function):
    """Fused multi-step forward and backward; inputs: params, then inputs, then initial states."""

    @staticmethod
    def forward(ctx, kernels: Kernels, store_seqs: bool, n_inputs: int, params, *tensors):
        xs, inits = list(tensors[:n_inputs]), list(tensors[n_inputs:])
        outs, saved, seqs, finals, flat_x = _forward(kernels, xs, inits, params, True, store_seqs)
        ctx.kernels, ctx.store_seqs, ctx.n_inputs = kernels, store_seqs, n_inputs
        ctx.shape, ctx.T = xs[0].shape, xs[0].shape[0]
        ctx.init_dtypes = [s.dtype for s in inits]
        ctx.save_for_backward(params, *saved, *flat_x, *[o.reshape(ctx.T, -1) for o in outs])
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        kernels: Kernels = ctx.kernels
        info = kernels.info
        T, shape = ctx.T, ctx.shape
        n = int(torch.Size(shape[1:]).numel())
        tensors = ctx.saved_tensors
        params = tensors[0]
        k = len(info.saved_names)
        saved, flat_x, flat_out = tensors[1:1 + k], tensors[1 + k:1 + k + ctx.n_inputs], tensors[1 + k + ctx.n_inputs:]
        n_out, n_st = info.num_outputs, info.num_states
        grad_outs = [_flat(g, T) for g in grads[:n_out]]
        grad_seqs = [_flat(g, T) for g in grads[n_out:n_out + n_st]] if ctx.store_seqs else []
        grad_finals = [g.reshape(-1).contiguous() for g in grads[len(grads) - n_st:]]
        like = flat_x[0]
        grad_x = [torch.empty_like(x) for x in flat_x]
        grad_init = [like.new_empty((n,), dtype=dt) for dt in ctx.init_dtypes]
        grad_params = None
        if T == 0 or n == 0:
            grad_x = [torch.zeros_like(x) for x in flat_x]
            grad_init = [g.clone() for g in grad_finals]
        else:
            states_arg = grad_seqs if grad_seqs else grad_finals  # any valid pointer when unused
            args = [*grad_outs, *states_arg, *grad_finals, *saved, *flat_x, *flat_out, *grad_x, *grad_init]
            if info.param_names:
                partial = params.new_zeros((kernels.blocks(n), info.num_params))
                args += [params, partial]
            kernels.launch("backward", n, args + [T, n], _DTYPE=_compute_dtype(like.dtype),
                           _HAS_STATE_GRADS=bool(grad_seqs))
            if info.param_names:
                grad_params = partial.sum(0)
        grad_x = [g.reshape(shape) for g in grad_x]
        grad_init = [g.reshape(shape[1:]) for g in grad_init]
        return (None, None, None, grad_params, *grad_x, *grad_init)


def run_triton(compiled: Compiled, inputs: Sequence[torch.Tensor], states: list[torch.Tensor],
               params: dict[str, torch.Tensor], store_seqs: bool):
    """Run T steps with the generated kernels; returns (outputs, final states, state sequences)."""
    kernels = _kernels(compiled, inputs[0].device.type)
    info = kernels.info
    dtype = _torch_compute_dtype(inputs[0].dtype)
    param_vec = torch.stack([params[n].to(device=inputs[0].device, dtype=dtype).reshape(())
                             for n in info.param_names]) if info.param_names else None
    tensors = [*inputs, *states]
    needs_grad = torch.is_grad_enabled() and (
        any(t.requires_grad for t in tensors) or (param_vec is not None and param_vec.requires_grad))
    if not needs_grad:
        with torch.no_grad():
            outs, _, seqs, finals, _ = _forward(kernels, list(inputs), states, param_vec, False, store_seqs)
        return outs, finals, seqs
    results = _TritonSteps.apply(kernels, store_seqs, len(inputs), param_vec, *tensors)
    n_out, n_st = info.num_outputs, info.num_states
    outs = list(results[:n_out])
    seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
    finals = list(results[len(results) - n_st:])
    return outs, finals, seqs
