"""Exact propagators of linear systems dx/dt = A x + b over one step of length dt.

With the inputs held over the step, x(t + dt) = e^{A dt} x(t) + (∫₀^dt e^{A s} ds) b, and both
matrices are blocks of one exponential: exp([[A, I], [0, 0]] dt) = [[e^{A dt}, ∫₀^dt e^{A s} ds],
[0, I]]. That form needs no inverse of A, so it stays exact for singular A (a pure integrator),
zero rows, and repeated eigenvalues (two equal time constants), where a formula through the
eigenvectors divides by zero.

- A of numbers (constant parameters folded): the exponential is computed numerically at 40
  digits (mpmath, scaling and squaring of the Taylor series), so the step is a few numbers
  times the states and inputs, the same arithmetic as a hand-discretised neuron.
- A with symbols (learnable or shaped parameters, or inputs inside it) stays symbolic, so
  gradients flow and a shaped parameter gives one propagator per element:
  decoupled states (diagonal A) get the scalar formula, guarded where a rate may be zero;
  a coupled triangular system up to four states gets sympy's matrix exponential, refused
  where its formula is singular at the given values; other coupled symbolic systems are refused.
"""
from __future__ import annotations

import mpmath
import sympy

MAX_SYMBOLIC_STATES = 4   # coupled symbolic systems beyond this are refused (sympy's exponential grows fast)
PHI1_SERIES_BELOW = 1e-3  # |z| below which (e^z - 1)/z is taken from its series


class PropagatorError(ValueError):
    """A linear system whose symbolic propagator is not derived; the message says why."""


def linear_system(derivatives: list[sympy.Expr], states: list[sympy.Symbol]) -> tuple[sympy.Matrix, sympy.Matrix]:
    """A and b of dx/dt = A x + b (the derivatives must be affine in ``states``)."""
    A = sympy.Matrix([[sympy.diff(f, x) for x in states] for f in derivatives])
    zero = {x: sympy.S.Zero for x in states}
    b = sympy.Matrix([f.xreplace(zero) for f in derivatives])
    return A, b


def exact_step(A: sympy.Matrix, b: sympy.Matrix, states: list[sympy.Symbol], dt: float,
               values: dict[sympy.Symbol, float] | None = None) -> list[sympy.Expr]:
    """Each state's value after one step: e^{A dt} x + ∫₀^dt e^{A s} ds · b.

    ``values`` (the current values of the symbols left in A) is used to refuse a symbolic
    formula that is singular there (e.g. two learnable time constants that start equal; for a shaped
    parameter, its initial element value).
    """
    if not A.free_symbols:
        phi, gamma = _numeric(A, dt)
        x, b = sympy.Matrix(states), sympy.Matrix(b)
        return list(phi * x + gamma * b)
    n = len(states)
    if all(A[i, j] == 0 for i in range(n) for j in range(n) if i != j):
        return [_scalar(A[i, i], b[i], states[i], dt) for i in range(n)]
    return _symbolic(A, b, states, dt, values or {})


def _reachable(A: sympy.Matrix) -> list[list[bool]]:
    """reach[i][j]: state j influences state i (through a chain of nonzero entries), i == j included."""
    n = A.rows
    reach = [[i == j or A[i, j] != 0 for j in range(n)] for i in range(n)]
    for k in range(n):
        for i in range(n):
            if reach[i][k]:
                reach[i] = [r or reach[k][j] for j, r in enumerate(reach[i])]
    return reach


