"""Reverse-mode differentiation of one step, and the choice of what the forward saves.

The backward of a step is itself a straight-line program: it recomputes the
forward values it needs from a small *saved* set, then runs the adjoints of the
assignments in reverse. The saved set is the set of per-step values with the least
memory traffic (ties broken by the least recomputation) from which every value
the adjoints read can be recomputed; for LIF that is one tensor, ``h``. Spike arguments are
values too (:func:`name_spike_arguments`): the adaptive LIF's backward needs
only ``h - b_dec``, one tensor where ``h`` and ``b_dec`` would be two. The choice is a
minimum vertex cut of the step's dependency graph (max-flow), polynomial in the step's size.
"""
from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, replace

import sympy
from sympy.logic.boolalg import BooleanFunction

from .ir import StepIR
from .plugins import X
from .symbolic import PowBaseGrad, PowExpGrad, Reciprocal, Spike, differentiable_powers, plain_powers, real_symbol, substitute_surrogate


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
        expr = differentiable_powers(expr)
        for dep in sorted(expr.free_symbols & wrt, key=lambda s: s.name):
            d = plain_powers(partial(expr, dep))
            if d != 0:
                adjoint.setdefault(dep, []).append(g * d)
    results = tuple(sympy.Add(*adjoint.get(s, [])) for s in ir.inputs + ir.states + ir.params)
    lines = [(s, substitute_surrogate(e, ir.surrogate, X)) for s, e in lines]
    results = tuple(substitute_surrogate(e, ir.surrogate, X) for e in results)
    lines = _prune(lines, results)
    saved, recompute = _choose_saved(ir, lines, results)
    return Backward(saved, seeds, recompute, tuple(lines), results)


def _decides(node: sympy.Basic) -> bool:
    """Whether ``node`` turns its arguments into a branch decision: a condition, spike(), the
    sign or step function of a derivative, a power with a symbolic exponent (signs, integrality)."""
    decisions = (sympy.Rel, BooleanFunction, Spike, sympy.Heaviside, sympy.sign, PowBaseGrad, PowExpGrad)
    return isinstance(node, decisions) or (isinstance(node, sympy.Pow) and not node.exp.is_number)


def _opaque(node: sympy.Basic) -> bool:
    """Whether the arguments of ``node`` are left as they are: those of decisions (:func:`_decides`)
    and of functions (exp(1 / tau) in the backward stays the forward's, one exp for both)."""
    return _decides(node) or (isinstance(node, sympy.Function) and not isinstance(node, sympy.Piecewise))


def _arithmetic(expr: sympy.Expr):
    """The nodes of ``expr`` outside the arguments of :func:`_opaque` nodes, each once per place it occurs."""
    stack = [expr]
    while stack:
        node = stack.pop()
        yield node
        if not _opaque(node):
            stack.extend(node.args)


def _outside(expr: sympy.Expr, mapping: dict) -> sympy.Expr:
    """``expr`` with the nodes in ``mapping`` replaced, except within the arguments of :func:`_opaque` nodes."""
    if expr in mapping:
        return mapping[expr]
    if _opaque(expr) or not expr.args:
        return expr
    args = [_outside(a, mapping) for a in expr.args]
    return expr.func(*args) if any(a is not b for a, b in zip(args, expr.args)) else expr


