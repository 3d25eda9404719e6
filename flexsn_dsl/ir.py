"""Stage 3: the sympy IR of one time step, ready for code generation.

Constant scalar parameters are substituted by their values (so sympy folds them);
learnable and shaped parameters stay symbols and become runtime arguments
(``params``: the learnable ones, which get gradients; ``fixed``: the others). The IR is a
straight-line program: ``assignments`` in order, then ``outputs`` and
``next_states`` name symbols of it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from functools import cached_property
from typing import Callable, Mapping

import sympy

from .continuous import discrete_steps
from .errors import ShapeError, SourcePos, SpecError, SpecTypeError
from .expressions import closest
from .model import NeuronModel, check_values, fold_values
from .symbolic import real_symbol


@dataclass(frozen=True)
class StepIR:
    name: str
    inputs: tuple[sympy.Symbol, ...]
    states: tuple[sympy.Symbol, ...]          # previous values
    params: tuple[sympy.Symbol, ...]          # learnable parameters (runtime values, with gradients)
    assignments: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    outputs: tuple[sympy.Symbol, ...]
    next_states: tuple[sympy.Symbol, ...]
    surrogate: sympy.Expr                     # g(x), parameters substituted
    output_names: tuple[str, ...]
    constants: tuple[tuple[str, float], ...]  # baked-in parameter values, for the record
    initial_states: tuple[sympy.Expr, ...] = ()  # each state's initial value (constants substituted)
    positions: tuple[SourcePos | None, ...] = ()  # where each assignment was written
    fixed: tuple[sympy.Symbol, ...] = ()      # non-learnable shaped parameters (runtime values, no gradients)
    shaped: tuple[str, ...] = ()              # the runtime parameters with a shape (read per element)
    # one symbol per recurrent input (the last len(recurrent) of ``inputs``): the value fed back
    recurrent: tuple[sympy.Symbol, ...] = ()
    # every draw of the spec by occurrence (rand__k, randn__k): a fresh number per element and step,
    # a constant to the backward, generated (never stored) by the backends
    draws: tuple[sympy.Symbol, ...] = ()

    def replace_exprs(self, rewrite: Callable[[sympy.Expr], sympy.Expr]) -> "StepIR":
        """A copy with ``rewrite`` applied to every assigned expression (for IR passes)."""
        return replace(self, assignments=tuple((s, sympy.sympify(rewrite(e))) for s, e in self.assignments))

    @property
    def state_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.states)

    @property
    def input_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.inputs)

    @property
    def param_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.params)

    @property
    def fixed_names(self) -> tuple[str, ...]:
        return tuple(s.name for s in self.fixed)

    @cached_property
    def used_draws(self) -> tuple[sympy.Symbol, ...]:
        """The draws the assignments use (a pass may have dropped some), by occurrence; worked out once (the
        torch backend asks at every call)."""
        used = set().union(*(e.free_symbols for _, e in self.assignments))
        return tuple(d for d in self.draws if d in used)


def check_param_names(model: NeuronModel, names) -> None:
    """Every name given in params= must be a parameter of the spec (or a recurrent weight)."""
    known = [*model.parameters, *(r.weight_name for r in model.recurrent.values())]
    for name in names:
        if name not in known:
            hint = closest(str(name), known)
            raise SpecError(f"{model.file}: params= names {name!r}, which is not a parameter of {model.name!r}",
                            hint=hint or f"parameters: {', '.join(known) or 'none'}")


def param_value(name: str, value: object, pos: SourcePos | None = None) -> float:
    """A parameter value given in Python (``params=``) as a float: a real number (or a 0-dim tensor
    or array holding one), not a bool, and finite. ``pos`` is where the parameter is declared."""
    if getattr(value, "shape", None) == () and callable(getattr(value, "item", None)):
        value = value.item()  # a 0-dim tensor or array
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise SpecTypeError(f"params[{name!r}] must be a number, not {type(value).__name__} {repr(value):.80}", pos,
                            f"pass a float, e.g. params={{{name!r}: 2.0}}")
    hint = "give a finite value; the generated code holds only finite constants"
    try:
        number = float(value)
    except OverflowError:  # an int beyond float64
        raise SpecError(f"params[{name!r}] is too large for a float64", pos, hint) from None
    if not math.isfinite(number):
        raise SpecError(f"params[{name!r}] = {number} is not a finite number", pos, hint)
    return number


def resolve_params(model: NeuronModel, overrides: Mapping[str, float] | None) -> dict[str, float]:
    """Parameter values with ``overrides`` (``params=``) applied and checked; a shaped parameter's
    value is the initial value of its elements, its expression re-evaluated with the overridden
    scalar values."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise SpecTypeError(f"params= must be a dict of parameter name -> number, not {type(overrides).__name__}",
                            hint="e.g. params={'tau': 2.0}")
    values = {p.name: p.value for p in model.parameters.values()}
    lines = model.text.splitlines()
    check_param_names(model, overrides or {})
    weights = {r.weight_name for r in model.recurrent.values()}  # tensors the module takes (runtime.py)
    overrides = {k: v for k, v in (overrides or {}).items() if k not in weights}
    for name, value in overrides.items():
        try:
            values[name] = param_value(name, value, model.parameters[name].pos)
        except SpecError as exc:
            raise exc.with_source(lines) from None
    scalars = {n: v for n, v in values.items() if not model.parameters[n].shaped}
    for p in model.parameters.values():
        if p.shaped and p.name not in (overrides or {}):
            number = p.initial_value(scalars)
            if number is None:
                raise SpecError(f"the value of parameter {p.name!r} ({p.init}) is not a finite real number with "
                                "the values of params=", p.pos, "change the values given in params=").with_source(lines)
            values[p.name] = number
    if overrides:
        try:
            check_values(model, values, set(overrides))
            fold_values(model, values, lambda n: f"{n} = {values[n]:g} (" + (
                "params=" if n in overrides else f"line {model.parameters[n].pos.line}") + ")")
        except SpecError as exc:
            raise exc.with_source(lines) from None
    return values


