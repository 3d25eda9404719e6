"""Synapse specs (``kind: synapse``): a weight matrix that learns from pre- and postsynaptic spikes.

The stage beside the neuron's model (:mod:`flexsn_dsl.model`): YAML nodes -> a validated
:class:`SynapseModel` whose lines are sympy expressions, every mistake a :class:`SpecError` at
file:line:col. Parameters and ``dt`` are numbers folded into the expressions; traces, ``w`` and
the inputs stay symbols. See docs/synapses.md.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

import sympy

from .errors import SourcePos, SpecError
from .expressions import closest
from .model.context import SpecContext
from .model.numbers import read_number, type_name
from .source import Node, parse_yaml, read_spec
from .symbolic import Detach, Spike, real_symbol

KIND = "synapse"
WEIGHT = "w"
SIDES = ("pre", "post")
BLOCKS = {"on_pre": "pre", "on_post": "post"}
TOP_LEVEL_KEYS = ("kind", "name", "description", "params", "dt", "inputs", "pre", "post", "on_pre", "on_post")
TRACE_KEYS = ("decay",)
MAX_LINES = 200
_W_HINT = "`w` changes only in the lines of `on_pre` or `on_post`, e.g. on_pre: [{w: clip(w + apost, 0, w_max)}]"


@dataclass(frozen=True)
class Trace:
    """A trace kept per neuron of one side (``pre`` or ``post``): multiplied by ``decay`` every step."""

    name: str
    side: str
    decay: float
    pos: SourcePos


@dataclass(frozen=True)
class Line:
    """One line of ``on_pre`` or ``on_post``: ``target`` (``w`` or a trace) takes the value of ``expr``."""

    target: str
    expr: sympy.Expr
    pos: SourcePos


@dataclass
class SynapseModel:
    """A validated synapse spec."""

    name: str
    description: str
    file: str
    text: str
    params: dict[str, float]
    dt: float
    inputs: list[str]
    pre: dict[str, Trace]
    post: dict[str, Trace]
    on_pre: list[Line]
    on_post: list[Line]
    key_pos: dict[str, SourcePos] = field(default_factory=dict)

    @property
    def traces(self) -> dict[str, Trace]:
        return {**self.pre, **self.post}


def is_synapse(root: Node) -> bool:
    """Whether a parsed spec says ``kind: synapse``."""
    kind = root.value.get("kind") if root.kind == "mapping" else None
    return kind is not None and kind.value == KIND


def synapse_text(text: str, file: str) -> bool:
    """Whether spec text is a synapse spec (False for text that does not parse: the neuron's reader says why)."""
    try:
        return is_synapse(parse_yaml(text, file))
    except SpecError:
        return False


class _Reader(SpecContext):
    """Reads a synapse spec's sections in order: name, params and dt, inputs, traces, then the lines."""

    def read(self) -> SynapseModel:
        top = self.root.value
        for key in top:
            if key == WEIGHT:
                raise SpecError("a `w` line outside `on_pre`/`on_post`", self.key_pos(key), _W_HINT)
            if key not in TOP_LEVEL_KEYS:
                raise SpecError(f"unknown key {key!r} in a synapse spec", self.key_pos(key),
                                closest(key, TOP_LEVEL_KEYS) or f"the keys are: {', '.join(TOP_LEVEL_KEYS)}")
        if "name" not in top:
            raise SpecError("missing required key 'name'", self.root.pos, "add `name: stdp` (an identifier)")
        name_node = top["name"]
        self.expect(name_node, "scalar", "`name`", "name: stdp")
        name = self.identifier(name_node.value, name_node.pos, "synapse", allow_keyword=True)
        description = self.description()
        self.declare(WEIGHT, "weight", self.root.pos)
        params = self._params()
        dt = read_number(top["dt"], "`dt`") if "dt" in top else 1.0
        if dt <= 0:
            raise SpecError(f"`dt` must be positive, got {dt:g}", top["dt"].pos, "write dt: 1.0e-3 (seconds, say)")
        if "dt" in params:
            raise SpecError("`dt` is given as a parameter", self.params_pos["dt"], "write it as the top-level key dt")
        self.numbers = {**{n: sympy.Float(v) for n, v in params.items()}, "dt": sympy.Float(dt)}
        inputs = self._inputs()
        pre, post = (self._traces(side) for side in SIDES)
        if not pre and not post and "on_pre" not in top and "on_post" not in top:
            raise SpecError("a synapse spec needs `on_pre` or `on_post` lines", self.root.pos,
                            "add on_pre: [{w: w + 0.01}] (see docs/synapses.md)")
        env = {**self.numbers, **{n: real_symbol(n) for n in [WEIGHT, *inputs, *pre, *post]}}
        blocks = {block: self._lines(block, env, pre, post) for block in BLOCKS}
        return SynapseModel(name, description, self.file, self.text, params, dt, inputs, pre, post,
                            blocks["on_pre"], blocks["on_post"], {k: self.key_pos(k) for k in top})

    def _params(self) -> dict[str, float]:
        node = self.get("params")
        self.params_pos: dict[str, SourcePos] = {}
        if node is None or (node.kind == "scalar" and node.value is None):
            return {}
        self.expect(node, "mapping", "`params`", "params: {tau_pre: 20.0e-3}")
        out = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            if name == WEIGHT:
                raise SpecError("`w` is the weight, not a parameter", pos, _W_HINT)
            self.identifier(name, pos, "parameter")
            if name != "dt":
                self.declare(name, "parameter", pos)
            out[name] = read_number(value, f"parameter {name!r}")
            self.params_pos[name] = pos
        return out

    def _inputs(self) -> list[str]:
        node = self.get("inputs")
        if node is None:
            return []
        self.expect(node, "list", "`inputs`", "inputs: [reward]")
        names = []
        for item in node.value:
            self.expect(item, "scalar", "an input", "inputs: [reward]")
            name = self._name(item.value, item.pos, "input")
            self.declare(name, "input", item.pos)
            names.append(name)
        return names

    def _name(self, name: object, pos: SourcePos, kind: str) -> str:
        if name == WEIGHT:
            raise SpecError(f"`w` is the weight, not a{'n' if kind == 'input' else ''} {kind}", pos, _W_HINT)
        if name == "dt":
            raise SpecError(f"`dt` is the time step, not a{'n' if kind == 'input' else ''} {kind}", pos,
                            "choose another name")
        return self.identifier(name, pos, kind)

    def _traces(self, side: str) -> dict[str, Trace]:
        node = self.get(side)
        if node is None or (node.kind == "scalar" and node.value is None):
            return {}
        self.expect(node, "mapping", f"`{side}`", f"{side}: {{a{side}: {{decay: exp(-dt / tau_{side})}}}}")
        out = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            if name == WEIGHT:
                raise SpecError(f"a `w` line outside `on_pre`/`on_post` (in `{side}`, which holds traces)", pos,
                                _W_HINT)
            self._name(name, pos, f"{side} trace")
            self.declare(name, f"{side} trace", pos)
            if value.kind != "mapping":
                raise SpecError(f"{side} trace {name!r} must be a mapping with `decay`, not {type_name(value)}",
                                value.pos, f"write {name}: {{decay: exp(-dt / tau)}}")
            for key in value.value:
                if key not in TRACE_KEYS:
                    raise SpecError(f"unknown key {key!r} in {side} trace {name!r}", value.key_pos[key],
                                    closest(key, TRACE_KEYS) or "a trace takes `decay` (the factor of every step)")
            if "decay" not in value.value:
                raise SpecError(f"{side} trace {name!r} has no `decay`", value.pos,
                                f"write {name}: {{decay: exp(-dt / tau)}}")
            forbidden = {n: (f"a decay may use params and dt only, not the {kind} {n!r}",
                             "write the decay of one step from numbers, params and dt, e.g. exp(-dt / tau)")
                         for n, (kind, _) in self.declared.items() if kind != "parameter"}
            expr = self.expression(value.value["decay"], self.numbers, f"the decay of {name!r}", forbidden=forbidden,
                                   draws=False)
            decay = float(expr)
            out[name] = Trace(name, side, decay, pos)
        return out

    def _lines(self, block: str, env: Mapping[str, sympy.Expr], pre: dict[str, Trace],
               post: dict[str, Trace]) -> list[Line]:
        node = self.get(block)
        if node is None or (node.kind == "scalar" and node.value is None):
            return []
        side = BLOCKS[block]
        own, other = (pre, post) if side == "pre" else (post, pre)
        example = f"{block}:\n  - w: clip(w + 0.01, 0, 1)"
        self.expect(node, "list", f"`{block}`", example)
        if len(node.value) > MAX_LINES:
            raise SpecError(f"`{block}` has more than {MAX_LINES} lines", node.value[MAX_LINES].pos,
                            "a learning rule needs far fewer: check that this is the right file")
        lines = []
        for item in node.value:
            if item.kind != "mapping" or len(item.value) != 1:
                raise SpecError(f"each line of `{block}` is one `name: expression` mapping, not "
                                f"{type_name(item) if item.kind != 'mapping' else f'{len(item.value)} keys'}",
                                item.pos, f"write a list of lines, in order: {example}")
            (target, value), = item.value.items()
            pos = item.key_pos[target]
            if target in other:
                raise SpecError(f"the {'post' if side == 'pre' else 'pre'} trace {target!r} is assigned in `{block}` "
                                "(a trace assigned on the wrong side)", pos,
                                f"a {'post' if side == 'pre' else 'pre'}synaptic trace changes where its neuron "
                                f"spiked: move this line to `{'on_post' if side == 'pre' else 'on_pre'}`")
            if target != WEIGHT and target not in own:
                kind = self.declared.get(target, ("", None))[0]
                raise SpecError(f"cannot assign the {kind} {target!r}" if kind else f"unknown name {target!r}", pos,
                                f"a line of `{block}` assigns `w` or a {side} trace"
                                + (f" ({', '.join(own)})" if own else f" (declare it under `{side}:`)"))
            forbidden = {}
            if target != WEIGHT:  # a trace is one number per neuron: it may not read per-synapse values
                why = (f"the {side} trace {target!r} is one number per {side}synaptic neuron",
                       f"a {side} trace's line may use its side's traces, params, dt and inputs; "
                       "compute per-synapse values in `w` lines")
                forbidden = {n: (f"{why[0]}: its line may not use {'the weight w' if n == WEIGHT else repr(n)}",
                                 why[1]) for n in [WEIGHT, *other]}
            scope = {k: v for k, v in env.items() if k not in forbidden}
            expr = self.expression(value, scope, f"the {block} line of {target!r}", forbidden=forbidden, draws=False)
            if expr.has(Spike, Detach):
                raise SpecError(f"the {block} line of {target!r} may not use spike() or detach()", value.pos,
                                "lines run where a spike happened: use heaviside(), where() or comparisons")
            lines.append(Line(target, sympy.sympify(expr), pos))
        return lines


def build_synapse(text: str, file: str = "<string>", params: Mapping[str, float] | None = None) -> SynapseModel:
    """Parse and validate synapse spec text; ``params`` overrides values of ``params``."""
    lines = text.splitlines()
    try:
        root = parse_yaml(text, file)
        reader = _Reader(root, text, file, None)
        model = reader.read()
        if params:
            unknown = [k for k in params if k not in model.params]
            if unknown:
                raise SpecError(f"params: {unknown[0]!r} is not a parameter of synapse {model.name!r}",
                                model.key_pos.get("params"), closest(unknown[0], model.params)
                                or f"its parameters: {', '.join(model.params) or 'none'}")
            overridden = _override(root, params)
            model = _Reader(overridden, text, file, None).read()
    except SpecError as exc:
        raise exc.with_source(lines) from None
    return model


def _override(root: Node, params: Mapping[str, float]) -> Node:
    """``root`` with the numbers of ``params`` in place of those written under ``params``."""
    node = root.value["params"]
    values = {k: (Node(float(params[k]), v.pos) if k in params else v) for k, v in node.value.items()}
    return Node({**root.value, "params": Node(values, node.pos, node.key_pos)}, root.pos, root.key_pos)


def read_synapse(path: str | Path, params: Mapping[str, float] | None = None) -> SynapseModel:
    """Read (:func:`source.read_spec`) and validate a synapse spec file."""
    return build_synapse(read_spec(path), str(path), params)
