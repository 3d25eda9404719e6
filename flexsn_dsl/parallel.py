"""Stage 3b: whether a step can run time-parallel, as a scan over T of affine maps.

A spec is *time-parallel* when its next states are affine in its previous states,
``s_t = A_t s_{t-1} + b_t``, with coefficients ``A_t`` and ``b_t`` that depend only on the
step's inputs, random draws and the parameters: no state enters a state update through a spike, a
condition or any other nonlinear function, and no output is fed back. The outputs may be
any function of the states (a threshold read-out of a reset-free LIF). Such maps compose
(associatively), so T can be split into chunks that run at once, each from the states the composed
maps of the chunks before it give (:mod:`flexsn_dsl.scan_templates`); everything else runs step by
step in one loop over T.

``A`` is a K x K matrix over the K states (coupled linear states: CUBA LI's v integrates its
current i of the same step); :attr:`Affine.pattern` lists the entries of ``A`` and of any
product of such matrices that can be nonzero, plus the diagonal (the identity map).
"""
from __future__ import annotations

from dataclasses import dataclass

import sympy

from .expressions import MAX_CONDITION_NODES, TooManyCases, _unfold
from .ir import StepIR
from .symbolic import Detach, language_text

TIME_PARALLEL = "time-parallel"
MAX_REASON = 60  # characters of the expression a reason quotes
# the operations of the coefficients (A and b, with the step's state-free lines substituted into them), which
# composing chunks of steps computes at every step: past MAX_COEFFICIENT_OPS and MAX_SUBSTITUTION_GROWTH times
# those of the step's own lines, the step runs sequentially (an exact pair of coupled states with learnable rates:
# 15,212 against 579, where each line is used many times; the zoo's and triangular propagators': about 1 time;
# nested clips of state-free values: 382, 9 times)
MAX_COEFFICIENT_OPS = 1_000
MAX_SUBSTITUTION_GROWTH = 4


@dataclass(frozen=True)
class Affine:
    """The step as ``s_t = A s_{t-1} + b``: ``matrix[i][j]`` is the coefficient of previous state j
    in next state i, ``offset[i]`` the rest; both in the step's inputs and runtime parameters."""

    matrix: tuple[tuple[sympy.Expr, ...], ...]
    offset: tuple[sympy.Expr, ...]
    pattern: tuple[tuple[int, int], ...]  # (i, j) entries that can be nonzero in a product of As, and the diagonal


@dataclass(frozen=True)
class _Form:
    """An expression as ``sum coeffs[s] * s + const`` over the previous states (``coeffs`` free of
    states), or, when it is not affine in them, why (``reason``, with the states involved)."""

    coeffs: dict
    const: sympy.Expr
    reason: str = ""
    states: tuple[str, ...] = ()
    output: str = ""  # the output whose value this is, when that is why it is not affine

    @property
    def affine(self) -> bool:
        return not self.reason


def _nonlinear(expr: sympy.Expr, forms: dict, states: set) -> _Form:
    """``expr`` as the reason a form is not affine, with the states it depends on."""
    involved = set()
    for sym in expr.free_symbols:
        if sym in states:
            involved.add(sym.name)
        elif sym in forms:
            involved |= {s.name for s in forms[sym].coeffs} | set(forms[sym].states)
    text = language_text(expr)
    return _Form({}, sympy.S.Zero, text if len(text) <= MAX_REASON else text[:MAX_REASON - 3] + "...",
                 tuple(sorted(involved)))


def _scale(form: _Form, factor: sympy.Expr) -> _Form:
    return _Form({s: c * factor for s, c in form.coeffs.items()}, form.const * factor)


def _add(forms: list[_Form]) -> _Form:
    coeffs: dict = {}
    for f in forms:
        for s, c in f.coeffs.items():
            coeffs[s] = coeffs.get(s, sympy.S.Zero) + c
    return _Form(coeffs, sympy.Add(*[f.const for f in forms]))


class _Values(dict):
    """The state-free assignments' values in inputs and parameters, and :meth:`put` to substitute them.

    ``budget`` is a one-item list of the condition terms the substitutions may still expand into (see
    :func:`flexsn_dsl.expressions._unfold`), shared by the whole analysis."""

    def __init__(self):
        super().__init__()
        self.budget = [MAX_CONDITION_NODES]

    def put(self, expr: sympy.Basic) -> sympy.Basic:
        """``expr.xreplace(self)``, with each condition that the substitution puts a Piecewise into unfolded
        (:func:`~flexsn_dsl.expressions._unfold`) before a Piecewise is built on it. Left to sympy, the
        Piecewise would fold such a condition (``piecewise_fold``, then ``rewrite(ITE)`` through sets), at a
        cost exponential in its comparisons: seconds for ``w: clip(v * -1.5, 0, 1)`` after
        ``h: clip(max(max(x, 0.5), x), c, 1)``, ``v: tanh(h) * (1 - spike(h))``. Raises TooManyCases when the
        unfolded conditions would exceed the budget."""
        memo: dict = {}

        def sub(e):
            if e in self:
                return self[e]
            if not e.args or not e.free_symbols & self.keys():
                return e
            if e not in memo:
                if isinstance(e, sympy.Piecewise):
                    memo[e] = sympy.Piecewise(*[(sub(x), _unfold(sub(c), self.budget, {})) for x, c in e.args])
                else:
                    args = [sub(a) for a in e.args]
                    memo[e] = e.func(*args) if any(a is not b for a, b in zip(args, e.args)) else e
            return memo[e]
        return sub(expr)