def build_ir(model: NeuronModel, values: dict[str, float]) -> StepIR:
    """Lower a validated model with these parameter values to the step IR."""
    runtime = set(model.runtime_params)
    steps = discrete_steps(model, values)
    folded = fold_values(model, values, steps=steps)
    surrogate = model.surrogate.gradient_with(model.surrogate_params)
    return StepIR(
        name=model.name,
        inputs=tuple(real_symbol(n) for n in [*model.inputs, *model.recurrent]),
        states=tuple(real_symbol(n) for n in model.states),
        params=tuple(real_symbol(n) for n in model.learnable),
        assignments=tuple((a.symbol, expr) for a, expr in zip(steps, folded.steps)),
        outputs=tuple(sym for _, sym in model.outputs),
        next_states=tuple(model.next_states[n] for n in model.states),
        surrogate=sympy.sympify(surrogate),
        output_names=tuple(name for name, _ in model.outputs),
        constants=tuple((n, values[n]) for n in model.parameters if n not in runtime),
        initial_states=folded.initial_states,
        positions=tuple(a.pos for a in steps),
        fixed=tuple(real_symbol(n) for n in model.runtime_params if not model.parameters[n].learnable),
        shaped=tuple(model.shaped),
        recurrent=tuple(r.symbol for r in model.recurrent.values()),
        draws=model.draws,
    )


def resolve_shapes(model: NeuronModel, sizes: dict[str, int] | None, tensor_shapes: dict[str, tuple[int, ...]],
                   require: bool = True) -> dict[str, tuple[int, ...]]:
    """Each shaped parameter's shape, its size names taken from ``sizes`` or fixed by the shape of a
    tensor given for it (``tensor_shapes``). ``sizes`` may name sizes the spec does not use (one
    dict for every layer of a network); a size that is not a positive whole number is a SpecError,
    and so is a size left unknown when ``require``; a tensor that does not fit is a ShapeError."""
    if sizes is not None and not isinstance(sizes, Mapping):
        raise SpecTypeError(f"sizes= must be a dict of size name -> whole number, not {type(sizes).__name__}",
                            hint="e.g. sizes={'C': 64}")
    known: dict[str, tuple[int, str]] = {}  # size name -> (value, where it came from)
    for name, value in (sizes or {}).items():
        if isinstance(value, bool) or not isinstance(value, numbers.Integral) or value < 1:
            raise SpecError(f"size {name!r} must be a positive whole number, got {value!r}", hint=f"e.g. {name}=64")
        known[name] = (int(value), "sizes=")
    for name, shape in tensor_shapes.items():
        spec_shape = model.parameters[name].shape
        if len(shape) != len(spec_shape):
            raise ShapeError(f"params[{name!r}] has shape {list(shape)}, but parameter {name!r} has shape "
                             f"{list(spec_shape)}: give a tensor of that shape")
        for size, got in zip(spec_shape, shape):
            if isinstance(size, str) and size not in known:
                known[size] = (got, f"params[{name!r}]")
            expected, where = (size, "the spec") if isinstance(size, int) else known[size]
            if got != expected:
                label = f"{size} = {expected} (from {where})" if isinstance(size, str) else f"{expected}"
                raise ShapeError(f"params[{name!r}] has shape {list(shape)}, but parameter {name!r} has shape "
                                 f"{list(spec_shape)} with {label}: give a tensor of that shape")
    shapes = {}
    for p in model.parameters.values():
        if not p.shaped:
            continue
        missing = [d for d in p.shape if isinstance(d, str) and d not in known]
        if missing and require:
            near = [str(n) for n in sizes or {} if str(n).lower() == missing[0].lower()]
            near = f"sizes are named with capitals: did you mean {missing[0]!r} for {near[0]!r}? " if near else \
                closest(missing[0], [str(n) for n in sizes or {}])
            raise SpecError(f"size {missing[0]!r} of parameter {p.name!r} (shape {list(p.shape)}) is not given",
                            p.pos, (f"{near} " if near else "") + f"give it: load(..., sizes={{{missing[0]!r}: 64}}) "
                            f"or --size {missing[0]}=64, or params={{{p.name!r}: tensor}}"
                            ).with_source(model.text.splitlines())
        shapes[p.name] = tuple(d if isinstance(d, int) else known.get(d, (d,))[0] for d in p.shape)
    return shapes
