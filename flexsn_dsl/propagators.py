"""Exact propagators of linear systems dx/dt = A x + b over one step of length dt.

With the inputs held over the step, x(t + dt) = e^{A dt} x(t) + (∫₀^dt e^{A s} ds) b, and both
matrices are blocks of one exponential: exp([[A, b], [0, 0]] dt) = [[e^{A dt}, ∫₀^dt e^{A s} ds b],
[0, 1]]. That form needs no inverse of A, so it stays exact for singular A (a pure integrator),
zero rows, and repeated eigenvalues (two equal time constants), where a formula through the
eigenvectors divides by zero.

The work is bounded by the size of the system, never by a clock (language.md, "Limits"):

- A of numbers (constant parameters folded): the exponential is computed numerically at 40
  digits (mpmath, scaling and squaring of the Taylor series), so the step is a few numbers
  times the states and inputs, the same arithmetic as a hand-discretised neuron. At most
  MAX_NUMERIC_STATES states, and ||A dt|| below 2**MAX_NUMERIC_SCALE_BITS (each bit costs a
  squaring and two bits of precision).
- A with symbols (learnable or shaped parameters, or inputs inside it) stays symbolic, so
  gradients flow and a shaped parameter gives one propagator per element. A triangular system
  (one-way couplings, at most MAX_SYMBOLIC_STATES states) is written out entry by entry:
  e^{T}[i, j] is the sum over the chains of couplings from j to i of the product of their
  entries times the divided difference of exp at the rates along the chain (at most
  MAX_CHAIN_RATES of them, the input's rate 0 included). The divided differences are evaluated
  stably where rates meet or come close (an input or a learnable parameter can make two rates
  equal): a series where they are close, the recurrence over the farthest pair elsewhere.
  No Jordan form, no simplification; other symbolic systems are refused.
"""
from __future__ import annotations

from itertools import combinations, combinations_with_replacement
from math import factorial

import mpmath
import sympy

MAX_EXACT_STATES = 16        # states of one exact propagator (the numeric one is a (2n)^3 product per squaring)
MAX_NUMERIC_SCALE_BITS = 40  # ||A dt|| below 2**40 (about 1.1e12): a squaring and two bits of precision per bit
MAX_SYMBOLIC_STATES = 4      # coupled symbolic systems beyond this are refused
MAX_CHAIN_RATES = 3          # rates along one chain of couplings (the input's 0 included) in a symbolic one
CLOSE_RATES_BELOW = 1e-2     # rates (times dt) this close, or a rate this close to 0: from the series
SERIES_DEGREE = 5            # its last term (the next is below 1e-15 of the sum there)
DIGITS = 40                  # of the numeric exponential


class PropagatorError(ValueError):
    """A linear system whose propagator is not derived; the message says why, ``hint`` what to change."""

    def __init__(self, message: str, hint: str):
        super().__init__(message)
        self.hint = hint


def linear_system(derivatives: list[sympy.Expr], states: list[sympy.Symbol]) -> tuple[sympy.Matrix, sympy.Matrix]:
    """A and b of dx/dt = A x + b (the derivatives must be affine in ``states``)."""
    A = sympy.Matrix([[sympy.diff(f, x) for x in states] for f in derivatives])
    zero = {x: sympy.S.Zero for x in states}
    b = sympy.Matrix([f.xreplace(zero) for f in derivatives])
    return A, b


def exact_step(derivatives: list[sympy.Expr], states: list[sympy.Symbol], dt: float) -> list[sympy.Expr]:
    """Each state's value after one step of dx/dt = ``derivatives`` (affine in ``states``):
    e^{A dt} x + ∫₀^dt e^{A s} ds · b."""
    n = len(states)
    if n > MAX_EXACT_STATES:
        raise PropagatorError(f"the system has {n} states, and exact propagators are derived for at most "
                              f"{MAX_EXACT_STATES}", "choose method: rk4 (or exponential_euler), or split the neuron")
    A, b = linear_system(derivatives, states)
    if not A.free_symbols:
        phi, gamma = _numeric(A, dt)
        x, b = sympy.Matrix(states), sympy.Matrix(b)
        return list(phi * x + gamma * b)
    if all(A[i, j] == 0 for i in range(n) for j in range(n) if i != j):
        return [_scalar(A[i, i], b[i], states[i], dt) for i in range(n)]
    return _symbolic(A, b, states, dt)


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
    scale = max(abs(dt) + sum(abs(float(A[i, j]) * dt) for j in range(n)) for i in range(n))
    if not scale < 2.0 ** MAX_NUMERIC_SCALE_BITS:  # inf and NaN included
        raise PropagatorError(f"the rates times dt reach {scale:.3g}, and the numeric exponential is computed "
                              f"below 2**{MAX_NUMERIC_SCALE_BITS} = {2.0 ** MAX_NUMERIC_SCALE_BITS:.3g} (each "
                              "doubling costs a squaring and more digits)",
                              "check the time constants and dt (a rate this fast relaxes within a tiny fraction "
                              "of the step), or choose method: exponential_euler")
    with mpmath.workdps(DIGITS):
        big = mpmath.zeros(2 * n, 2 * n)
        for i in range(n):
            big[i, n + i] = mpmath.mpf(dt)
            for j in range(n):
                big[i, j] = mpmath.mpf(str(sympy.Float(A[i, j], DIGITS))) * mpmath.mpf(dt)
        E = mpmath.expm(big)
        reach = _reachable(A)
        phi = sympy.Matrix(n, n, lambda i, j: _number(E[i, j]) if reach[i][j] else 0)
        gamma = sympy.Matrix(n, n, lambda i, j: _number(E[i, n + j]) if reach[i][j] else 0)
    return phi, gamma


