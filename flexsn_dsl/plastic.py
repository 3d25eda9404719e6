"""``PlasticLinear``: a weight matrix that learns by a synapse spec, coupled with the neuron it drives.

Per step (docs/synapses.md): (1) every trace decays; (2) ``I = W s_pre`` with the weights before this
step's updates; (3) one step of the postsynaptic neuron on ``I`` gives ``s_post``; (4) ``on_pre`` where the
presynaptic neuron spiked; (5) ``on_post`` where the postsynaptic neuron spiked; each block's lines in order.
"""
from __future__ import annotations

import hashlib
import math
import os
import sys
import warnings
from typing import Callable, Mapping

import torch
from torch import nn

from .compiler import Compiled, import_source
from .errors import ShapeError, SpecError
from .source import read_spec, spec_text
from .synapse import SynapseModel, build_synapse
from .synapse_torch import torch_source
from .triton_autograd import kernel_params, on_device
from .triton_settings import _compute_dtype, _torch_compute_dtype, triton
from . import plastic_kernels


class SynapseSpec:
    """A loaded synapse spec: what :func:`flexsn_dsl.load` returns for ``kind: synapse``. Calling it
    (``spec(n_pre, n_post, post_neuron, ...)``) makes a :class:`PlasticLinear`."""

    def __init__(self, model: SynapseModel):
        self.model = model
        source = torch_source(model)
        name = f"flexsn_dsl_synapse_{model.name}_{hashlib.sha256(source.encode()).hexdigest()[:16]}"
        module = sys.modules.get(name) or import_source(name, source, f"<flexsn-dsl synapse {name}>")
        self.torch_source = source
        self.on_pre: Callable = module.on_pre
        self.on_post: Callable = module.on_post

    @property
    def name(self) -> str:
        return self.model.name

    def __call__(self, n_pre: int, n_post: int, post_neuron: nn.Module, **kwargs) -> "PlasticLinear":
        return PlasticLinear(self, n_pre, n_post, post_neuron, **kwargs)

    def __repr__(self) -> str:
        return f"SynapseSpec({self.model.name!r}, pre={list(self.model.pre)}, post={list(self.model.post)})"


def load_synapse(path: str | os.PathLike, params: Mapping[str, float] | None = None) -> SynapseSpec:
    """A synapse spec file, loaded."""
    return SynapseSpec(build_synapse(read_spec(path), os.fsdecode(path), params))


def loads_synapse(text: str, params: Mapping[str, float] | None = None, filename: str = "<string>") -> SynapseSpec:
    """A synapse spec from its text."""
    return SynapseSpec(build_synapse(spec_text(text, filename), filename, params))


def _spec(spec) -> SynapseSpec:
    if isinstance(spec, SynapseSpec):
        return spec
    if isinstance(spec, SynapseModel):
        return SynapseSpec(spec)
    if isinstance(spec, (str, os.PathLike)):
        return load_synapse(spec)
    raise TypeError(f"spec must be a loaded synapse spec (flexsn_dsl.load of a `kind: synapse` file) or its path, "
                    f"not {type(spec).__name__}")


def _shared_update(w: torch.Tensor, new, mask: torch.Tensor) -> torch.Tensor:
    """Shared weights [n_post, n_pre]: each batch entry's change where ``mask``, summed over the batch."""
    changed = torch.where(mask, new, w)
    return changed[0] if changed.shape[0] == 1 else w + (changed - w).sum(0)


def _sample_update(w: torch.Tensor, new, mask: torch.Tensor) -> torch.Tensor:
    """Weights per batch entry [B, n_post, n_pre]: the new values where ``mask``."""
    return torch.where(mask, new, w)


BACKENDS = ("auto", "triton", "torch")
_MAX_OFFSET = 2**31  # the fused kernel's offsets are int32