def _form(expr: sympy.Expr, forms: dict, states: set, values: _Values) -> _Form:
    """``expr``'s affine form over ``states``; ``forms``: those of the assignments before it, ``values``:
    their values in inputs and parameters (for the state-free parts)."""
    dependent = {s for s in expr.free_symbols
                 if s in states or (s in forms and (forms[s].coeffs or not forms[s].affine))}
    if not dependent:
        return _Form({}, values.put(expr))
    if expr in states:
        return _Form({expr: sympy.S.One}, sympy.S.Zero)
    if expr in forms:
        return forms[expr]
    if isinstance(expr, sympy.Add):
        parts = [_form(a, forms, states, values) for a in expr.args]
        bad = next((p for p in parts if not p.affine), None)
        return bad or _add(parts)
    if isinstance(expr, sympy.Mul):
        parts = [_form(a, forms, states, values) for a in expr.args]
        bad = next((p for p in parts if not p.affine), None)
        if bad:
            return bad
        varying = [p for p in parts if p.coeffs]
        if len(varying) > 1:
            return _nonlinear(expr, forms, states)
        factor = sympy.Mul(*[p.const for p in parts if not p.coeffs])
        return _scale(varying[0], factor)
    if isinstance(expr, Detach):  # the forward value passes; the backward core knows the gradient
        return _form(expr.args[0], forms, states, values)
    if isinstance(expr, sympy.Piecewise):
        decided = next((c for _, c in expr.args if c.free_symbols & dependent), None)
        if decided is not None:  # a condition on a state
            return _nonlinear(decided, forms, states)
        parts = [_form(e, forms, states, values) for e, _ in expr.args]
        bad = next((p for p in parts if not p.affine), None)
        if bad:
            return bad
        conds = [_unfold(values.put(c), values.budget, {}) for _, c in expr.args]
        keys = {s for p in parts for s in p.coeffs}
        pick = lambda pieces: sympy.Piecewise(*zip(pieces, conds))  # noqa: E731
        return _Form({s: pick([p.coeffs.get(s, sympy.S.Zero) for p in parts]) for s in keys},
                     pick([p.const for p in parts]))
    # a power, a function, spike(), a condition on a state: not affine; the deepest such node says why
    for arg in expr.args:
        if isinstance(arg, sympy.Expr):
            inner = _form(arg, forms, states, values)
            if not inner.affine:
                return inner
    return _nonlinear(expr, forms, states)


def analyse(ir: StepIR) -> Affine | str:
    """The step's affine form, or why it runs sequentially (``"sequential: s feeds back into v"``)."""
    if not ir.states:
        return "sequential: no states"
    if ir.recurrent:
        fed = ", ".join(s.name for s in ir.recurrent)
        return f"sequential: {fed} feeds back through a recurrent input"
    states = set(ir.states)
    outputs = {sym: name for sym, name in zip(ir.outputs, ir.output_names)}
    forms: dict = {}
    values = _Values()
    try:
        return _analyse(ir, states, outputs, forms, values)
    except TooManyCases:
        return (f"sequential: the conditions of the step's state-free values expand into more than "
                f"{MAX_CONDITION_NODES} terms in the states' updates")


def _analyse(ir: StepIR, states: set, outputs: dict, forms: dict, values: _Values) -> Affine | str:
    for sym, expr in ir.assignments:
        form = _form(expr, forms, states, values)
        if not form.affine and not form.output and sym in outputs and sym not in ir.next_states:
            form = _Form({}, sympy.S.Zero, form.reason, form.states, outputs[sym])
        forms[sym] = form
        if form.affine and not form.coeffs:
            values[sym] = form.const
    matrix, offset = [], []
    for state, nxt in zip(ir.states, ir.next_states):
        form = _form(nxt, forms, states, values)
        if not form.affine:
            if form.output:
                return f"sequential: {form.output} feeds back into {state.name}"
            which = ", ".join(form.states) or "a state"
            verb = "enters" if len(form.states) <= 1 else "enter"
            return f"sequential: {which} {verb} {state.name}'s update nonlinearly ({form.reason})"
        matrix.append(tuple(form.coeffs.get(s, sympy.S.Zero) for s in ir.states))
        offset.append(form.const)
    ops = sum(sympy.count_ops(e) for e in (*offset, *(c for row in matrix for c in row)))
    own = max(sum(sympy.count_ops(e) for _, e in ir.assignments), 1)
    if ops > max(MAX_COEFFICIENT_OPS, MAX_SUBSTITUTION_GROWTH * own):
        return (f"sequential: the step's coefficients take {ops} operations once its lines are substituted into "
                f"them, {ops / own:.0f} times the {own} of its lines, which composing chunks of steps would compute "
                f"at every step")
    return Affine(tuple(matrix), tuple(offset), _closure([[c != 0 for c in row] for row in matrix]))


def verdict(ir: StepIR) -> str:
    """``"time-parallel"``, or why the step runs sequentially."""
    result = analyse(ir)
    return TIME_PARALLEL if isinstance(result, Affine) else result


def _closure(nonzero: list[list[bool]]) -> tuple[tuple[int, int], ...]:
    """The entries that can be nonzero in a product of matrices with this pattern, and the diagonal:
    a pattern closed under products (the composition of two maps stays within it)."""
    k = len(nonzero)
    reach = [[nonzero[i][j] or i == j for j in range(k)] for i in range(k)]
    for m in range(k):  # transitive closure (Warshall)
        for i in range(k):
            if reach[i][m]:
                for j in range(k):
                    reach[i][j] = reach[i][j] or reach[m][j]
    return tuple((i, j) for i in range(k) for j in range(k) if reach[i][j])
