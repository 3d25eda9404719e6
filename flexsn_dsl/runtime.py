"""Stage 6: the runtime: an ``nn.Module`` running the generated torch step or Triton kernels."""
from __future__ import annotations

import itertools
import math
import os
import warnings
from pathlib import Path
from typing import Iterable, Mapping, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from .compiler import Compiled, compile_spec
from .errors import MissingDependency, ShapeError, SpecError
from .ir import check_param_names, resolve_shapes
from .source import read_spec, spec_text
from .synapse import synapse_text
from .symbolic import draw_of

BACKENDS = ("auto", "torch", "triton")
STEP_MODES = ("s", "m")
MIN_CHUNK = 64  # recompute=True: the fewest steps of a chunk (fewer, longer launches; see recompute_chunk)


class FlexSN(nn.Module):
    """A spiking neuron layer generated from a spec.

    ``step_mode="m"`` takes inputs ``[T, ...]``, ``"s"`` one step ``[...]``.
    ``states`` holds each state's current tensor (carried from call to call
    until :meth:`reset`); ``state_seqs`` the per-step states of the last call
    when ``store_state_seqs`` is true.

    Every parameter is registered under its spec name, so that ``state_dict`` carries it:
    learnable ones as ``nn.Parameter``\\ s, the others as buffers. A parameter with a shape
    has that shape (its size names from ``sizes``, or fixed by a tensor in ``values``) and
    broadcasts against each step's input. Scalar constants are float64 0-dim buffers whose
    values are baked into the generated code: loading a state dict that changes one
    re-specialises the code for the new values (:meth:`specialize`).

    A spec with ``recurrent: {r: {from: s}}`` has an ``nn.Parameter`` ``r_weight`` [N, N]
    (from ``values``, else initialised as ``nn.Linear``'s weight; N from ``sizes["N"]`` or
    that tensor). Each step takes ``r_t = s_{t-1} @ r_weight.T`` over the last dimension of the
    inputs; ``states["r_prev"]`` carries the last ``s`` across calls (zero after :meth:`reset`).

    ``recompute`` (True, or the steps of a chunk): a training call keeps only its outputs and the
    states at the start of every chunk of steps, and the backward computes each chunk's states again
    from them (:func:`recompute_chunk`).
    """

    def __init__(self, compiled: Compiled, step_mode: str = "m", backend: str = "auto",
                 store_state_seqs: bool = False, sizes: dict[str, int] | None = None,
                 values: dict[str, torch.Tensor] | None = None, recompute: bool | int = False):
        super().__init__()
        if step_mode not in STEP_MODES:
            raise ValueError(f"step_mode must be one of {STEP_MODES}, got {step_mode!r}")
        if backend not in BACKENDS:
            raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
        if not isinstance(recompute, int) or (recompute < 1 and recompute is not False):
            raise ValueError(f"recompute must be True, False or the steps of a chunk (a whole number of at least 1), "
                             f"got {recompute!r}")
        self.recompute = recompute
        self._compiled = compiled
        self.step_mode = step_mode
        self.backend = backend
        self.store_state_seqs = store_state_seqs
        self.states: dict[str, torch.Tensor] = {}
        self.state_seqs: dict[str, torch.Tensor] = {}
        self._triton_error: SpecError | MissingDependency | None = None
        self._plugin_files: tuple[str, ...] = ()
        self._warned_missing = False
        values = values or {}
        weights = {r.weight_name: values[r.weight_name] for r in compiled.model.recurrent.values()
                   if r.weight_name in values}
        sizes = self._recurrent_size(sizes, weights)
        self._register_parameters(sizes, {k: v for k, v in values.items() if k not in weights})
        self._register_recurrent(sizes or {}, weights)
        self._prepare()

    def _register_parameters(self, sizes: dict[str, int] | None, values: dict[str, torch.Tensor]) -> None:
        model = self._compiled.model
        shapes = resolve_shapes(model, sizes, {n: tuple(v.shape) for n, v in values.items()})
        self._from_spec = tuple(p.name for p in model.parameters.values() if p.name not in values)
        for p in model.parameters.values():
            # (the model refuses a parameter named like an attribute: model.MODULE_ATTRIBUTES)
            number = self._compiled.values[p.name]
            if p.name in values:
                given = values[p.name].detach()
                tensor = given.clone() if given.is_floating_point() else given.to(torch.get_default_dtype())
            elif p.shaped:
                tensor = torch.full(shapes[p.name], number)
            else:
                tensor = torch.tensor(number, dtype=None if p.learnable else torch.float64)
            if p.learnable:
                self.register_parameter(p.name, nn.Parameter(tensor))
            else:
                self.register_buffer(p.name, tensor)

    @property
    def _constants(self) -> list[str]:
        """The parameters whose values are baked into the generated code (scalar, not learnable)."""
        return [p.name for p in self.spec.parameters.values() if not (p.learnable or p.shaped)]

    def _recurrent_size(self, sizes: dict[str, int] | None, weights: dict[str, object]) -> dict[str, int] | None:
        """``sizes`` with N fixed by the recurrent weights given (each must be a tensor [N, N])."""
        n = sizes.get("N") if isinstance(sizes, Mapping) else None
        for name, w in weights.items():
            if not isinstance(w, torch.Tensor) or w.dim() != 2 or w.shape[0] != w.shape[1] or \
                    (isinstance(n, int) and w.shape[0] != n):
                shape = list(w.shape) if isinstance(w, torch.Tensor) else type(w).__name__
                raise ShapeError(f"params[{name!r}] must be a tensor of shape [N, N]"
                                 + (f" with N = {n}" if isinstance(n, int) else "") + f", not {shape} (N: the "
                                 "neurons, the size of the last dimension of the inputs)")
            n = w.shape[0]
        return {**(sizes or {}), "N": n} if n is not None and isinstance(sizes, (Mapping, type(None))) else sizes

    def _register_recurrent(self, sizes: dict[str, int], weights: dict[str, torch.Tensor]) -> None:
        """One ``NAME_weight`` [N, N] parameter per recurrent input of the spec."""
        model = self._compiled.model
        if not model.recurrent:
            return
        first = next(iter(model.recurrent.values()))
        lines = model.text.splitlines()
        n = sizes.get("N")
        if n is None:  # fixed by a shaped parameter's tensor?
            n = next((getattr(self, p.name).shape[p.shape.index("N")] for p in model.parameters.values()
                      if p.shaped and "N" in p.shape), None)
        if n is None:
            raise SpecError(f"{model.name}: recurrent input {first.name!r} needs the number of neurons N",
                            first.pos, f"load with sizes={{'N': 256}} or params={{{first.weight_name!r}: "
                            "torch.randn(N, N)}").with_source(lines)
        if self.backend == "triton":
            from .triton_recurrent import check
            check(self._compiled, n)
            if self.store_state_seqs:
                raise SpecError(f"{model.name}: the Triton backend's recurrent kernel does not store state "
                                "sequences", first.pos, 'use store_state_seqs=False or backend="torch"').with_source(lines)
            if self.recompute:
                raise SpecError(f"{model.name}: the Triton backend's recurrent kernel does not recompute states "
                                "(its weight gradient is one product over every step's saved values)", first.pos,
                                'use recompute=False or backend="torch"').with_source(lines)
        for r in model.recurrent.values():
            # (no module attribute ends in _weight; the model refuses a parameter or state named so)
            given = weights.get(r.weight_name)
            if given is not None:
                w = given.detach().clone().to(given.dtype if given.is_floating_point() else torch.get_default_dtype())
            else:
                w = torch.empty(n, n)
                nn.init.kaiming_uniform_(w, a=math.sqrt(5))  # nn.Linear's weight initialisation
            self.register_parameter(r.weight_name, nn.Parameter(w))

    def _prepare(self) -> None:
        # Generate the torch step now rather than lazily inside ``forward``: the lazy path
        # takes a lock (functools.cached_property), which breaks torch.compile graphs.
        self._compiled.torch_namespace  # noqa: B018 - initial_states() is needed by every backend
        spec = self._compiled.model
        self._shaped, self._runtime_params = tuple(spec.shaped), tuple(spec.runtime_params)  # (not per call)
        # whether every initial state is a number (else it depends on a runtime parameter)
        self._constant_init = not any(isinstance(v, torch.Tensor) for v in self._initial_values(self._param_values()))
        self._lowered = False  # backend "auto": whether the Triton kernels of this code were built (CUDA inputs)
        self._fast = None  # the shortcut of calls like the last one (triton_runtime.direct_call), or None
        if self.backend != "torch":
            try:
                triton_runtime()
            except MissingDependency as exc:
                if self.backend == "triton":
                    raise
                self._triton_error = exc  # "auto" runs the torch step (and says so for CUDA tensors)
                return
            triton_runtime().register(self._compiled)

    # -- describing ----------------------------------------------------------
    @property
    def spec(self):
        return self._compiled.model

    @property
    def info(self):
        """The FlexSNInfo of the generated Triton kernels."""
        if isinstance(self._triton_error, MissingDependency):
            return self._compiled.cores.info  # the same record, without importing the kernels
        return self._compiled.info

    def extra_repr(self) -> str:
        parameters = ", ".join(f"{name}={text}" for name, text in self.parameter_texts().items())
        return (f"neuron={self.spec.name!r}, step_mode={self.step_mode!r}, backend={self.backend!r}, "
                f"surrogate={self.spec.surrogate.name!r}" + (f", recompute={self.recompute!r}" if self.recompute else "")
                + (f"\n{parameters}" if parameters else ""))

    def parameter_texts(self) -> dict[str, str]:
        """Each parameter (recurrent weights too) as text: a scalar's value, a tensor's shape and the
        range of its values; `(learnable)` marks those an optimiser trains."""
        out = {}
        for name, tensor in itertools.chain(self.named_parameters(recurse=False), self.named_buffers(recurse=False)):
            values = tensor.detach()
            if values.dim() == 0:
                text = f"{float(values):.6g}"
            else:
                lo, hi = (float(values.min()), float(values.max())) if values.numel() else (math.nan, math.nan)
                text = f"{list(values.shape)} " + (f"all {lo:.4g}" if lo == hi else f"in [{lo:.4g}, {hi:.4g}]")
            out[name] = text + (" (learnable)" if isinstance(tensor, nn.Parameter) else "")
        return out

    # -- pickling / deepcopy: keep the spec, rebuild generated code on demand --
    # (states are copied detached: a copy does not share the autograd graph of the last call,
    # and deepcopy/pickle refuse non-leaf tensors)
    def __getstate__(self):
        state = self.__dict__.copy()
        compiled = state.pop("_compiled")
        state.pop("_fast", None)  # (a closure over launch plans: rebuilt at the next call)
        state["_spec_source"] = (compiled.model.file, compiled.model.text, compiled.values,
                                 [p.name for p in compiled.passes])
        state["states"] = {k: v.detach() for k, v in self.states.items()}
        state["state_seqs"] = {k: v.detach() for k, v in self.state_seqs.items()}
        return state

    def __setstate__(self, state):
        file, text, values, passes = state.pop("_spec_source")
        state.setdefault("_plugin_files", ())
        state.setdefault("recompute", False)
        state.setdefault("_from_spec", ())
        state["_compiled"] = compile_spec(file, text=text, params=values, passes=passes,
                                          plugins=state["_plugin_files"])
        self.__dict__.update(state)
        self._prepare()

    def _apply(self, fn, recurse=True):
        # .to()/.double()/.half()/.cuda() move the carried states too, as they would buffers;
        # the baked constants move but stay float64 (a checkpoint keeps their exact values); a learnable or
        # shaped parameter that still holds its spec's value, made wider, takes that value exactly (0.1 in
        # float64, not float32's 0.10000000149011612)
        constants = {n: self._buffers[n] for n in self._constants}
        before = {n: getattr(self, n).detach() for n in self._from_spec if n not in constants}
        super()._apply(fn, recurse)
        for name, value in constants.items():
            self._buffers[name] = value.to(device=self._buffers[name].device)
        for name, old in before.items():
            new, number = getattr(self, name), self._compiled.values[name]
            if new.is_floating_point() and old.is_floating_point() and new.dtype.itemsize > old.dtype.itemsize \
                    and old.device.type != "meta" and torch.equal(old, torch.full_like(old, number)):
                with torch.no_grad():
                    new.fill_(number)
        self.states = {k: fn(v) for k, v in self.states.items()}
        self.state_seqs = {k: fn(v) for k, v in self.state_seqs.items()}
        return self

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        before = {n: t.detach().clone() for n, t in itertools.chain(self.named_parameters(recurse=False),
                                                                       self.named_buffers(recurse=False))}
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)
        if any(float(self._buffers[n]) != self._compiled.values[n] for n in self._constants):
            try:
                self.specialize()  # the new values pass the spec's checks, or nothing changes
            except SpecError as exc:
                with torch.no_grad():
                    for name, tensor in itertools.chain(self.named_parameters(recurse=False),
                                                        self.named_buffers(recurse=False)):
                        tensor.copy_(before[name])
                raise SpecError(f"load_state_dict: {exc.message}", exc.pos, exc.hint).with_source(
                    self._compiled.model.text.splitlines()) from None

    def specialize(self) -> None:
        """Generate the code again for the constant values now in the buffers (``load_state_dict``
        does this when it changes one; call it after changing a constant buffer by hand)."""
        compiled = self._compiled
        values = {**compiled.values, **{n: float(self._buffers[n]) for n in self._constants}}
        self._compiled = compile_spec(compiled.model.file, text=compiled.model.text, params=values,
                                      passes=[p.name for p in compiled.passes], plugins=self._plugin_files)
        self._triton_error = None
        self._prepare()

    # -- running ---------------------------------------------------------------
    def reset(self) -> None:
        """Forget the states (they restart from their initial values at the next call)."""
        _set(self, "states", {})
        _set(self, "state_seqs", {})

    def detach(self) -> None:
        """Cut the states (and state sequences) from the autograd graph of earlier calls, keeping
        their values: truncated backpropagation through time across calls."""
        _set(self, "states", {k: v.detach() for k, v in self.states.items()})
        _set(self, "state_seqs", {k: v.detach() for k, v in self.state_seqs.items()})

    def _param_values(self) -> dict[str, torch.Tensor]:
        """The runtime parameters (learnable or shaped), as the generated code takes them."""
        return {name: getattr(self, name) for name in self._runtime_params}

    def _check_shapes(self, x: torch.Tensor, name: str, step: torch.Size) -> None:
        """Every shaped parameter must broadcast to one step of the inputs (trailing dimensions aligned)."""
        for p in self._shaped:
            shape = tuple(getattr(self, p).shape)
            # (s != 1 and s != d, not `s not in (1, d)`: torch.compile would compare symbolic sizes by identity)
            if len(shape) > len(step) or any(s != 1 and s != d for s, d in zip(reversed(shape), reversed(step))):
                raise ShapeError(f"{self.spec.name}: parameter {p!r} has shape {list(shape)}, which does not broadcast "
                                 f"against a step of input {name!r}: step shape {list(step)} (input shape "
                                 f"{list(x.shape)}, step_mode={self.step_mode!r}); each of the parameter's "
                                 "dimensions must be 1 or equal the step's trailing dimension it is aligned with")

    def _initial_values(self, params: dict[str, torch.Tensor]) -> tuple:
        """Each state's initial value from the runtime parameters ``params`` (:meth:`_param_values`):
        a number, or a tensor where it depends on a runtime parameter."""
        return self._compiled.torch_namespace["initial_states"](**params)

    @staticmethod
    def _initial_states(values: tuple, like: torch.Tensor) -> list[torch.Tensor]:
        out = []
        for value in values:
            if isinstance(value, torch.Tensor):
                out.append(like.new_zeros(like.shape) + value.to(like.dtype))
            else:
                out.append(torch.full_like(like, float(value)))
        return out

    def _choose_backend(self, x: torch.Tensor) -> str:
        if self.backend != "auto":
            return self.backend
        if not x.is_cuda:
            return "torch"
        if self._lowered:  # (the kernels were built for this code: Triton until specialize() regenerates it)
            return "triton"
        if self.spec.recurrent and self._triton_error is None:
            from .triton_recurrent import unsupported
            n = next(getattr(self, r.weight_name).shape[0] for r in self.spec.recurrent.values())
            reason = unsupported(self._compiled, n) or ("store_state_seqs" if self.store_state_seqs else None) \
                or ("recompute=True" if self.recompute else None)
            if reason is None:
                return "triton"
            self._triton_error = SpecError(f"{self.spec.name}: {reason}")  # said once; the torch step from now on
            warnings.warn(f"flexsn-dsl: {self.spec.name}: runs with the torch backend: {reason}", stacklevel=3)
            return "torch"
        if torch.compiler.is_compiling():
            return "torch" if self._triton_error is not None else "triton"
        if self._triton_error is None:
            try:
                self._compiled.triton_module()  # lower now, to report a problem once
                self._lowered = True
                return "triton"
            except SpecError as exc:
                self._triton_error = exc
                warnings.warn(f"flexsn-dsl: {self.spec.name}: the Triton backend cannot build this spec, "
                              f"falling back to torch: {exc}", stacklevel=3)
        elif isinstance(self._triton_error, MissingDependency) and not self._warned_missing:
            self._warned_missing = True
            warnings.warn(f"flexsn-dsl: {self.spec.name}: {self._triton_error}; running the torch step",
                          stacklevel=3)
        return "torch"

    def forward(self, *inputs: torch.Tensor):
        # the shortcut of a call like the last one (inference or training), from reset states (checks of its own)
        if not torch.compiler.is_compiling() and self._fast is not None and len(inputs) == 1 and not self.states \
                and self.backend != "torch" and self.step_mode == "m" and not self.store_state_seqs \
                and not self.recompute:
            result = self._fast(inputs[0])
            if result is not None:
                outputs, finals = result
                _set(self, "states", dict(zip(self._compiled.model.states, finals)))
                return outputs[0] if len(outputs) == 1 else tuple(outputs)
        spec = self._compiled.model
        names = spec.inputs
        if len(inputs) != len(names):
            raise TypeError(f"{spec.name} takes {len(names)} input(s) {names}, got {len(inputs)}")
        if len(inputs) > 1:
            shape = inputs[0].shape
            for name, x in zip(names[1:], inputs[1:]):
                if x.shape != shape:
                    raise ValueError(f"input {name!r} has shape {tuple(x.shape)}, expected {tuple(shape)} like "
                                     f"{names[0]!r}")
        inputs = _floating(inputs)
        single = self.step_mode == "s"
        if single:
            inputs = [x.unsqueeze(0) for x in inputs]
        x = inputs[0]
        if x.dim() < 1:
            raise ValueError("step_mode='m' needs inputs of shape [T, ...]")
        if self._shaped:
            self._check_shapes(x[0] if single else x, names[0], x.shape[1:])
        backend = self._choose_backend(x)
        params = self._param_values() if self._runtime_params else {}
        states = self._carried(x) if self.states else []  # (after reset(): none carried)
        if len(states) < len(spec.states):  # not all carried: every state starts from its initial value
            if backend == "triton" and self._constant_init:
                states = []  # constants: the kernels start from them and read no initial-state tensor
            else:
                states = self._initial_states(self._initial_values(params),
                                              x[0] if x.shape[0] else x.new_zeros(x.shape[1:]))
        fed = self._fed_back(x, names[0]) if spec.recurrent else []
        if backend == "torch":
            outputs, finals, seqs, fed = self._run_torch(inputs, states, fed, params)
        elif spec.recurrent:
            from .triton_recurrent import run_recurrent
            (rec,) = spec.recurrent.values()
            outputs, finals, fed = run_recurrent(self._compiled, inputs, states, fed[0], getattr(self, rec.weight_name),
                                                 params)
            seqs = []
        else:
            outputs, finals, seqs = triton_runtime().run_triton(self._compiled, inputs, states, params,
                                                                self.store_state_seqs, self._chunk(x.shape[0]))
            if not (states or single or self.store_state_seqs or self.recompute
                    or torch.compiler.is_compiling()):  # from reset states
                _set(self, "_fast", triton_runtime().direct_call(self._compiled, x))  # (None: not such a call)
        carry = dict(zip(spec.states, finals))
        if spec.recurrent:
            carry.update({r.prev_name: f for r, f in zip(spec.recurrent.values(), fed)})
        # (plain attributes: nn.Module.__setattr__ would look for a parameter, buffer or submodule of that name)
        _set(self, "states", carry)
        if self.store_state_seqs:
            _set(self, "state_seqs", dict(zip(spec.states, (s[0] for s in seqs) if single else seqs)))
        if single:
            outputs = [o[0] for o in outputs]
        return outputs[0] if len(outputs) == 1 else tuple(outputs)

    def starting_states(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The states a call on steps ``x`` ([T, ...]) starts from, in the spec's order: those carried from
        the last call, else every state's initial value (for code that runs this neuron's step itself, as
        :class:`flexsn_dsl.PlasticLinear`'s fused kernel; :meth:`keep_states` hands the final ones back)."""
        states = self._carried(x) if self.states else []
        if len(states) < len(self.spec.states):
            params = self._param_values() if self._runtime_params else {}
            states = self._initial_states(self._initial_values(params), x[0] if x.shape[0] else x.new_zeros(x.shape[1:]))
        return states

    def keep_states(self, finals: Sequence[torch.Tensor]) -> None:
        """Carry ``finals`` (the spec's states, in order) to the next call, as a call of this module does."""
        _set(self, "states", dict(zip(self.spec.states, finals)))

    def _carried(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The states carried from the last call, in the dtype and device of ``x`` (the inputs [T, ...]), a
        ValueError when their shape is not a step's; fewer than the spec's states when not all are carried."""
        spec, states = self._compiled.model, self.states
        carried = [states[n] for n in spec.states if states.get(n) is not None]
        if not carried:
            return carried
        step = x.shape[1:]
        if carried[0].shape != step:
            what = "an input of shape" if self.step_mode == "s" else "input steps of shape"
            raise ValueError(f"{spec.name}: {what} {tuple(step)}, but the states carried from the last "
                             f"call have shape {tuple(carried[0].shape)}: call reset() before a new batch or input "
                             "shape (states carry over between calls until reset())")
        dtype, device = x.dtype, x.device
        return [s if s.dtype == dtype and s.device == device else s.to(device=device, dtype=dtype) for s in carried]

    def _fed_back(self, x: torch.Tensor, name: str) -> list[torch.Tensor]:
        """The carried previous value of each recurrent input's source (zeros after reset()); ``x``: inputs [T, ...]."""
        out = []
        step = x.shape[1:]
        for r in self.spec.recurrent.values():
            n = getattr(self, r.weight_name).shape[0]
            if len(step) == 0 or step[-1] != n:
                raise ShapeError(f"{self.spec.name}: recurrent input {r.name!r} needs steps of input {name!r} whose "
                                 f"last dimension is N = {n} (the neurons), got step shape {list(step)} "
                                 f"(step_mode={self.step_mode!r}): give inputs of shape [T, ..., N] (step_mode='m') "
                                 "or [..., N] (step_mode='s')")
            prev = self.states.get(r.prev_name)
            out.append(x.new_zeros(step) if prev is None or prev.shape != step
                       else prev.to(device=x.device, dtype=x.dtype))
        return out

    def _chunk(self, steps: int) -> int:
        """The steps of a chunk of a call over ``steps`` steps (:func:`recompute_chunk`), 0 without recompute."""
        return recompute_chunk(self.recompute, steps) if self.recompute else 0

    def _run_torch(self, inputs: Sequence[torch.Tensor], states: list[torch.Tensor], fed: list[torch.Tensor],
                   params: dict[str, torch.Tensor]):
        step = self._compiled.torch_namespace["step"]
        storage = inputs[0].dtype  # 16-bit inputs are computed in float32, as the Triton kernels do
        compute = torch.float32 if storage in (torch.float16, torch.bfloat16) else storage
        if not inputs[0].shape[0]:  # T = 0: empty outputs and the states as they were, in the graph as on Triton
            joined = sum(x.sum() for x in inputs) * 0
            return ([inputs[0] * 0 for _ in self.spec.outputs], [s + joined.to(s.dtype) for s in states],
                    [inputs[0] * 0 for _ in self.spec.states] if self.store_state_seqs else [], list(fed))
        # (``params``: the runtime parameters; the shaped ones computed in the inputs' dtype, like the 0-dim scalars)
        params = {k: v.to(compute) if k in self._shaped or v.dtype in (torch.float16, torch.bfloat16) else v
                  for k, v in params.items()}
        weights = [getattr(self, r.weight_name).to(compute) for r in self.spec.recurrent.values()]
        states = [s.to(compute) if isinstance(s, torch.Tensor) else s for s in states]
        fed = [f.to(compute) for f in fed]
        draws = [(d.name, torch.rand if draw_of(d)[0] == "rand" else torch.randn) for d in self._compiled.ir.used_draws]

        def steps(t0: int, t1: int, states: list, fed: list) -> tuple[list, list, list, list]:
            """Steps t0 to t1 - 1: each step's outputs (and states, if stored), then the last states and fed values."""
            per_step_outputs, per_step_states = [], []
            for t in range(t0, t1):
                xs = [x[t].to(compute) for x in inputs]
                drawn = {name: draw(xs[0].shape, dtype=compute, device=xs[0].device) for name, draw in draws}
                if weights:  # r_t[..., i] = sum_j W[i, j] * source_{t-1}[..., j]
                    outs, states, fed = step(*xs, *(f @ w.T for f, w in zip(fed, weights)), *states, **params,
                                             **drawn)
                    fed = [_like(f, xs[0]) for f in fed]
                else:
                    outs, states = step(*xs, *states, **params, **drawn)
                states = [_like(s, xs[0]) for s in states]
                per_step_outputs.append([_like(o, xs[0]) for o in outs])
                if self.store_state_seqs:
                    per_step_states.append(states)
            return per_step_outputs, per_step_states, states, fed

        T = inputs[0].shape[0]
        graph = torch.is_grad_enabled() and any(isinstance(t, torch.Tensor) and t.requires_grad
                                                for t in (*inputs, *states, *fed, *params.values(), *weights))
        chunk = self._chunk(T) if graph else 0
        if not chunk:
            per_step_outputs, per_step_states, states, fed = steps(0, T, states, fed)
        else:  # each chunk's graph recorded as usual, its saved values computed again in the backward: the same sums
            per_step_outputs, per_step_states = [], []
            for t0 in range(0, T, chunk):
                outs, seqs, states, fed = checkpoint(steps, t0, min(t0 + chunk, T), states, fed, use_reentrant=False)
                per_step_outputs += outs
                per_step_states += seqs
        outputs = [torch.stack([o[k] for o in per_step_outputs]).to(storage) for k in range(len(self.spec.outputs))]
        seqs = [torch.stack([s[k] for s in per_step_states]).to(storage) for k in range(len(self.spec.states))] \
            if self.store_state_seqs else []
        return outputs, [s.to(storage) for s in states], seqs, [f.to(storage) for f in fed]


_set = object.__setattr__  # a plain attribute of a module, without nn.Module.__setattr__'s lookups


def _floating(inputs: tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    """The inputs in their common dtype by torch's type promotion; integer and bool inputs
    become torch's default float dtype (the states they drive must hold fractions)."""
    if len(inputs) == 1 and inputs[0].is_floating_point():
        return inputs
    dtype = inputs[0].dtype
    for x in inputs[1:]:
        dtype = torch.promote_types(dtype, x.dtype)
    if dtype.is_complex:
        raise TypeError(f"inputs must be real numbers, got {dtype}")
    if not dtype.is_floating_point:
        dtype = torch.get_default_dtype()
    return tuple(x if x.dtype == dtype else x.to(dtype) for x in inputs)


def triton_runtime():
    """The Triton launcher module; :class:`MissingDependency` saying how to get Triton where it is not installed."""
    global _TRITON_RUNTIME
    if _TRITON_RUNTIME is None:
        try:
            from . import triton_runtime as module
        except ImportError as exc:
            if (exc.name or "").partition(".")[0] != "triton":
                raise
            raise MissingDependency("backend='triton' needs Triton, which is not installed: `pip install triton` "
                                    "(Triton publishes wheels for Linux only; elsewhere use backend='torch', which "
                                    "computes the same function and gradients)") from exc
        _TRITON_RUNTIME = module
    return _TRITON_RUNTIME


_TRITON_RUNTIME = None  # the module, once imported


def _like(value, like: torch.Tensor) -> torch.Tensor:
    """A step result as a tensor of the input's shape (constants and 0-dim values broadcast)."""
    if not isinstance(value, torch.Tensor):
        return torch.full_like(like, float(value))
    if value.shape != like.shape:
        return value.expand(like.shape) + like.new_zeros(())
    return value


def reset_net(net: nn.Module) -> int:
    """``reset()`` every flexsn-dsl neuron in ``net`` (``net`` itself included), as SpikingJelly's
    ``functional.reset_net``: call it between independent sequences. Returns how many were reset."""
    neurons = _neurons(net)
    for m in neurons:
        m.reset()
    return len(neurons)


def detach_net(net: nn.Module) -> int:
    """``detach()`` every flexsn-dsl neuron in ``net``: truncated backpropagation through time
    across calls (the states keep their values). Returns how many were detached."""
    neurons = _neurons(net)
    for m in neurons:
        m.detach()
    return len(neurons)


def _neurons(net: nn.Module) -> list[FlexSN]:
    """The flexsn-dsl neurons of ``net`` in the order of ``net.modules()``, each once: the same walk over the
    submodule dictionaries, without the name ``modules()`` builds for every module (once per training step)."""
    out, seen, todo = [], set(), [net]
    while todo:
        m = todo.pop()
        if m is None or m in seen:
            continue
        seen.add(m)
        if isinstance(m, FlexSN):
            out.append(m)
        todo += reversed(m._modules.values())  # (pre-order: the first child on top)
    return out


def recompute_chunk(recompute: bool | int, steps: int) -> int:
    """The steps of a chunk with ``recompute`` over ``steps`` steps: the number given, else (True) about
    the square root of ``steps`` and at least :data:`MIN_CHUNK`. A chunk of C steps keeps the states once
    per C steps after the forward pass (states / C of the outputs' bytes per output: 4 states at C = 64
    add 6%) and holds one chunk's saved values during the backward; fewer steps per chunk mean more launches."""
    return int(recompute) if recompute is not True else max(MIN_CHUNK, math.isqrt(max(steps - 1, 0)) + 1)


def load(path: str | os.PathLike, params: dict[str, float | torch.Tensor] | None = None, step_mode: str = "m",
         backend: str = "auto", store_state_seqs: bool = False, plugins: Iterable[str] = (),
         passes: Iterable[str] = (), sizes: dict[str, int] | None = None, recompute: bool | int = False) -> FlexSN:
    """Load a spec file as an ``nn.Module``.

    ``params`` overrides parameter values: numbers, or tensors (a shaped parameter's tensor
    has its shape, and fixes the sizes it names; a recurrent spec's ``{"r_weight": tensor}``
    [N, N] gives its weight); ``sizes`` gives the size names used in parameter shapes
    (``{"C": 64}``; ``{"N": 256}``: the neurons of a recurrent spec); ``plugins`` are extra plugin files (Python files with
    ``@flexsn_dsl.hookimpl`` functions); ``passes`` enables code-generation passes by name.
    ``recompute``: train with less memory: a training call keeps its outputs and the states every C
    steps only (C: the number given, or about sqrt(T) and at least 64 for True), and the backward
    computes the states again chunk by chunk, with the same outputs and gradients (see docs/python-api.md).
    Raises :class:`flexsn_dsl.SpecError` on a bad spec, :class:`flexsn_dsl.ShapeError` on a
    tensor that does not fit. A synapse spec (``kind: synapse``) loads as a factory of
    :class:`flexsn_dsl.PlasticLinear` (docs/synapses.md), with ``params`` only.
    """
    if isinstance(path, (str, os.PathLike)) and synapse_text(read_spec(path), os.fsdecode(path)):
        from .plastic import load_synapse
        return load_synapse(path, params)
    return _load(path, None, params, step_mode, backend, store_state_seqs, plugins, passes, sizes, recompute)


def loads(text: str, params: dict[str, float | torch.Tensor] | None = None, step_mode: str = "m",
          backend: str = "auto", store_state_seqs: bool = False, plugins: Iterable[str] = (),
          passes: Iterable[str] = (), filename: str = "<string>", sizes: dict[str, int] | None = None,
          recompute: bool | int = False) -> FlexSN:
    """Like :func:`load`, from spec text (a str, or UTF-8 bytes)."""
    if synapse_text(spec_text(text, filename), filename):
        from .plastic import loads_synapse
        return loads_synapse(text, params, filename)
    return _load(filename, spec_text(text, filename), params, step_mode, backend, store_state_seqs, plugins, passes,
                 sizes, recompute)


def _plugin_paths(plugins: Iterable[str] | str) -> tuple[str, ...]:
    """Plugin files as absolute paths (one path may be given as a plain string)."""
    if isinstance(plugins, (str, os.PathLike)):
        plugins = [plugins]
    return tuple(str(Path(p).expanduser().resolve()) for p in plugins)


def _load(source, text, params, step_mode, backend, store_state_seqs, plugins, passes, sizes, recompute) -> FlexSN:
    """Compile with the numbers of ``params``, then build the module with the shaped parameters' tensors."""
    plugins = _plugin_paths(plugins)
    tensors = {k: v for k, v in params.items() if isinstance(v, torch.Tensor) and v.dim() > 0} \
        if isinstance(params, Mapping) else {}
    numbers = {k: v for k, v in params.items() if k not in tensors} if tensors else params
    compiled = compile_spec(source, text=text, params=numbers, plugins=plugins, passes=passes)
    model = compiled.model
    check_param_names(model, tensors)
    weights = {r.weight_name: params[r.weight_name] for r in model.recurrent.values()
               if isinstance(params, Mapping) and r.weight_name in params}
    shaped = {k: v for k, v in tensors.items() if k not in weights and model.parameters[k].shaped}
    if len(shaped) + len(weights.keys() & tensors.keys()) < len(tensors):  # a scalar parameter takes a number
        scalars = {k: v for k, v in tensors.items() if k not in shaped and k not in weights}
        compiled = compile_spec(source, text=text, params={**numbers, **scalars}, plugins=plugins, passes=passes)
    m = FlexSN(compiled, step_mode=step_mode, backend=backend, store_state_seqs=store_state_seqs, sizes=sizes,
               values={**shaped, **weights}, recompute=recompute)
    m._plugin_files = plugins  # so that copies and unpickled modules find the same plugins
    return m
