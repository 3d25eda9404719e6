"""Stage 2: what a spec takes from plugins: its `surrogate` gradient and its code-generation `passes`."""
from __future__ import annotations

import sympy

from ..errors import SpecError
from ..expressions import closest
from ..plugins import Surrogate
from ..source import Node
from ..symbolic import real_symbol
from .context import SpecContext
from .language import DEFAULT_SURROGATE
from .numbers import finite_with, read_number, type_name


def read_surrogate(spec: SpecContext) -> tuple[Surrogate, dict[str, float]]:
    """`surrogate` (a name, or a mapping with `name`) -> the plugin's surrogate and its parameter values."""
    node = spec.get("surrogate")
    params: dict[str, Node] = {}
    if node is None:
        name, pos = DEFAULT_SURROGATE, spec.root.pos
    elif node.kind == "scalar" and isinstance(node.value, str):
        name, pos = node.value, node.pos
    elif node.kind == "mapping":
        if "name" not in node.value:
            raise SpecError("`surrogate` has no `name`", node.pos, "write surrogate: {name: sigmoid, alpha: 4.0}")
        name_node = node.value["name"]
        if name_node.kind != "scalar" or not isinstance(name_node.value, str):
            raise SpecError("the surrogate's `name` must be a name", name_node.pos, "write name: sigmoid")
        name, pos = name_node.value, name_node.pos
        params = {k: v for k, v in node.value.items() if k != "name"}
    else:
        raise SpecError(f"`surrogate` must be a name or a mapping, not {type_name(node)}", node.pos,
                        "write surrogate: atan   or   surrogate: {name: atan, alpha: 2.0}")
    surrogate = spec.plugins.surrogate(name)
    if surrogate is None:
        hint = closest(name, spec.plugins.surrogates)
        raise SpecError(f"unknown surrogate {name!r}{spec.plugins.broken()}", pos,
                        hint or f"surrogates: {', '.join(sorted(spec.plugins.surrogates))}")
    values = dict(surrogate.params)
    for key, value in params.items():
        if key not in surrogate.params:
            hint = closest(key, surrogate.params)
            known = ", ".join(surrogate.params) or "none"
            raise SpecError(f"surrogate {name!r} has no parameter {key!r}", node.key_pos[key],
                            hint or f"its parameters: {known}")
        values[key] = read_number(value, f"surrogate parameter {key!r}")
    if params and not finite_with(surrogate.gradient, {real_symbol(k): sympy.Float(v) for k, v in values.items()}):
        defaults = {real_symbol(k): sympy.Float(v) for k, v in surrogate.params.items()}
        culprit = next((k for k in params if not finite_with(
            surrogate.gradient, {**defaults, real_symbol(k): sympy.Float(values[k])})), None)
        where = params[culprit].pos if culprit else node.pos
        shown = ", ".join(f"{k}={v:g}" for k, v in values.items())
        raise SpecError(f"surrogate {name!r} with {shown} has a gradient that is not a finite real number "
                        f"(g(x) = {surrogate.gradient})", where,
                        "choose other parameter values (a division by zero or a negative root here)")
    return surrogate, values


def read_passes(spec: SpecContext) -> list[str]:
    """`passes`: names of registered code-generation passes."""
    node = spec.get("passes")
    if node is None:
        return []
    spec.expect(node, "list", "`passes`", "passes: [safe_exp]")
    names = []
    for item in node.value:
        if item.kind != "scalar" or not isinstance(item.value, str):
            raise SpecError("a pass must be a name", item.pos, "passes: [safe_exp]")
        if item.value not in spec.plugins.passes:
            hint = closest(item.value, spec.plugins.passes)
            known = ", ".join(sorted(spec.plugins.passes)) or "none registered"
            raise SpecError(f"unknown code-generation pass {item.value!r}{spec.plugins.broken()}", item.pos,
                            hint or f"passes: {known}")
        names.append(item.value)
    return names