def share_reciprocals(backward: Backward) -> Backward:
    """``backward`` with each value that it divides by at more than one place (``x / a``,
    ``y / a ** 2``) inverted once, ``a__inv = 1 / a`` (``_inv<k>`` for a compound ``a``), and
    those divisions multiplications (``x * a__inv``, ``y * a__inv ** 2``): a division costs about
    ten instructions on a GPU, a multiplication one. The recomputed forward values then differ
    from the forward's by float rounding, except those that a branch decision of the backward
    (a condition, spike(), sign()) depends on, and the decisions themselves: these stay the very
    values the forward computed, so the backward takes the forward's branches."""
    recompute = dict(backward.recompute)
    exprs = list(recompute.values()) + [e for _, e in backward.adjoints] + list(backward.results)
    kept = {s for e in exprs for n in sympy.preorder_traversal(e) if _decides(n) for s in n.free_symbols}
    frontier = set(kept)
    while frontier:  # the recomputed values those decisions depend on
        frontier = {s for sym in frontier if sym in recompute for s in recompute[sym].free_symbols} - kept
        kept |= frontier
    rewritten = [e for s, e in backward.recompute if s not in kept] + exprs[len(recompute):]
    gradients = set(backward.seeds) | {s for s, _ in backward.adjoints}
    divisions = [node for expr in rewritten for node in _arithmetic(expr)
                 if isinstance(node, sympy.Pow) and node.exp.is_Integer and node.exp < 0 and
                 not node.base.is_number and not node.base.free_symbols & gradients]
    sites = Counter(node.base for node in divisions)
    shared = sorted((b for b, n in sites.items() if n > 1), key=lambda b: (sympy.count_ops(b), sympy.default_sort_key(b)))
    if not shared:
        return backward
    taken = {s.name for e in exprs for s in e.free_symbols} | set(map(str, recompute))
    inverse, compound = {}, 0
    for base in shared:
        if base.is_Symbol and f"{base.name}__inv" not in taken:
            inverse[base] = real_symbol(f"{base.name}__inv")
        else:
            compound += 1
            inverse[base] = real_symbol(f"_inv{compound}")
    mapping = {node: inverse[node.base] ** -node.exp for node in divisions if node.base in inverse}
    pending = {inverse[b]: Reciprocal(_outside(b, mapping)) for b in shared}
    lines: list[tuple[sympy.Symbol, sympy.Expr]] = []

    def define(used: set) -> None:
        """The pending reciprocals in ``used``, each after those its own definition uses."""
        for r in sorted(used & set(pending), key=lambda r: r.name):
            if r in pending:
                value = pending.pop(r)
                define(value.free_symbols)
                lines.append((r, value))
    for sym, expr in backward.recompute:  # each reciprocal just before the first line that uses it
        if sym not in kept:
            expr = _outside(expr, mapping)
            define(expr.free_symbols)
        lines.append((sym, expr))
    recomputed = len(lines)
    define(set(pending))
    adjoints = lines[recomputed:] + [(s, _outside(e, mapping)) for s, e in backward.adjoints]
    lines = lines[:recomputed]
    return replace(backward, recompute=tuple(lines), adjoints=tuple(adjoints),
                   results=tuple(_outside(r, mapping) for r in backward.results))


