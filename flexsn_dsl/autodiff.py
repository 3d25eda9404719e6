"""Reverse-mode differentiation of one step, and the choice of what the forward saves.

The backward of a step is itself a straight-line program: it recomputes the
forward values it needs from a small *saved* set, then runs the adjoints of the
assignments in reverse. The saved set is the set of per-step values with the least
memory traffic (ties broken by the least recomputation) from which every value
the adjoints read can be recomputed; for LIF that is one tensor, ``h``. Spike arguments are
values too (:func:`name_spike_arguments`): the adaptive LIF's backward needs
only ``h - b_dec``, one tensor where ``h`` and ``b_dec`` would be two.
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass, replace

import sympy

from .ir import StepIR
from .plugins import X
from .symbolic import Spike, real_symbol, substitute_surrogate

MAX_SUBSETS = 50_000


@dataclass(frozen=True)
class Backward:
    saved: tuple[sympy.Symbol, ...]                          # per-step values the forward stores
    seeds: tuple[sympy.Symbol, ...]                          # upstream gradients: outputs, then next states
    recompute: tuple[tuple[sympy.Symbol, sympy.Expr], ...]   # forward lines rerun in the backward
    adjoints: tuple[tuple[sympy.Symbol, sympy.Expr], ...]    # gradient lines, in order
    results: tuple[sympy.Expr, ...]                          # d/d inputs, d/d previous states, d/d params


def output_seed(name: str) -> sympy.Symbol:
    return real_symbol(f"grad_out__{name}")  # "grad_" + "out": no adjoint name grad__<value> can equal it


def state_seed(name: str) -> sympy.Symbol:
    return real_symbol(f"grad_next__{name}")


def _grad(sym: sympy.Symbol) -> sympy.Symbol:
    return real_symbol(f"grad__{sym.name}")


def name_spike_arguments(ir: StepIR) -> StepIR:
    """Give every compound ``spike()`` argument its own line (``s = spike(h - b)`` becomes
    ``s__u = h - b; s = spike(s__u)``), so that the saved set may hold it."""
    assignments, positions = [], []
    for k, (sym, expr) in enumerate(ir.assignments):
        calls = sorted((c for c in expr.atoms(Spike) if not c.args[0].is_Symbol), key=sympy.default_sort_key)
        mapping = {}
        for i, call in enumerate(calls):
            arg = real_symbol(f"{sym.name}__u" + (str(i + 1) if len(calls) > 1 else ""))
            assignments.append((arg, call.args[0]))
            positions.append(ir.positions[k] if ir.positions else None)
            mapping[call] = Spike(arg)
        assignments.append((sym, expr.xreplace(mapping) if mapping else expr))
        positions.append(ir.positions[k] if ir.positions else None)
    return replace(ir, assignments=tuple(assignments), positions=tuple(positions))


def differentiate(ir: StepIR) -> Backward:
    """Symbolic reverse mode through one step of ``ir``."""
    seeds = tuple(output_seed(n) for n in ir.output_names) + tuple(state_seed(s.name) for s in ir.states)
    adjoint: dict[sympy.Symbol, list[sympy.Expr]] = {}
    for seed, target in zip(seeds, ir.outputs + ir.next_states):
        adjoint.setdefault(target, []).append(seed)
    wrt = set(ir.inputs) | set(ir.states) | set(ir.params) | {s for s, _ in ir.assignments}
    lines: list[tuple[sympy.Symbol, sympy.Expr]] = []
    for sym, expr in reversed(ir.assignments):
        total = sympy.Add(*adjoint.pop(sym, []))
        if total == 0:
            continue
        if isinstance(total, (sympy.Symbol, sympy.Number)):
            g = total
        else:
            g = _grad(sym)
            lines.append((g, total))
        for dep in sorted(expr.free_symbols & wrt, key=lambda s: s.name):
            d = sympy.diff(expr, dep)
            if d != 0:
                adjoint.setdefault(dep, []).append(g * d)
    results = tuple(sympy.Add(*adjoint.get(s, [])) for s in ir.inputs + ir.states + ir.params)
    lines = [(s, substitute_surrogate(e, ir.surrogate, X)) for s, e in lines]
    results = tuple(substitute_surrogate(e, ir.surrogate, X) for e in results)
    lines = _prune(lines, results)
    saved, recompute = _choose_saved(ir, lines, results)
    return Backward(saved, seeds, recompute, tuple(lines), results)


def _prune(lines, results):
    """Drop gradient lines nothing reads."""
    live = set().union(*(r.free_symbols for r in results)) if results else set()
    kept = []
    for sym, expr in reversed(lines):
        if sym in live:
            kept.append((sym, expr))
            live |= expr.free_symbols
    return list(reversed(kept))


def _cost(expr: sympy.Expr) -> int:
    return sympy.count_ops(expr, visual=False) + 1


def _choose_saved(ir: StepIR, lines, results):
    forward = dict(ir.assignments)
    order = [s for s, _ in ir.assignments]
    leaves = set(ir.inputs) | set(ir.states)
    params = set(ir.params)
    needed = set().union(*(e.free_symbols for _, e in lines), *(r.free_symbols for r in results))
    needed &= leaves | set(forward)

    # Everything a needed value transitively depends on is a candidate for saving.
    candidates, frontier = set(), set(needed)
    while frontier:
        sym = frontier.pop()
        if sym in candidates:
            continue
        candidates.add(sym)
        if sym in forward:
            frontier |= (forward[sym].free_symbols - params)
    ranked = [s for s in list(ir.inputs) + list(ir.states) + order if s in candidates]

    def plan(saved: set):
        available = set(saved) | params
        for sym in order:
            if sym not in available and forward[sym].free_symbols - available == set():
                available.add(sym)
        if not needed <= available:
            return None
        rerun, want = [], set(needed)
        for sym in reversed(order):
            if sym in want and sym not in saved:
                rerun.append(sym)
                want |= forward[sym].free_symbols - params
        return sum(_cost(forward[s]) for s in rerun), list(reversed(rerun))

    # Least memory traffic first: a value the forward must store costs a write and a read; an input or
    # output is in memory anyway and costs only the read. Then the least recomputation.
    in_memory = set(ir.inputs) | set(ir.outputs)
    tried, best = 0, None
    for size in range(len(ranked) + 1):
        if best is not None and size > best[0][0]:  # a set this large moves at least `size` tensors
            break
        for subset in itertools.combinations(ranked, size):
            tried += 1
            if tried > MAX_SUBSETS:
                break
            result = plan(set(subset))
            if result is not None:
                score = (sum(1 if s in in_memory else 2 for s in subset), result[0])
                if best is None or score < best[0]:
                    best = (score, subset, result[1])
        if tried > MAX_SUBSETS:
            break
    if best is not None:
        _, subset, rerun = best
        return tuple(subset), tuple((s, forward[s]) for s in rerun)
    saved = tuple(s for s in ranked if s in needed)
    return saved, ()