def _number(value) -> sympy.Expr:
    """A float64-exact sympy number (1 and 0 as integers, so that sympy drops them)."""
    number = float(value)
    return sympy.Integer(int(number)) if number in (0.0, 1.0) else sympy.Float(number)


def _safe(z: sympy.Expr) -> sympy.Expr:
    """``z``, moved by 1 where |z| < CLOSE_RATES_BELOW: a denominator for the branch taken where it is not
    small (a sum, so sympy keeps 1/safe whole: the other branch gives neither NaN nor a NaN gradient)."""
    return z + sympy.Piecewise((1, sympy.Abs(z) < CLOSE_RATES_BELOW), (0, True))


def phi1(z: sympy.Expr) -> sympy.Expr:
    """(e^z - 1) / z, continued by 1 at z = 0: the series below CLOSE_RATES_BELOW, and the
    formula evaluated at a safe point there (so neither branch gives NaN, nor its gradient)."""
    small = sympy.Abs(z) < CLOSE_RATES_BELOW
    safe = _safe(z)
    series = sum(z ** m / factorial(m + 1) for m in range(SERIES_DEGREE + 1))
    return sympy.Piecewise((series, small), ((sympy.exp(safe) - 1) / safe, True))


def exp_divided_difference(z: list[sympy.Expr]) -> sympy.Expr:
    """exp[z_0, ..., z_k], the divided difference of exp (e^{z_0} for one point; for two,
    (e^{z_0} - e^{z_1}) / (z_0 - z_1), and e^{z_0} where they are equal), stable where points meet:
    the recurrence divides by the difference of a pair at least CLOSE_RATES_BELOW apart, and where
    every pair is closer, the series about their mean is taken."""
    k = len(z) - 1
    if k == 0:
        return sympy.exp(z[0])
    if k == 1:
        return sympy.exp(z[1]) * phi1(z[0] - z[1])
    cases = []
    for i, j in combinations(range(k + 1), 2):
        d = z[i] - z[j]
        far = sympy.Abs(d) >= CLOSE_RATES_BELOW
        if d == 0 or far == sympy.false:
            continue
        without_i, without_j = z[:i] + z[i + 1:], z[:j] + z[j + 1:]
        value = (exp_divided_difference(without_j) - exp_divided_difference(without_i)) / _safe(d)
        if far == sympy.true:
            return value
        cases.append((value, far))
    return sympy.Piecewise(*cases, (_series(z), True))


def _series(z: list[sympy.Expr]) -> sympy.Expr:
    """exp[z_0, ..., z_k] = e^c sum_m h_m(z - c) / (m + k)! about the mean c, to degree SERIES_DEGREE
    (h_m: the sum of all monomials of degree m)."""
    k = len(z) - 1
    c = sum(z) / (k + 1)
    w = [zi - c for zi in z]
    total = sympy.S.Zero
    for m in range(SERIES_DEGREE + 1):
        h = sum((sympy.Mul(*[w[i] for i in chosen]) for chosen in combinations_with_replacement(range(k + 1), m)),
                sympy.S.Zero)
        total += h / factorial(m + k)
    return sympy.exp(c) * total


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


def _symbolic(A: sympy.Matrix, b: sympy.Matrix, states: list[sympy.Symbol], dt: float) -> list[sympy.Expr]:
    """e^{M dt} of the triangular M = [[A, b], [0, 0]], entry by entry: the sum over the chains of
    couplings p_0 -> ... -> p_r of the product of their entries times exp[rates along the chain]."""
    n = len(states)
    symbols = ", ".join(sorted({s.name for s in A.free_symbols}))
    reach = _reachable(A)
    if n > MAX_SYMBOLIC_STATES or any(reach[i][j] and reach[j][i] for i in range(n) for j in range(i)):
        raise PropagatorError(f"the coupled system of {n} states has {symbols} inside its matrix A, and its "
                              "exponential is only derived symbolically for triangular systems (one-way "
                              f"couplings) of up to {MAX_SYMBOLIC_STATES} states",
                              "make the parameters inside the coupling constant (learnable: false, no shape), "
                              "or choose method: rk4")
    names = [x.name for x in states] + ["the input"]
    rate = [A[i, i] * dt for i in range(n)] + [sympy.S.Zero]  # node n: the held inputs b, rate 0
    weight = lambda i, j: (A[i, j] if j < n else b[i]) * dt  # noqa: E731 - the coupling j -> i

    def chains(end: list[int]) -> list[list[int]]:
        """Every chain of couplings that ends with ``end`` (a chain is read start to end)."""
        if len(end) > MAX_CHAIN_RATES:
            raise PropagatorError(f"the chain of couplings {' -> '.join(names[p] for p in end)} has "
                                  f"{len(end)} rates, and symbolic propagators are derived for chains of at most "
                                  f"{MAX_CHAIN_RATES} (the input's included)",
                                  "make the parameters inside A constant (learnable: false, no shape), or "
                                  "choose method: rk4")
        found = [end]
        for j in range(n + 1) if end[0] < n else ():  # the input has no couplings into it
            if j != end[0] and weight(end[0], j) != 0:
                found += chains([j, *end])
        return found

    result = []
    for i in range(n):
        total = sympy.S.Zero
        for chain in chains([i]):
            couplings = sympy.Mul(*[weight(q, p) for p, q in zip(chain, chain[1:])])
            start = states[chain[0]] if chain[0] < n else sympy.S.One
            total += couplings * exp_divided_difference([rate[p] for p in chain]) * start
        result.append(total)
    return result
