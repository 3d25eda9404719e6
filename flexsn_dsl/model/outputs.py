"""Stage 2: the `outputs` section: what the neuron returns each step."""
from __future__ import annotations

import sympy

from ..errors import SpecError
from ..expressions import closest
from .context import SpecContext


def read_outputs(spec: SpecContext, env, default: list[str]) -> list[tuple[str, sympy.Symbol]]:
    """`outputs` (or ``default``) as (name, symbol) pairs."""
    node = spec.get("outputs")
    if node is None:
        if not default:
            raise SpecError("no outputs: no step line is `name: spike(...)`", spec.key_pos("step"),
                            "add `outputs: [name, ...]` listing what the neuron returns")
        return [(n, env[n]) for n in default]
    spec.expect(node, "list", "`outputs`", "outputs: [s]")
    if not node.value:
        raise SpecError("`outputs` is empty", node.pos, "list at least one name, e.g. outputs: [s]")
    out, seen = [], set()
    for item in node.value:
        if item.kind != "scalar" or not isinstance(item.value, str):
            raise SpecError("an output must be a name", item.pos, "outputs: [s, v]")
        name = item.value
        if name not in env:
            hint = closest(name, env)
            what = "the spike output s" if spec.root.value.get("threshold") else "names assigned in step"
            raise SpecError(f"output {name!r} is not an input, state or step name", item.pos,
                            hint or f"list {what}, states or inputs")
        if spec.declared.get(name, ("",))[0] == "parameter":
            raise SpecError(f"output {name!r} is a parameter, not an input, state or step name", item.pos,
                            f"assign it in step (e.g. {name}_out: {name}) and list that name")
        if name in seen:
            raise SpecError(f"output {name!r} is listed twice", item.pos, "list each output once")
        seen.add(name)
        out.append((name, env[name]))
    return out
