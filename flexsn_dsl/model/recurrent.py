"""Stage 2: the `recurrent` section: per-step inputs fed back from a step name, state or output."""
from __future__ import annotations

import sympy

from ..errors import SpecError
from ..expressions import closest
from ..source import Node
from ..symbolic import real_symbol
from .context import SpecContext
from .language import SPIKE_OUTPUT
from .neuron import Assignment, Continuous, Recurrent


def read_recurrent_names(spec: SpecContext) -> dict[str, Node]:
    """The names `recurrent` declares (each a per-step value like an input) -> their `from` node."""
    node = spec.get("recurrent")
    if node is None:
        return {}
    spec.expect(node, "mapping", "`recurrent`", "recurrent: {r: {from: s}}")
    if not node.value:
        raise SpecError("`recurrent` is empty", node.pos, "write recurrent: {r: {from: s}}, or remove the key")
    out = {}
    for name, value in node.value.items():
        pos = node.key_pos[name]
        spec.identifier(name, pos, "recurrent input")
        spec.declare(name, "recurrent input", pos)
        for derived, what in ((f"{name}_weight", "its weight"), (f"{name}_prev", "its carried previous value")):
            if derived in spec.declared:
                kind, other = spec.declared[derived]
                raise SpecError(f"recurrent input {name!r} names {what} {derived!r}, which collides with the "
                                f"{kind} {derived!r} (line {other.line})", pos, "rename one of them")
        if value.kind != "mapping" or "from" not in value.value:
            raise SpecError(f"recurrent input {name!r} must say where it comes from", value.pos,
                            f"write {name}: {{from: s}} (s: the step name, state or output fed back)")
        for key in value.value:
            if key != "from":
                raise SpecError(f"unknown key {key!r} in recurrent input {name!r}", value.key_pos[key],
                                closest(key, ("from",)) or "a recurrent input takes only `from`")
        source = value.value["from"]
        spec.expect(source, "scalar", f"`from` of recurrent input {name!r}", f"{name}: {{from: s}}")
        out[name] = source
    return out


def read_recurrent(spec: SpecContext, nodes: dict[str, Node], steps: list[Assignment], continuous: Continuous | None,
                   next_states: dict[str, sympy.Symbol], env: dict[str, sympy.Expr],
                   outputs: list[tuple[str, sympy.Symbol]]) -> dict[str, Recurrent]:
    """Check each recurrent input's source (a step name, state or output) and that the spec uses it."""
    sources = {**{a.name: a.symbol for a in steps}, **next_states, **dict(outputs)}
    if continuous is not None and continuous.threshold is not None:
        sources.setdefault(SPIKE_OUTPUT, env[SPIKE_OUTPUT])
    lines = continuous.lines if continuous is not None else steps
    used = set().union(*(a.expr.free_symbols for a in lines)) if lines else set()
    where = "`equations`, `threshold` or `reset`" if continuous is not None else "`step`"
    out = {}
    for name, node in nodes.items():
        source = node.value
        if not isinstance(source, str) or source not in sources:
            hint = closest(str(source), sources)
            raise SpecError(f"recurrent input {name!r} comes from {source!r}, which is not a step name, state "
                            "or output", node.pos, hint or f"choose one of: {', '.join(sources)}")
        if real_symbol(name) not in used:
            raise SpecError(f"recurrent input {name!r} is used nowhere in {where}", spec.root.value["recurrent"]
                            .key_pos[name], f"use {name} like an input (e.g. h: v + (x + {name} - v) / tau), "
                            "or remove it")
        out[name] = Recurrent(name, source, sources[source], spec.root.value["recurrent"].key_pos[name])
    return out