def _numeric(A: sympy.Matrix, dt: float) -> tuple[sympy.Matrix, sympy.Matrix]:
    """e^{A dt} and ∫₀^dt e^{A s} ds for a matrix of numbers; entries that no chain of
    couplings reaches are exactly zero."""
    n = A.rows
    with mpmath.workdps(40):
        big = mpmath.zeros(2 * n, 2 * n)
        for i in range(n):
            big[i, n + i] = mpmath.mpf(dt)
            for j in range(n):
                big[i, j] = mpmath.mpf(str(sympy.Float(A[i, j], 40))) * mpmath.mpf(dt)
        E = mpmath.expm(big)
        reach = _reachable(A)
        phi = sympy.Matrix(n, n, lambda i, j: _number(E[i, j]) if reach[i][j] else 0)
        gamma = sympy.Matrix(n, n, lambda i, j: _number(E[i, n + j]) if reach[i][j] else 0)
    return phi, gamma


def _number(value) -> sympy.Expr:
    """A float64-exact sympy number (1 and 0 as integers, so that sympy drops them)."""
    number = float(value)
    return sympy.Integer(int(number)) if number in (0.0, 1.0) else sympy.Float(number)


def phi1(z: sympy.Expr) -> sympy.Expr:
    """(e^z - 1) / z, continued by 1 at z = 0: the series below PHI1_SERIES_BELOW, and the
    formula evaluated at a safe point there (so neither branch gives NaN, nor its gradient)."""
    small = sympy.Abs(z) < PHI1_SERIES_BELOW
    safe = z + sympy.Piecewise((1, small), (0, True))  # a sum: sympy keeps 1/safe whole (no 1/z inside a branch)
    return sympy.Piecewise((1 + z / 2 + z ** 2 / 6 + z ** 3 / 24, small), ((sympy.exp(safe) - 1) / safe, True))


def _scalar(a: sympy.Expr, b: sympy.Expr, x: sympy.Symbol, dt: float) -> sympy.Expr:
    """x e^{a dt} + b (e^{a dt} - 1) / a, for a rate ``a`` that may hold symbols."""
    if a == 0:
        return x + dt * b
    decay = sympy.exp(a * dt)
    if b == 0:
        return decay * x
    if sympy.fraction(sympy.together(a))[0].free_symbols:  # a rate that may be zero (e.g. -g, g learnable)
        return decay * x + dt * phi1(a * dt) * b
    return decay * x + (decay - 1) / a * b


def _symbolic(A: sympy.Matrix, b: sympy.Matrix, states: list[sympy.Symbol], dt: float,
              values: dict[sympy.Symbol, float]) -> list[sympy.Expr]:
    n = len(states)
    symbols = sorted({s.name for s in A.free_symbols})
    reach = _reachable(A)
    order = sorted(range(n), key=lambda i: sum(reach[i]))  # fewest influences first: a triangular order
    P = A.extract(order, order)
    if any(P[i, j] != 0 for i in range(n) for j in range(n) if i < j) or n > MAX_SYMBOLIC_STATES:
        raise PropagatorError(f"the coupled system of {n} states has {', '.join(symbols)} inside its matrix A, "
                              "and its exponential is only derived symbolically for triangular systems (one-way "
                              f"couplings) of up to {MAX_SYMBOLIC_STATES} states")
    M = sympy.zeros(n + 1, n + 1)
    M[:n, :n] = A
    M[:n, n] = b
    try:
        E = (M * dt).exp()
    except (ValueError, NotImplementedError, sympy.MatrixError) as exc:
        raise PropagatorError(f"sympy cannot derive e^(A dt) with {', '.join(symbols)} inside A: {exc}") from None
    result = [sympy.expand_mul(sum(E[i, j] * states[j] for j in range(n)) + E[i, n]) for i in range(n)]
    at = {s: sympy.Float(v) for s, v in values.items()}
    for expr in result:  # at the current values (states and inputs at an arbitrary 0.5)
        test = expr.xreplace(at)
        test = test.xreplace({s: sympy.Float(0.5) for s in test.free_symbols})
        if test.has(sympy.nan, sympy.zoo, sympy.oo, -sympy.oo) or not test.is_finite:
            raise PropagatorError(f"the symbolic propagator is singular at the current values of "
                                  f"{', '.join(symbols)} (two equal rates, e.g. equal time constants)")
    return result
