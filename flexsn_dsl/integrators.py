"""Explicit integrators over one step, with the formulas of Brian2's state updaters of the same names.

Each takes the derivatives ``f`` (state symbol -> dx/dt, constants already folded) and the step
``dt``, and returns named intermediate lines and each state's integrated value, which may use
the names of those lines. Names are ``<state>__<what>`` (``__`` is never in a spec's names).
"""
from __future__ import annotations

from typing import Callable

import sympy

from .propagators import phi1
from .symbolic import real_symbol

Lines = list[tuple[sympy.Symbol, sympy.Expr]]
Integrated = dict[sympy.Symbol, sympy.Expr]


def _name(state: sympy.Symbol, what: str) -> sympy.Symbol:
    return real_symbol(f"{state.name}__{what}")


def _stage(f: dict[sympy.Symbol, sympy.Expr], dt, what: str, at: dict[sympy.Symbol, sympy.Expr],
           lines: Lines) -> dict[sympy.Symbol, sympy.Symbol]:
    """One Runge-Kutta stage: k_x = dt * f_x(x + at_x) as a line per state, named x__<what>."""
    out = {}
    for x, fx in f.items():
        out[x] = _name(x, what)
        lines.append((out[x], dt * fx.xreplace(at) if at else dt * fx))
    return out


def euler(f: dict[sympy.Symbol, sympy.Expr], dt) -> tuple[Lines, Integrated]:
    """x + dt f(x)."""
    return [], {x: x + dt * fx for x, fx in f.items()}


def rk2(f: dict[sympy.Symbol, sympy.Expr], dt) -> tuple[Lines, Integrated]:
    """The explicit midpoint rule: k = dt f(x); x + dt f(x + k/2)."""
    lines: Lines = []
    k = _stage(f, dt, "k", {}, lines)
    mid = {x: x + k[x] / 2 for x in f}
    return lines, {x: x + dt * fx.xreplace(mid) for x, fx in f.items()}


def rk4(f: dict[sympy.Symbol, sympy.Expr], dt) -> tuple[Lines, Integrated]:
    """The classical fourth-order Runge-Kutta: k1 = dt f(x), k2 = dt f(x + k1/2),
    k3 = dt f(x + k2/2), k4 = dt f(x + k3); x + (k1 + 2 k2 + 2 k3 + k4) / 6."""
    lines: Lines = []
    k1 = _stage(f, dt, "k1", {}, lines)
    k2 = _stage(f, dt, "k2", {x: x + k1[x] / 2 for x in f}, lines)
    k3 = _stage(f, dt, "k3", {x: x + k2[x] / 2 for x in f}, lines)
    k4 = _stage(f, dt, "k4", {x: x + k3[x] for x in f}, lines)
    return lines, {x: x + (k1[x] + 2 * k2[x] + 2 * k3[x] + k4[x]) / 6 for x in f}


def exponential_euler(f: dict[sympy.Symbol, sympy.Expr], dt) -> tuple[Lines, Integrated]:
    """Each state whose derivative f = A x + B has A free of x (evaluated at the start of the
    step) gets x + dt φ1(A dt) f, which is -B/A + (x + B/A) e^{A dt} and, where A is 0, the Euler
    step (φ1(z) = (e^z - 1)/z, stable near 0); the other states get euler."""
    lines: Lines = []
    out: Integrated = {}
    for x, fx in f.items():
        A = sympy.diff(fx, x)
        if A == 0 or x in A.free_symbols:  # not linear in x
            out[x] = x + dt * fx
            continue
        if A.is_number:
            a = A
        else:
            a = _name(x, "A")
            lines.append((a, A))
        out[x] = x + dt * phi1(a * dt) * fx
    return lines, out


METHODS: dict[str, Callable[[dict[sympy.Symbol, sympy.Expr], object], tuple[Lines, Integrated]]] = {
    "euler": euler, "rk2": rk2, "rk4": rk4, "exponential_euler": exponential_euler,
}
