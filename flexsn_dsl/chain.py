"""Stage 4b, before printing: the step's lines in the form the Triton cores print them, with a short chain of
dependent instructions from one step's states to the next's (forward), and from one step's state gradients
to the step before's (backward).

With few neurons and many steps a kernel waits on that chain at every step (batch-1 streaming), so the
cores are printed from an equivalent form of their lines; the IR itself, which
:mod:`flexsn_dsl.autodiff` differentiates (the surrogate gradient of a reset included), is unchanged.
A value is *on the chain* if it depends on the loop-carried values (the states, or the state gradients);
inputs, parameters, saved values and draws are not. Four rewrites, each giving the same values for finite
numbers, up to the rounding of a product's order or of a fused multiply-add:

- **a spike's comparison**: ``spike(a - b)``, ``a`` on the chain and ``b`` not, compares ``a >= b`` (one
  instruction, not a subtraction and a comparison);
- **products gated by a spike**: an expression ``e`` of a spike ``s`` (0 or 1) becomes
  ``where(s's comparison, e at s = 1, e at s = 0)`` where that is no more work (``h * (1 - s)`` is
  ``where(h >= 1, 0, h)``: a select after the comparison, not a subtraction and a multiplication);
- **one fused multiply-add on the chain**: ``c * x + r`` with ``x`` the only term on the chain becomes
  ``fma(x, c, r)``, so that the compiler cannot fuse another product instead;
- **one multiplication on the chain**: ``x * c1 * c2`` with only ``x`` on the chain multiplies ``x`` by the
  product of the others (or the reciprocal of a divisor), computed off the chain (a learnable ``v / tau``
  becomes ``v * (1 / tau)``).

Only infinities and signed zeros can tell the first two apart: ``h * (1 - s)`` is NaN for ``h = inf`` where
the select gives 0, and ``spike(a - b)`` is 0 for ``a = b = inf`` (NaN) where ``a >= b`` holds.
"""
from __future__ import annotations

from typing import Iterable

import sympy

from .symbolic import Detach, FusedMultiplyAdd, Scaled, Spike, SpikeAtLeast

Lines = list[tuple[sympy.Symbol, sympy.Expr]]


class ShortChain:
    """Rewrites straight-line lines, in order, for a short chain from ``roots`` (the loop-carried values);
    spikes seen in earlier lines gate the later ones."""

    def __init__(self, roots: Iterable[sympy.Symbol]):
        self.chain = set(roots)
        self.defined: dict[sympy.Symbol, sympy.Expr] = {}
        self.conditions: dict[sympy.Expr, sympy.Expr] = {}  # a spike (call, symbol or copy) -> where it is 1

    def lines(self, lines: Iterable[tuple[sympy.Symbol, sympy.Expr]]) -> Lines:
        """``lines`` rewritten; a spike's argument (a line of its own, :func:`autodiff.name_spike_arguments`)
        keeps its form, as the backward recomputes it."""
        lines = list(lines)
        arguments = {spike.args[0] for _, expr in lines for spike in expr.atoms(Spike)}
        out: Lines = []
        for sym, expr in lines:
            if expr.free_symbols & self.chain:
                self.chain.add(sym)
            self.defined[sym] = expr
            for spike in expr.atoms(Spike):
                u = spike.args[0]
                self.conditions.setdefault(spike, sympy.Ge(*(self._split(u) or (u, 0)), evaluate=False))
            value = expr.args[0] if isinstance(expr, Detach) else expr  # (detach: the identity, printed)
            if isinstance(value, Spike):
                cond = self.conditions[sym] = self.conditions[value]
                if cond.lhs != value.args[0]:
                    expr = SpikeAtLeast(cond.lhs, cond.rhs)
            elif value in self.conditions:  # a spike's copy (detach(s)) gates as the spike does
                self.conditions[sym] = self.conditions[value]
            elif sym not in arguments:
                expr = self.expr(expr)
            out.append((sym, expr))
        return out

    def expr(self, expr: sympy.Expr) -> sympy.Expr:
        """One expression rewritten (gated by the spikes seen so far, then fused)."""
        return self._fused(self._gated(expr))

    def _split(self, u: sympy.Expr) -> tuple[sympy.Symbol, sympy.Expr] | None:
        """``(a, b)`` where ``u`` is defined as ``a - b``, ``a`` a symbol on the chain and ``b`` a term off it:
        then ``u >= 0`` and ``a >= b`` agree (one rounding of a difference keeps its sign); else None."""
        definition = self.defined.get(u)
        if not isinstance(definition, sympy.Add) or len(definition.args) != 2:
            return None
        for a, other in (definition.args, definition.args[::-1]):
            if isinstance(a, sympy.Symbol) and a in self.chain and not other.free_symbols & self.chain:
                return a, -other
        return None

    def _gated(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` as a select on each spike it multiplies, where both sides together are no more work (and
        not both numbers: ``1 - s`` stays as it is)."""
        for gate, cond in self.conditions.items():
            if not expr.has(gate):
                continue
            sides = [expr.xreplace({Detach(gate): v}).xreplace({gate: v}) for v in (sympy.S.One, sympy.S.Zero)]
            if any(side.has(gate) for side in sides) or all(side.is_number for side in sides) or \
                    sum(sympy.count_ops(side) for side in sides) > sympy.count_ops(expr):
                continue
            on, off = (self._gated(side) for side in sides)
            return sympy.Piecewise((on, cond), (off, True))
        return expr

    def _fused(self, expr: sympy.Expr) -> sympy.Expr:
        """``expr`` with each sum of one chain term and terms off the chain as a fused multiply-add, and each
        product of one chain value and several factors off the chain, or a division by them, as one
        multiplication on it (what is off the chain is printed as it is)."""
        if not expr.args or not expr.free_symbols & self.chain:
            return expr
        if isinstance(expr, sympy.Rel):  # (a comparison's sides as the values they compare: min, max, clip)
            return expr.func(*(self._fused(a) for a in expr.args), evaluate=False)
        if isinstance(expr, sympy.Add):
            on_chain = [a for a in expr.args if a.free_symbols & self.chain]
            if len(on_chain) == 1:
                coefficient, value = self._factors(on_chain[0])
                if coefficient not in (1, -1):
                    rest = sympy.Add(*(a for a in expr.args if a is not on_chain[0]))
                    return FusedMultiplyAdd(self._fused(value), coefficient, rest)
        if isinstance(expr, sympy.Mul):
            coefficient, value = self._factors(expr)
            factors = [f for f in sympy.Mul.make_args(coefficient) if not (f.is_Number and abs(f) == 1)]
            if len(factors) > 1 or any(f.is_Pow and f.exp.is_negative for f in factors):
                return Scaled(self._fused(value), coefficient)
        return expr.func(*(self._fused(a) for a in expr.args))

    def _factors(self, term: sympy.Expr) -> tuple[sympy.Expr, sympy.Expr]:
        """``term`` as (the product of its factors off the chain, the product of those on it)."""
        return term.as_independent(*self.chain, as_Add=False) if isinstance(term, sympy.Mul) else (sympy.S.One, term)


def used(lines: Lines, kept: Iterable[sympy.Symbol]) -> Lines:
    """``lines`` without the assignments that no later line and no symbol of ``kept`` reads."""
    needed = set(kept)
    out: Lines = []
    for sym, expr in reversed(lines):
        if sym in needed:
            out.append((sym, expr))
            needed |= expr.free_symbols
    return out[::-1]