class PlasticLinear(nn.Module):
    """All-to-all synapses from ``n_pre`` to ``n_post`` neurons that learn by a synapse spec, driving
    ``post_neuron`` (a neuron module, e.g. ``flexsn_dsl.load("lif.yaml")``).

    ``forward(x, *inputs)``: presynaptic spikes ``x`` ``[T, B, n_pre]`` (or ``[T, n_pre]``) and the spec's
    ``inputs`` (each ``[T]`` or ``[T, B]``, by position or name) -> postsynaptic spikes ``[T, B, n_post]``.
    ``weight`` is a buffer: ``[n_post, n_pre]`` shared by the batch (each step's changes summed over it), or
    with ``per_sample=True`` ``[B, n_post, n_pre]``, one matrix per batch entry (made from the initial
    ``[n_post, n_pre]`` at the first call). ``weight`` at construction: a tensor or a number (default:
    ``nn.Linear``'s initialisation). Traces and the neuron's states carry over between calls until
    :meth:`reset`; the weights stay. Nothing here is recorded by autograd.
    """

    def __init__(self, spec, n_pre: int, n_post: int, post_neuron: nn.Module, *, per_sample: bool = False,
                 weight: torch.Tensor | float | None = None, dtype: torch.dtype | None = None,
                 device: torch.device | str | None = None, backend: str = "auto"):
        super().__init__()
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {', '.join(map(repr, BACKENDS))}, not {backend!r}")
        self.backend = backend
        self._warned = False
        self._kernel: tuple = ()  # (the post neuron's Compiled, its fused kernel): built once, not copied
        for name, n in (("n_pre", n_pre), ("n_post", n_post)):
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ValueError(f"{name} must be a positive whole number, got {n!r}")
        if not isinstance(post_neuron, nn.Module):
            raise TypeError(f"post_neuron must be a neuron module (an nn.Module), not {type(post_neuron).__name__}")
        self._synapse = _spec(spec)
        self.n_pre, self.n_post, self.per_sample = n_pre, n_post, bool(per_sample)
        self.post_neuron = post_neuron
        self.register_buffer("weight", self._initial_weight(weight, dtype, device))
        self.traces: dict[str, torch.Tensor] = {}

    def _initial_weight(self, weight, dtype, device) -> torch.Tensor:
        shape = (self.n_post, self.n_pre)
        if weight is None:
            w = torch.empty(shape, dtype=dtype, device=device)
            nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's initialisation
            return w
        if not isinstance(weight, torch.Tensor):
            return torch.full(shape, float(weight), dtype=dtype, device=device)
        w = weight.detach().clone().to(dtype=dtype or (weight.dtype if weight.is_floating_point() else None),
                                       device=device or weight.device)
        if tuple(w.shape[-2:]) != shape or w.dim() not in (2, 3) or (w.dim() == 3 and not self.per_sample):
            raise ShapeError(f"weight must have shape [n_post, n_pre] = {list(shape)}"
                             + (" or [B, n_post, n_pre]" if self.per_sample else "") + f", not {list(w.shape)}")
        return w

    @property
    def spec(self) -> SynapseModel:
        return self._synapse.model

    def extra_repr(self) -> str:
        return (f"synapse={self.spec.name!r}, n_pre={self.n_pre}, n_post={self.n_post}, "
                f"per_sample={self.per_sample}, backend={self.backend!r}")

    def reset(self) -> None:
        """Forget the traces and the neuron's states (the weights stay)."""
        self.traces = {}
        if hasattr(self.post_neuron, "reset"):
            self.post_neuron.reset()

    def _apply(self, fn, recurse=True):
        super()._apply(fn, recurse)
        self.traces = {k: fn(v) for k, v in self.traces.items()}
        return self

    def _inputs(self, args: tuple, kwargs: dict, T: int, B: int, like: torch.Tensor) -> list[torch.Tensor]:
        names = self.spec.inputs
        if len(args) > len(names):
            raise TypeError(f"synapse {self.spec.name!r} takes {len(names)} input(s) {names} after x, got {len(args)}")
        given = dict(zip(names, args))
        for k, v in kwargs.items():
            if k not in names or k in given:
                raise TypeError(f"unexpected or repeated input {k!r} (the synapse's inputs: {names})")
            given[k] = v
        out = []
        for name in names:
            if name not in given:
                raise TypeError(f"synapse {self.spec.name!r} needs its input {name!r} ([T] or [T, B])")
            v = torch.as_tensor(given[name]).to(dtype=like.dtype, device=like.device)
            if v.dim() == 0 or v.dim() > 2 or v.shape[0] != T:
                raise ShapeError(f"input {name!r} must have shape [T] or [T, B] with T = {T}, not {list(v.shape)}")
            out.append(v.reshape(T, -1).expand(T, B))
        return out

    def _start(self, B: int, like: torch.Tensor) -> list[torch.Tensor]:
        """The traces carried from the last call (zeros after reset()), pre then post."""
        spec = self.spec
        sizes = {**{n: self.n_pre for n in spec.pre}, **{n: self.n_post for n in spec.post}}
        out = []
        for name, n in sizes.items():
            carried = self.traces.get(name)
            if carried is not None and carried.shape != (B, n):
                raise ValueError(f"{spec.name}: the traces carried from the last call have batch size "
                                 f"{carried.shape[0]}, not {B}: call reset() before a new batch size")
            out.append(like.new_zeros(B, n) if carried is None else carried.to(like))
        return out

    def _weight(self, B: int, dtype: torch.dtype) -> torch.Tensor:
        w = self.weight.to(dtype)
        if not self.per_sample:
            return w
        if w.dim() == 2:
            return w.expand(B, *w.shape).clone()
        if w.shape[0] != B:
            raise ShapeError(f"{self.spec.name}: per_sample weights for a batch of {w.shape[0]}, but the input's batch "
                             f"is {B}")
        return w

    def forward(self, x: torch.Tensor, *args, **kwargs) -> torch.Tensor:
        if x.dim() not in (2, 3) or x.shape[-1] != self.n_pre:
            raise ShapeError(f"{self.spec.name}: x must have shape [T, B, n_pre] or [T, n_pre] with n_pre = "
                             f"{self.n_pre}, not {list(x.shape)}")
        single = x.dim() == 2
        if single:
            x = x[:, None]
        T, B = x.shape[0], x.shape[1]
        dtype = self.weight.dtype if self.weight.is_floating_point() else torch.get_default_dtype()
        with torch.no_grad():
            x = x.to(dtype=dtype, device=self.weight.device)
            inputs = self._inputs(args, kwargs, T, B, x)
            out = self._run_fused(x, inputs) if self._use_fused(x) else self._run(x, inputs)
        return out[:, 0] if single else out

    def _run(self, x: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
        spec, syn = self.spec, self._synapse
        T, B = x.shape[0], x.shape[1]
        w = self._weight(B, x.dtype)
        traces = self._start(B, x)
        decays = [t.decay for t in (*spec.pre.values(), *spec.post.values())]
        update = _sample_update if self.per_sample else _shared_update
        step_mode = getattr(self.post_neuron, "step_mode", "m")
        outputs = []
        for t in range(T):
            s_pre = x[t]
            traces = [trace * d for trace, d in zip(traces, decays)]  # (1)
            current = (w @ s_pre[:, :, None])[..., 0] if self.per_sample else s_pre @ w.T  # (2)
            s_post = self._neuron(current, step_mode)  # (3)
            now = [v[t] for v in inputs]
            w, traces = syn.on_pre(s_pre != 0, update, w, *traces, *now)  # (4)
            w, traces = syn.on_post(s_post != 0, update, w, *traces, *now)  # (5)
            traces = list(traces)
            outputs.append(s_post)
        self.weight = w.to(self.weight.dtype)
        names = [*spec.pre, *spec.post]
        self.traces = dict(zip(names, traces))
        return torch.stack(outputs) if outputs else x.new_zeros(0, B, self.n_post)

    def _neuron(self, current: torch.Tensor, step_mode: str) -> torch.Tensor:
        """One step of the postsynaptic neuron on ``current`` [B, n_post]: its (first) output, the spikes."""
        out = self.post_neuron(current if step_mode == "s" else current[None])
        if isinstance(out, (tuple, list)):
            out = out[0]
        out = out if step_mode == "s" else out[0]
        if out.shape != current.shape:
            raise ShapeError(f"{self.spec.name}: the post neuron's output has shape {list(out.shape)}, not the step's "
                             f"{list(current.shape)}")
        return out.to(current.dtype)

    def fused_unsupported(self, batch: int) -> str | None:
        """Why the fused kernel cannot run this layer on a batch of ``batch``, or None when it can."""
        neuron = self.post_neuron
        if not isinstance(getattr(neuron, "_compiled", None), Compiled):  # (a FlexSN: runtime imports this module)
            return f"its post neuron is a {type(neuron).__name__}, not a flexsn-dsl neuron module (flexsn_dsl.load)"
        if not self.per_sample and batch > 1:
            return ("shared weights add up each step's changes over a batch of more than one, which the fused kernel "
                    "does not do: use per_sample=True or a batch of one")
        return plastic_kernels.unsupported(neuron._compiled)

    def _fused_kernel(self):
        """The fused kernel for the post neuron's code, kept while that code stays the same (its text is printed
        once, not at every call)."""
        compiled = self.post_neuron._compiled
        if not getattr(self, "_kernel", ()) or self._kernel[0] is not compiled:  # (none in a layer saved before it)
            self._kernel = (compiled, plastic_kernels.plastic_module(self.spec, compiled))
        return self._kernel[1]

    def __getstate__(self) -> dict:
        state = self.__dict__.copy()
        state["_kernel"] = ()  # (a Triton function: built again after a copy or unpickling)
        return state

    def _use_fused(self, x: torch.Tensor) -> bool:
        """Whether this call runs the fused kernel (``backend``, above)."""
        if self.backend == "torch" or (self.backend == "auto" and not x.is_cuda):
            return False
        reason = self.fused_unsupported(x.shape[1])
        if reason is None:
            try:
                self._fused_kernel()
            except SpecError as exc:
                reason = f"its kernel cannot be built: {exc}"
        if reason is not None and self.backend == "triton":
            raise SpecError(f"{self.spec.name}: the fused Triton kernel cannot run this layer: {reason}")
        if reason is not None and not self._warned:
            self._warned = True
            warnings.warn(f"flexsn-dsl: {self.spec.name}: PlasticLinear runs a loop of torch steps: {reason}",
                          stacklevel=3)
        return reason is None

    def _run_fused(self, x: torch.Tensor, inputs: list[torch.Tensor]) -> torch.Tensor:
        """The whole sequence in the fused kernel (:mod:`flexsn_dsl.plastic_kernels`)."""
        spec, neuron = self.spec, self.post_neuron
        T, B = x.shape[0], x.shape[1]
        n_pre, n_post = self.n_pre, self.n_post
        if max(T, 1) * B * max(n_pre, n_post) >= _MAX_OFFSET or B * n_post * n_pre >= _MAX_OFFSET:
            raise ShapeError(f"{spec.name}: the fused kernel indexes with int32: T * B * n and B * n_post * n_pre "
                             f"must stay below 2**31 (T={T}, B={B}, n_pre={n_pre}, n_post={n_post}); call it on "
                             "fewer steps at a time")
        compute = _torch_compute_dtype(x.dtype)
        kernel = self._fused_kernel()
        w = self._weight(B, x.dtype).reshape(-1, n_post, n_pre).contiguous()
        traces = [t.to(compute) for t in self._start(B, x)]
        n_traces = len(spec.pre)
        rows = min(triton.next_power_of_2(n_post), 16)
        cols = min(triton.next_power_of_2(n_pre), max(32, 4096 // rows))
        blocks = -(-n_post // rows)
        pre = torch.stack(traces[:n_traces]) if n_traces else x.new_zeros(1, B, n_pre, dtype=compute)
        own = pre[:, :, None].expand(-1, B, blocks, n_pre).contiguous()  # a copy for each block of rows
        post = torch.stack(traces[n_traces:]) if spec.post else x.new_zeros(1, B, n_post, dtype=compute)
        like = x.new_zeros(1, B, n_post, dtype=compute)
        states = torch.stack([s.to(compute).expand(B, n_post) for s in neuron.starting_states(like)]).contiguous()
        scalars = kernel_params(neuron._compiled, neuron._param_values(), like)[0]
        params = torch.stack(scalars) if scalars else like.new_zeros(1)
        given = torch.stack(inputs).contiguous() if inputs else like.new_zeros(1)
        out = x.new_empty(T, B, n_post)
        with on_device(x):
            kernel[(B, blocks)](x.contiguous(), out, w, own, post, states, given, params, T, B, blocks, n_pre, n_post,
                                _DTYPE=_compute_dtype(x.dtype), _BP=rows, _BK=cols)
        self.weight = (w if self.per_sample else w[0]).to(self.weight.dtype)
        finals = [*own[:, :, 0].unbind(0)[:n_traces], *post.unbind(0)[:len(spec.post)]]
        self.traces = dict(zip([*spec.pre, *spec.post], finals))
        neuron.keep_states(list(states.unbind(0)))
        return out
