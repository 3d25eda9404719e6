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
  No Jordan form, no simplification.
- Two states coupled both ways with symbols in A (an adaptive LIF's v and w, a resonator with a
  learnable frequency): e^{N} for N = [[A dt, b dt], [0, 0]] by Cayley-Hamilton over N's
  eigenvalues l1, l2 (those of A dt) and 0, as g0 I + g1 N + g2 (N - l1)(N - l2). g0, g1, g2 are
  functions of the half trace m and of q = m**2 - det(A dt), real whether the eigenvalues are real
  (q > 0) or a complex pair (q < 0, sin and cos), each taken from its series where the formula
  would cancel: g0, g1 where |q| is below CLOSE_RATES_BELOW (equal rates), g2 where every
  eigenvalue is near 0 (m**2 + |q| below NEAR_ZERO_PAIR). They and m, det, q, the square roots,
  the real eigenvalues (the one nearer 0 as det over the other, which does not cancel) and the
  series' arguments (0 where not taken) are named lines of the step, computed once each.
Other systems with symbols in a cyclic A are refused: three states around a cycle, or a pair coupled
both ways inside a larger system (an adaptive LIF fed by a synaptic current).
"""
from __future__ import annotations

from itertools import combinations, combinations_with_replacement
from math import factorial
from typing import NamedTuple

import mpmath
import sympy
from sympy.codegen.cfunctions import expm1

MAX_EXACT_STATES = 16        # states of one exact propagator (the numeric one is a (2n)^3 product per squaring)
MAX_NUMERIC_SCALE_BITS = 40  # ||A dt|| below 2**40 (about 1.1e12): a squaring and two bits of precision per bit
MAX_SYMBOLIC_STATES = 4      # coupled symbolic systems beyond this are refused
MAX_CHAIN_RATES = 3          # rates along one chain of couplings (the input's 0 included) in a symbolic one
CLOSE_RATES_BELOW = 1e-2     # rates (times dt) this close, or a rate this close to 0: from the series
SERIES_DEGREE = 5            # its last term (the next is below 1e-15 of the sum there)
DIGITS = 40                  # of the numeric exponential
NEAR_ZERO_PAIR = 0.25        # a coupled pair's m**2 + |q| below this: g2 from its series (eigenvalues below 0.71)
PAIR_SERIES_DEGREE = 16      # that series' last term (the next is below 1e-17 of the sum there)


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


class ExactStep(NamedTuple):
    """Lines to compute first (a coupled pair's quantities, named ``<first state>__m`` ... ``__g2``), then
    each state's value after the step, which may use them."""
    lines: list[tuple[sympy.Symbol, sympy.Expr]]
    values: list[sympy.Expr]


def exact_step(derivatives: list[sympy.Expr], states: list[sympy.Symbol], dt: float) -> ExactStep:
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
        return ExactStep([], list(phi * x + gamma * b))
    if all(A[i, j] == 0 for i in range(n) for j in range(n) if i != j):
        return ExactStep([], [_scalar(A[i, i], b[i], states[i], dt) for i in range(n)])
    if n == 2 and A[0, 1] != 0 and A[1, 0] != 0:
        return _coupled_pair(A, b, states, dt)
    return ExactStep([], _symbolic(A, b, states, dt))


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


def phi1(z: sympy.Expr, accurate: bool = False) -> sympy.Expr:
    """(e^z - 1) / z, continued by 1 at z = 0: the series below CLOSE_RATES_BELOW, and the
    formula evaluated at a safe point there (so neither branch gives NaN, nor its gradient).
    ``accurate``: expm1(z) / z, which does not lose float32's last digits just past the series
    (1e-5 at |z| = 0.01), at the cost of a logarithm in the Triton kernels' expm1."""
    small = sympy.Abs(z) < CLOSE_RATES_BELOW
    safe = _safe(z)
    series = sum(z ** m / factorial(m + 1) for m in range(SERIES_DEGREE + 1))
    return sympy.Piecewise((series, small), ((expm1(safe) if accurate else sympy.exp(safe) - 1) / safe, True))


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
                              "exponential is only derived symbolically for a system of two states coupled both "
                              f"ways and for triangular systems (one-way couplings) of up to {MAX_SYMBOLIC_STATES} "
                              "states",
                              "make the parameters inside A constant (learnable: false, no shape), "
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


def _taken(condition, z: sympy.Expr, other: int) -> sympy.Expr:
    """``z`` where ``condition`` holds, else ``other``: an argument (of a square root, a denominator, a
    series) for the branch taken there, which the other branches never turn into NaN or infinity, nor its
    gradient. (A sum, which sympy keeps whole: it would move a square root or a reciprocal of a Piecewise
    into each branch.)"""
    return z * sympy.Piecewise((1, condition), (0, True)) + sympy.Piecewise((0, condition), (other, True))


def _even_series(q: sympy.Expr, first: int) -> sympy.Expr:
    """sum_k q**k / (2k + first)!: cosh(sqrt(q)) (first 0) and sinh(sqrt(q)) / sqrt(q) (first 1), near q = 0."""
    return sum((q ** k / factorial(2 * k + first) for k in range(SERIES_DEGREE + 1)), sympy.S.Zero)


def _pair_series(s: sympy.Expr, p: sympy.Expr) -> sympy.Expr:
    """exp[l1, l2, 0] = sum_k h_k(l1, l2) / (k + 2)! for eigenvalues of sum ``s`` and product ``p``
    (h_k = s h_(k-1) - p h_(k-2), the complete symmetric polynomials), a sum of monomials (whose
    derivatives are as short; Horner's form's are nested products)."""
    S, P = sympy.Dummy("s"), sympy.Dummy("p")
    h = [sympy.Poly(1, S, P), sympy.Poly(S, S, P)]
    while len(h) <= PAIR_SERIES_DEGREE:
        h.append(sympy.Poly(S, S, P) * h[-1] - sympy.Poly(P, S, P) * h[-2])
    total = sum((hk * sympy.Rational(1, factorial(k + 2)) for k, hk in enumerate(h)), sympy.Poly(0, S, P))
    return total.as_expr().xreplace({S: s, P: p})


def _coupled_pair(A: sympy.Matrix, b: sympy.Matrix, states: list[sympy.Symbol], dt: float) -> ExactStep:
    """Two states coupled both ways, by Cayley-Hamilton (module docstring). With M = A dt and its
    eigenvalues l1, l2 = m +- sqrt(q): e^M = g0 + g1 M and the input's term (g1 - 2 m g2) b dt + g2 M b dt,
    written g1 b dt - g2 adj(M) b dt (in a stiff pair the two terms of the first form are large and cancel),
    g0 = (l1 e^l2 - l2 e^l1) / (l1 - l2), g1 = exp[l1, l2], g2 = exp[l1, l2, 0]. Each quantity is a line of
    its own, named after the first state (``v__m``, ``v__q``, ..., ``v__g2``), so that the kernels compute it
    once."""
    M, beta = A * dt, b * dt
    name = states[0].name
    m, p, q, r, w, l1, l2, q_equal, m_near, p_near, G0, G1, G2 = (
        sympy.Symbol(f"{name}__{what}", real=True)
        for what in ("m", "p", "q", "r", "w", "l1", "l2", "q_equal", "m_near", "p_near", "g0", "g1", "g2"))
    real, rotating = q >= CLOSE_RATES_BELOW, q <= -CLOSE_RATES_BELOW
    equal, near_zero = sympy.Abs(q) < CLOSE_RATES_BELOW, m ** 2 + sympy.Abs(q) < NEAR_ZERO_PAIR
    far = m + r * sympy.Piecewise((-1, m < 0), (1, True))  # the eigenvalue farther from 0: |far| >= r > 0
    h = -expm1(-2 * r) / (2 * r)  # (e^l1 - e^l2) / (l1 - l2) = e^l1 h, in (0, 1]: no overflow
    sinc = sympy.sin(w) / w
    near = _even_series(q_equal, 1)
    lines = [
        (m, (M[0, 0] + M[1, 1]) / 2),
        (p, M[0, 0] * M[1, 1] - M[0, 1] * M[1, 0]),
        (q, ((M[0, 0] - M[1, 1]) / 2) ** 2 + M[0, 1] * M[1, 0]),  # m**2 - p, without its cancellation
        (r, sympy.sqrt(_taken(real, q, 1))),
        (w, sympy.sqrt(_taken(rotating, -q, 1))),
        # the real eigenvalues m +- r, the one nearer 0 as p over the other (m + r cancels where m << 0); 0 where
        # they are complex (p / far could overflow exp in the real branch's formulas there, and so their gradient)
        (l1, _taken(real, sympy.Piecewise((p / far, m < 0), (far, True)), 0)),
        (l2, _taken(real, sympy.Piecewise((far, m < 0), (p / far, True)), 0)),
        # the series' arguments: 0 where they are not taken, so that no power there overflows, nor its gradient
        # (lines of their own: sympy would take a power of each factor of a product)
        (q_equal, _taken(equal, q, 0)),
        (m_near, _taken(near_zero, m, 0)),
        (p_near, _taken(near_zero, p, 0)),
        (G0, sympy.Piecewise((sympy.exp(l1) * (1 - l1 * h), real),
                             (sympy.exp(m) * (sympy.cos(w) - m * sinc), rotating),
                             (sympy.exp(m) * (_even_series(q_equal, 0) - m * near), True))),
        (G1, sympy.Piecewise((sympy.exp(l1) * h, real), (sympy.exp(m) * sinc, rotating), (sympy.exp(m) * near, True))),
        (G2, sympy.Piecewise((_pair_series(2 * m_near, p_near), near_zero),
                             ((phi1(l1, True) - phi1(l2, True)) / (2 * r), real),
                             ((1 - G0) / _taken(~near_zero & ~real, p, 1), True))),
    ]
    x = sympy.Matrix(states)
    adjugate = sympy.Matrix([[M[1, 1], -M[0, 1]], [-M[1, 0], M[0, 0]]])  # 2 m - M: no terms cancel in it
    values = G0 * x + G1 * (M * x + beta) - G2 * (adjugate * beta)
    return ExactStep(lines, list(values))
