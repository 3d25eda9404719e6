"""Stage 3: the sympy IR of one time step, ready for code generation.

Constant parameters are substituted by their values (so sympy folds them);
learnable parameters stay symbols and become runtime arguments. The IR is a
straight-line program: ``assignments`` in order, then ``outputs`` and
``next_states`` name symbols of it.
"""
from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, replace
from typing import Callable, Mapping

import sympy

from .errors import SourcePos, SpecError, SpecTypeError
from .expressions import closest
from .model import NeuronModel, fold_values
from .symbolic import real_symbol


@dataclass(frozen=True)
class StepIR:
    name: str
    inputs: tuple[sympy.Symbol, ...]
    states: tuple[sympy.Symbol, ...]          # previous values
    params: tuple[sympy.Symbol, ...]          # learnable parameters (runtime values)
    assignments: tuple[tuple[sympy.Symbol, sympy.Expr], ...]
    outputs: tuple[sympy.Symbol, ...]
    next_states: tuple[sympy.Symbol, ...]
    surrogate: sympy.Expr                     # g(x), parameters substituted
    output_names: tuple[str, ...]
    constants: tuple[tuple[str, float], ...]  # baked-in parameter values, for the record
    initial_states: tuple[sympy.Expr, ...] = ()  # each state's initial value (constants substituted)
    positions: tuple[SourcePos | None, ...] = ()  # where each assignment was written

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
    """Parameter values with ``overrides`` (``params=``) applied and checked."""
    if overrides is not None and not isinstance(overrides, Mapping):
        raise SpecTypeError(f"params= must be a dict of parameter name -> number, not {type(overrides).__name__}",
                            hint="e.g. params={'tau': 2.0}")
    values = {p.name: p.value for p in model.parameters.values()}
    lines = model.text.splitlines()
    for name, value in (overrides or {}).items():
        if name not in values:
            hint = closest(str(name), values)
            raise SpecError(f"{model.file}: params= names {name!r}, which is not a parameter of {model.name!r}",
                            hint=hint or f"parameters: {', '.join(values) or 'none'}")
        try:
            values[name] = param_value(name, value, model.parameters[name].pos)
        except SpecError as exc:
            raise exc.with_source(lines) from None
    if overrides:
        try:
            fold_values(model, values, lambda n: f"{n} = {values[n]:g} (" + (
                "params=" if n in overrides else f"line {model.parameters[n].pos.line}") + ")")
        except SpecError as exc:
            raise exc.with_source(lines) from None
    return values


def build_ir(model: NeuronModel, values: dict[str, float]) -> StepIR:
    """Lower a validated model with these parameter values to the step IR."""
    folded = fold_values(model, values)
    surrogate = model.surrogate.gradient_with(model.surrogate_params)
    return StepIR(
        name=model.name,
        inputs=tuple(real_symbol(n) for n in model.inputs),
        states=tuple(real_symbol(n) for n in model.states),
        params=tuple(real_symbol(n) for n in model.learnable),
        assignments=tuple((a.symbol, expr) for a, expr in zip(model.steps, folded.steps)),
        outputs=tuple(sym for _, sym in model.outputs),
        next_states=tuple(model.next_states[n] for n in model.states),
        surrogate=sympy.sympify(surrogate),
        output_names=tuple(name for name, _ in model.outputs),
        constants=tuple((n, values[n]) for n, p in model.parameters.items() if not p.learnable),
        initial_states=folded.initial_states,
        positions=tuple(a.pos for a in model.steps),
    )
