"""Stage 2: the `step` section: the lines of one discrete time step."""
from __future__ import annotations

import sympy

from ..errors import SpecError
from ..symbolic import Spike, real_symbol
from .context import SpecContext
from .language import MAX_STEP_LINES
from .neuron import Assignment


def read_steps(spec: SpecContext, inputs, parameters, states, recurrent=()):
    """`step` -> (its lines, next-state symbols, the names after the step, the names of spike lines)."""
    node = spec.root.value["step"]
    spec.expect(node, "mapping", "`step`", "step: {s: spike(v - 1.0)}")
    if not node.value:
        raise SpecError("`step` is empty", node.pos, "write at least one line, e.g. s: spike(v - 1.0)")
    if len(node.value) > MAX_STEP_LINES:
        name = list(node.value)[MAX_STEP_LINES]
        raise SpecError(f"`step` has {len(node.value)} lines, more than the limit of {MAX_STEP_LINES}",
                        node.key_pos[name], "a neuron needs far fewer: check that this is the right file")
    env: dict[str, sympy.Expr] = {n: real_symbol(n) for n in [*inputs, *recurrent, *parameters, *states]}
    later = {k: node.key_pos[k] for k in node.value if k not in states}
    steps, next_states, spike_names = [], {}, []
    for name, value in node.value.items():
        pos = node.key_pos[name]
        spec.identifier(name, pos, "step")
        kind = spec.declared.get(name, ("", None))[0]
        if kind in ("input", "parameter", "recurrent input"):
            raise SpecError(f"cannot assign the {kind} {name!r}", pos,
                            f"a step may assign states and new names; rename this line")
        expr = spec.expression(value, env, f"step {name!r}", later=later,
                               current=None if kind == "state" else name)
        later.pop(name, None)
        if kind == "state":
            symbol = real_symbol(f"{name}__next")
            next_states[name] = symbol
        else:
            symbol = real_symbol(name)
        if isinstance(expr, Spike):
            spike_names.append(name)
        steps.append(Assignment(name, symbol, expr, pos))
        env[name] = symbol
    for name in states:
        next_states.setdefault(name, real_symbol(name))
    return steps, next_states, env, spike_names
