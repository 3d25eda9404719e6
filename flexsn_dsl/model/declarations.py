"""Stage 2: the names a spec declares: its inputs, parameters (with their shapes) and states."""
from __future__ import annotations

import math
from dataclasses import replace

import sympy

from ..errors import SpecError
from ..expressions import closest
from ..source import Node
from ..symbolic import real_symbol
from .context import SpecContext
from .language import MODULE_ATTRIBUTES, REFRACTORY_STATE, SIZE_NAME, SPIKE_OUTPUT
from .neuron import Parameter, State
from .numbers import read_number, type_name


def read_inputs(spec: SpecContext) -> list[str]:
    """`inputs`, declared (default: the one input x)."""
    node = spec.get("inputs")
    if node is None:
        spec.declare("x", "input", spec.root.pos)
        spec.default_input = True
        return ["x"]
    spec.expect(node, "list", "`inputs`", "inputs: [x]")
    if not node.value:
        raise SpecError("`inputs` is empty", node.pos, "list at least one input, e.g. inputs: [x]")
    names = []
    for item in node.value:
        spec.expect(item, "scalar", "an input", "inputs: [x, y]")
        name = spec.identifier(item.value, item.pos, "input")
        spec.declare(name, "input", item.pos)
        names.append(name)
    return names


def read_parameters(spec: SpecContext) -> dict[str, Parameter]:
    """`parameters`: numbers, or {value, learnable, shape}; a shaped one's value may use scalar ones."""
    node = spec.get("parameters")
    if node is None or (node.kind == "scalar" and node.value is None):
        return {}
    spec.expect(node, "mapping", "`parameters`", "parameters: {tau: 2.0}")
    keys = ("value", "learnable", "shape")
    out, inits = {}, {}
    for name, value in node.value.items():
        pos = node.key_pos[name]
        spec.identifier(name, pos, "parameter")
        spec.declare(name, "parameter", pos)
        learnable, shape = False, None
        if value.kind == "mapping":
            for key in value.value:
                if key not in keys:
                    raise SpecError(f"unknown key {key!r} in parameter {name!r}", value.key_pos[key],
                                    closest(key, keys) or "a parameter takes `value`, `learnable` and `shape`")
            if "value" not in value.value:
                raise SpecError(f"parameter {name!r} has no `value`", value.pos, f"write {name}: {{value: 1.0}}")
            if "learnable" in value.value:
                flag = value.value["learnable"]
                if not isinstance(flag.value, bool):
                    raise SpecError(f"`learnable` of parameter {name!r} must be true or false, not {flag.value!r}",
                                    flag.pos, "write learnable: true")
                learnable = flag.value
            if "shape" in value.value:
                shape = _shape(value.value["shape"], name)
                inits[name] = value.value["value"]  # a number or an expression of scalar parameters
                number = math.nan  # evaluated below, once every scalar parameter is known
            else:
                number = read_number(value.value["value"], f"the value of parameter {name!r}")
        else:
            number = read_number(value, f"parameter {name!r}")
        if name in MODULE_ATTRIBUTES:
            raise SpecError(f"parameter {name!r} clashes with the attribute `{name}` of the module "
                            "(a FlexSN, an nn.Module)", pos,
                            "rename the parameter: every parameter becomes an attribute of the module "
                            "(learnable ones as nn.Parameters, the others as buffers)")
        out[name] = Parameter(name, number, learnable, pos, shape)
    scalars = {n: p.value for n, p in out.items() if not p.shaped}
    env = {n: real_symbol(n) for n in scalars}
    forbidden = {n: (f"the value of a shaped parameter cannot use the shaped parameter {n!r}",
                     "use numbers and scalar parameters") for n in out if n not in scalars}
    for name, value in inits.items():
        what = f"the value of parameter {name!r}"
        if value.kind == "scalar" and isinstance(value.value, (int, float)) and not isinstance(value.value, bool):
            init = sympy.Float(read_number(value, what))
        else:
            init = spec.expression(value, env, what, initial=True, forbidden=forbidden)
        param = replace(out[name], init=init)
        number = param.initial_value(scalars)
        if number is None:
            raise SpecError(f"{what} ({init}) is not a finite real number", value.pos,
                            "a division by zero, or log/sqrt of a number <= 0: change the expression")
        out[name] = replace(param, value=number)
    return out


def _shape(node: Node, name: str) -> tuple[int | str, ...]:
    example = f"{name}: {{value: 1.0, shape: [C, 1, 1]}}"
    if node.kind != "list" or not node.value:
        raise SpecError(f"the `shape` of parameter {name!r} must be a non-empty list of sizes", node.pos,
                        f"write it like: {example}")
    shape: list[int | str] = []
    for item in node.value:
        size = item.value
        if item.kind == "scalar" and isinstance(size, int) and not isinstance(size, bool) and 1 <= size <= 2 ** 31:
            shape.append(size)
        elif item.kind == "scalar" and isinstance(size, str) and SIZE_NAME.fullmatch(size) and size.isascii():
            shape.append(size)
        else:
            raise SpecError(f"a size in the `shape` of parameter {name!r} must be a positive whole number or a "
                            f"size name, not {type_name(item)} {size!r}", item.pos,
                            "write numbers and capitalised names given when loading, e.g. shape: [C, 1, 1] "
                            "with sizes={'C': 64}")
    return tuple(shape)


def read_states(spec: SpecContext, parameters: dict[str, Parameter]) -> dict[str, State]:
    """`states` with initial values of parameters; with `refractory`, its step counter too."""
    node = spec.root.value["states"]
    spec.expect(node, "mapping", "`states`", "states: {v: 0.0}")
    if not node.value:
        raise SpecError("`states` is empty", node.pos, "declare at least one state, e.g. v: 0.0")
    env = {p: real_symbol(p) for p in parameters}
    spec.state_names = [n for n in node.value if n not in parameters]
    out = {}
    for name, value in node.value.items():
        pos = node.key_pos[name]
        spec.identifier(name, pos, "state")
        spec.declare(name, "state", pos)
        if value.kind == "mapping":
            for key in value.value:
                if key != "init":
                    raise SpecError(f"unknown key {key!r} in state {name!r}", value.key_pos[key],
                                    "a state takes `init` (a number or an expression of parameters)")
            if "init" not in value.value:
                raise SpecError(f"state {name!r} has no `init`", value.pos, f"write {name}: {{init: 0.0}}")
            value = value.value["init"]
        init = spec.expression(value, env, f"initial value of state {name!r}", initial=True)
        out[name] = State(name, init, pos)
    top = spec.root.value
    if "equations" in top and "threshold" in top and SPIKE_OUTPUT in spec.declared:
        kind, pos = spec.declared[SPIKE_OUTPUT]
        raise SpecError(f"the {kind} {SPIKE_OUTPUT!r} has the name of the spike output of `threshold`", pos,
                        f"rename the {kind}: with `threshold`, {SPIKE_OUTPUT!r} is the spike output")
    if "equations" in top and "refractory" in top:
        if REFRACTORY_STATE in spec.declared:
            kind, pos = spec.declared[REFRACTORY_STATE]
            raise SpecError(f"`refractory` adds a state named {REFRACTORY_STATE!r} (the steps left), and the "
                            f"{kind} {REFRACTORY_STATE!r} has that name", pos, f"rename the {kind}")
        pos = spec.key_pos("refractory")
        spec.declare(REFRACTORY_STATE, "state", pos)
        out[REFRACTORY_STATE] = State(REFRACTORY_STATE, sympy.Integer(0), pos)
    return out
