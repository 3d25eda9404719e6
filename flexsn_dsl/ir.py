"""Stage 3: the sympy IR of one time step, ready for code generation.

Constant parameters are substituted by their values (so sympy folds them);
learnable parameters stay symbols and become runtime arguments. The IR is a
straight-line program: ``assignments`` in order, then ``outputs`` and
``next_states`` name symbols of it.
"""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Callable

import sympy

from .errors import SourcePos, SpecError
from .expressions import closest
from .model import NeuronModel, check_values
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


def resolve_params(model: NeuronModel, overrides: dict[str, float] | None) -> dict[str, float]:
    """Parameter values with ``overrides`` applied (unknown names are an error)."""
    values = {p.name: p.value for p in model.parameters.values()}
    for name, value in (overrides or {}).items():
        if name not in values:
            hint = closest(name, values)
            raise SpecError(f"{model.file}: params= names {name!r}, which is not a parameter of {model.name!r}",
                            hint=hint or f"parameters: {', '.join(values) or 'none'}")
        try:
            values[name] = float(value)
        except (TypeError, ValueError):
            raise SpecError(f"params[{name!r}] must be a number, got {value!r}") from None
    if overrides:
        lines = model.text.splitlines()
        try:
            check_values(model.states, model.steps, values,
                         lambda n: f"{n} = {values[n]:g} (" + ("params=" if n in overrides else
                                                               f"line {model.parameters[n].pos.line}") + ")")
        except SpecError as exc:
            raise exc.with_source(lines) from None
    return values


def build_ir(model: NeuronModel, values: dict[str, float]) -> StepIR:
    """Lower a validated model with these parameter values to the step IR."""
    constants = {real_symbol(n): sympy.Float(values[n]) for n, p in model.parameters.items() if not p.learnable}
    assignments = []
    for a in model.steps:  # substitute constants, and propagate lines that fold to a number
        expr = sympy.sympify(a.expr).xreplace(constants)
        if expr.is_number:
            constants[a.symbol] = expr
        assignments.append((a.symbol, expr))
    surrogate = model.surrogate.gradient_with(model.surrogate_params)
    return StepIR(
        name=model.name,
        inputs=tuple(real_symbol(n) for n in model.inputs),
        states=tuple(real_symbol(n) for n in model.states),
        params=tuple(real_symbol(n) for n in model.learnable),
        assignments=tuple(assignments),
        outputs=tuple(sym for _, sym in model.outputs),
        next_states=tuple(model.next_states[n] for n in model.states),
        surrogate=sympy.sympify(surrogate),
        output_names=tuple(name for name, _ in model.outputs),
        constants=tuple((n, values[n]) for n, p in model.parameters.items() if not p.learnable),
        initial_states=tuple(sympy.sympify(model.states[n].init).xreplace(constants) for n in model.states),
        positions=tuple(a.pos for a in model.steps),
    )