def partial(expr: sympy.Expr, sym: sympy.Symbol) -> sympy.Expr:
    """d expr / d sym: sympy's derivative, with the chain rule for sums, products, numeric
    powers and one-argument functions done here (sympy's ``diff`` builds a ``Derivative`` per
    node, most of a build's time; the results are the same expressions), and piecewise expressions
    differentiated branch by branch, their conditions left as they stand (the same values)."""
    if sym not in expr.free_symbols:
        return sympy.S.Zero
    if expr.is_Symbol:
        return sympy.S.One
    if isinstance(expr, sympy.Add):
        return sympy.Add(*[partial(a, sym) for a in expr.args])
    if isinstance(expr, sympy.Mul):
        args = expr.args
        terms = [sympy.Mul(*args[:i], d, *args[i + 1:]) for i, a in enumerate(args) if (d := partial(a, sym)) != 0]
        return sympy.Add(*terms)
    if isinstance(expr, sympy.Pow) and expr.exp.is_number:
        base, exp = expr.args
        return exp * base ** (exp - 1) * partial(base, sym)
    if isinstance(expr, sympy.Piecewise):  # each branch's derivative under its own condition, as sympy's, but
        # not evaluated: sympy's Piecewise rewrites the conditions into normal form, exponential in their size
        branches = [(partial(e, sym), c) for e, c in expr.args]
        same = all(d == branches[0][0] for d, _ in branches)
        return branches[0][0] if same else sympy.Piecewise(*branches, evaluate=False)
    if isinstance(expr, sympy.Function) and len(expr.args) == 1 and \
            type(expr)._eval_derivative is sympy.Function._eval_derivative:  # the plain chain rule
        return expr.fdiff(1) * partial(expr.args[0], sym)
    return sympy.diff(expr, sym)


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
    """The saved set and the forward lines the backward reruns from it, in polynomial time.

    Saving a set S works when every path in the step's dependency graph from an input or
    previous state to a value the backward reads passes through S: S is a vertex cut. Its
    price is memory traffic: a value the forward must store costs a write and a read; an input
    or output is in memory anyway and costs only the read. After node splitting
    (``v_in -> v_out`` carries v's price) the cheapest S is a minimum s-t cut, found by max-flow.
    Of all minimum cuts the one nearest the backward's needs leaves the fewest values (by
    inclusion) to recompute, so it also has the least recomputation, and no other minimum cut
    ties with it on both counts (every rerun line costs at least one).
    """
    forward = dict(ir.assignments)
    order = [s for s, _ in ir.assignments]
    leaves = set(ir.inputs) | set(ir.states)
    params = set(ir.params) | set(ir.fixed) | set(ir.draws)  # runtime values and draws: available, never saved
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

    index = {s: i for i, s in enumerate(ranked)}
    in_memory = set(ir.inputs) | set(ir.outputs)
    source, sink = 2 * len(ranked), 2 * len(ranked) + 1  # v_in = 2 i, v_out = 2 i + 1
    edges = []
    for i, sym in enumerate(ranked):
        edges.append((2 * i, 2 * i + 1, 1 if sym in in_memory else 2))
        if sym in forward:
            edges += [(2 * index[d] + 1, 2 * i, None) for d in forward[sym].free_symbols - params]
        else:
            edges.append((source, 2 * i, None))  # an input or previous state: it cannot be recomputed
        if sym in needed:
            edges.append((2 * i + 1, sink, None))
    near = _sink_side(2 * len(ranked) + 2, edges, source, sink)
    saved = {s for i, s in enumerate(ranked) if near[2 * i + 1] and not near[2 * i]}

    rerun, want = [], set(needed)
    for sym in reversed(order):
        if sym in want and sym not in saved:
            rerun.append(sym)
            want |= forward[sym].free_symbols - params
    return tuple(s for s in ranked if s in saved), tuple((s, forward[s]) for s in reversed(rerun))


def _sink_side(size: int, edges, source: int, sink: int) -> list[bool]:
    """The sink side of the minimum ``source``-``sink`` cut nearest the sink: the nodes that
    reach the sink in the residual graph of a maximum flow (Dinic's algorithm). ``edges`` are
    (tail, head, capacity), capacity None for unbounded."""
    unbounded = sum(c for _, _, c in edges if c is not None) + 1
    heads, caps, out = [], [], [[] for _ in range(size)]
    for u, v, c in edges:  # edge e and its reverse e ^ 1
        out[u].append(len(heads))
        heads.append(v)
        caps.append(unbounded if c is None else c)
        out[v].append(len(heads))
        heads.append(u)
        caps.append(0)
    while True:
        level = [-1] * size
        level[source] = 0
        queue = [source]
        for u in queue:
            for e in out[u]:
                if caps[e] > 0 and level[heads[e]] < 0:
                    level[heads[e]] = level[u] + 1
                    queue.append(heads[e])
        if level[sink] < 0:
            break
        nxt = [0] * size
        path, u = [], source
        while True:  # augment along shortest paths until none is left (a blocking flow)
            if u == sink:
                push = min(caps[e] for e in path)
                for e in path:
                    caps[e] -= push
                    caps[e ^ 1] += push
                path, u = [], source
                continue
            while nxt[u] < len(out[u]):
                e = out[u][nxt[u]]
                if caps[e] > 0 and level[heads[e]] == level[u] + 1:
                    path.append(e)
                    u = heads[e]
                    break
                nxt[u] += 1
            else:
                if u == source:
                    break
                level[u] = -1  # a dead end for the rest of this phase
                u = heads[path.pop() ^ 1]
                nxt[u] += 1
    near = [False] * size
    near[sink] = True
    queue = [sink]
    for v in queue:  # backwards along edges with capacity left
        for e in out[v]:
            u = heads[e]
            if caps[e ^ 1] > 0 and not near[u]:
                near[u] = True
                queue.append(u)
    return near
