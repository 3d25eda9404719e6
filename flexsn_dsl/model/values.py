"""Stage 2: parameter values checked against a model: folded finite, `dt` and refractory periods in range."""
from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Callable

import sympy

from ..errors import SourcePos, SpecError, SpecWarning
from ..symbolic import draw_of, real_symbol
from .language import CANONICAL_LOOP_HINT, DT_HINT, MAX_REFRACTORY_STEPS
from .neuron import Assignment, NeuronModel
from .numbers import finite, finite_with


def dt_problem(dt: float) -> str | None:
    """What is wrong with a value of `dt` (a positive normal float64: 1/dt is finite), or None."""
    if not math.isfinite(dt) or dt <= 0:
        return f"`dt` must be a positive constant, not {dt:g}"
    if dt < sys.float_info.min:
        return f"`dt` = {dt:g} is below the smallest normal float64 ({sys.float_info.min:.3g}): 1 / dt overflows"
    return None


def period_problem(period: float, dt: float) -> str | None:
    """What is wrong with a refractory period with this `dt` (a number >= 0 of at most
    MAX_REFRACTORY_STEPS steps), or None."""
    if not math.isfinite(period) or period < 0:
        return f"the refractory period is {period:g}, not a number >= 0"
    if period / dt > MAX_REFRACTORY_STEPS:
        return (f"the refractory period {period:g} is {period / dt:g} steps of dt = {dt:g}, more than the "
                f"{MAX_REFRACTORY_STEPS} a step counter holds")
    return None


def check_values(model: NeuronModel, values: dict[str, float], given: set[str]) -> None:
    """Refuse parameter values the language forbids beyond finiteness (`dt` a positive normal
    number; a refractory period >= 0 of at most MAX_REFRACTORY_STEPS steps): the same rules for
    the spec's own values and every value that replaces one (``params=``, ``--param``,
    ``load_state_dict``, NIR), named in ``given``; a SpecError at the parameter's line otherwise."""
    c = model.continuous
    if c is None:
        return

    def origin(names: list[str]) -> str:
        shown = [n for n in names if n in given] or names
        return ", ".join(f"{n} = {values[n]:g}" for n in shown) + (" as given" if set(shown) & given else "")
    dt = float(values["dt"])
    problem = dt_problem(dt)
    if problem is not None:
        raise SpecError(f"{problem} ({origin(['dt'])})", model.parameters["dt"].pos, DT_HINT)
    if c.period is not None and not any(draw_of(s) for s in c.period.free_symbols):  # (a random one is clamped)
        period = sympy.sympify(c.period).xreplace({real_symbol(n): sympy.Float(v) for n, v in values.items()})
        problem = period_problem(float(period), dt)
        if problem is not None:
            raise SpecError(f"{problem} ({origin(sorted({s.name for s in c.period.free_symbols} | {'dt'}))})",
                            c.period_pos, "give a period >= 0 of at most that many steps")


def refractory_steps(period: float, dt: float, pos: SourcePos | None) -> tuple[int, SpecWarning | None]:
    """n = round(period / dt): the steps a spike makes the neuron refractory, the spike step included;
    and a warning when the period is not a whole number of steps."""
    ratio = period / dt
    steps = round(ratio)
    if abs(ratio - steps) <= 1e-9 * max(1.0, ratio):
        return steps, None
    return steps, SpecWarning(f"the refractory period {period:g} is {ratio:g} steps of dt = {dt:g}: it rounds to "
                              f"{steps} steps ({steps * dt:g} time units)", pos,
                              "make the period a whole multiple of dt")


@dataclass(frozen=True)
class Folded:
    """A model's expressions with the constant parameters substituted and folded by sympy
    (learnable parameters stay symbols); every constant in them is a finite float64."""

    steps: tuple[sympy.Expr, ...]
    initial_states: tuple[sympy.Expr, ...]
    constants: dict[sympy.Symbol, sympy.Expr]  # constant parameters, and steps that fold to a number


def fold_values(model: NeuronModel, values: dict[str, float],
                describe: Callable[[str], str] | None = None, steps: list[Assignment] | None = None) -> Folded:
    """Substitute parameter ``values`` into the model and fold constants; refuse a step or
    initial value that becomes infinite, NaN or complex (x / tau with tau: 0, tau * 1e308).

    Runtime (learnable or shaped) parameters stay symbols in the result but are checked with their initial
    values too. ``describe(name)`` says where a parameter's value came from. ``steps`` are the
    lines to fold (default: the model's, with a continuous-time model's equations, threshold and
    reset as lines)."""
    describe = describe or (lambda n: f"{n} = {values[n]:g}")
    runtime = set(model.runtime_params)  # learnable or shaped
    constants = {real_symbol(n): sympy.Float(v) for n, v in values.items() if n not in runtime}
    checked = {**constants, **{real_symbol(n): sympy.Float(values[n]) for n in runtime}}
    hint = ("a division by zero, log/sqrt of a number <= 0, or a number beyond 1.8e308: change the "
            "parameter value, or guard the expression with where(...)")

    folded_steps: dict[sympy.Symbol, Assignment] = {}  # steps that fold to a number

    def fold(expr: sympy.Expr, what: str, pos: SourcePos) -> sympy.Expr:
        try:
            folded = sympy.sympify(expr).xreplace(constants)
            if finite(folded) and finite_with(folded, checked):
                return folded
        except (TypeError, ValueError, ZeroDivisionError):  # e.g. "Invalid comparison of non-real zoo"
            pass
        except RecursionError:
            raise SpecError(f"{what}: sympy cannot put a comparison of it in canonical form (it rewrites the "
                            "comparison back and forth)", pos, CANONICAL_LOOP_HINT) from None
        culprits = [describe(s.name) for s in sorted(expr.free_symbols, key=str) if s.name in values] + \
                   [f"{folded_steps[s].name} = {float(constants[s]):g} (line {folded_steps[s].pos.line})"
                    for s in sorted(expr.free_symbols, key=str) if s in folded_steps]
        raise SpecError(f"{what} is not a finite real number" + (f" with {', '.join(culprits)}" if culprits else ""),
                        pos, hint)

    folded_lines = []
    for step in (model.checked_lines if steps is None else steps):
        what = f"step {step.name!r}" if model.continuous is None or steps is not None else step.name
        folded = fold(step.expr, what, step.pos)
        if folded.is_number:
            constants[step.symbol] = checked[step.symbol] = folded
            folded_steps[step.symbol] = step
        folded_lines.append(folded)
    inits = [fold(state.init, f"the initial value of state {state.name!r}", state.pos)
             for state in model.states.values()]
    return Folded(tuple(folded_lines), tuple(inits), constants)
