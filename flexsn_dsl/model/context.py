"""Stage 2: a spec being read: its root node, the names declared so far, its warnings, and the checks
every section uses (kinds of nodes, identifiers, declarations, expressions)."""
from __future__ import annotations

import keyword

import sympy

from ..errors import SourcePos, SpecError, SpecWarning
from ..expressions import DSL_FUNCTIONS, MAX_CONDITION_NODES, ExpressionParser
from ..plugins import Plugins
from ..source import Node
from ..symbolic import Spike, is_white_noise_name
from .language import MAX_NAME, MAX_NEURON_NAME, MAX_SPEC_TERMS, RESERVED_NAMES
from .numbers import read_number, type_name


def _locator(node: Node):
    """Maps (line, col) of a scalar's text (1-based line, 0-based col) to the file."""
    lines = str(node.value).split("\n")

    def locate(line: int, col: int) -> SourcePos:
        line = min(max(line, 1), len(lines))
        return node.text_pos(sum(len(text) + 1 for text in lines[:line - 1]) + max(col, 0))
    return locate


def _reserved_hint(name: str) -> str:
    if name in DSL_FUNCTIONS:
        return f"{name!r} is a function of the language: choose another name, e.g. {name}_v"
    if name == "pi":
        return "'pi' is the constant 3.14159...: choose another name"
    if keyword.iskeyword(name):
        return f"{name!r} is a Python keyword, which the generated code cannot use: choose another name, e.g. {name}_"
    return f"{name!r} is used by the generated code: choose another name, e.g. {name}_"


class SpecContext:
    """A spec being read: its root node, what the sections read so far share (the names declared,
    the terms parsed, the warnings), and the checks every section makes."""

    def __init__(self, root: Node, text: str, file: str, plugins: Plugins):
        self.root = root
        self.text = text
        self.file = file
        self.plugins = plugins
        self.declared: dict[str, tuple[str, SourcePos]] = {}  # name -> (kind, pos)
        self.terms = 0  # syntax-tree nodes parsed so far, over all expressions
        self.condition_budget = [MAX_CONDITION_NODES]  # shared by all expressions of the spec
        self.default_input = False  # `inputs` not given: the input is x
        self.state_names: list[str] = []
        self.draws: list[sympy.Symbol] = []  # rand() and randn() of the whole spec, by occurrence
        self.generated: frozenset[str] = frozenset()  # the generated code's names for this neuron
        self.warnings: list[SpecWarning] = []

    def get(self, key: str) -> Node | None:
        return self.root.value.get(key)

    def key_pos(self, key: str) -> SourcePos:
        return self.root.key_pos.get(key, self.root.pos)

    def description(self) -> str:
        """The spec's optional `description` (text), stripped; "" without one."""
        node = self.get("description")
        if node is None:
            return ""
        if node.kind != "scalar" or not isinstance(node.value, str):
            raise SpecError("`description` must be text", node.pos, "write description: some text")
        return node.value.strip()

    def expect(self, node: Node, kind: str, what: str, example: str) -> None:
        if node.kind != kind or (kind == "scalar" and node.value is None):
            raise SpecError(f"{what} must be a {kind if kind != 'scalar' else 'value'}, not {type_name(node)}",
                            node.pos, f"write it like: {example}")

    def identifier(self, name: object, pos: SourcePos, kind: str, allow_keyword: bool = False) -> str:
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise SpecError(f"{kind} name {name!r} is not a valid identifier", pos,
                            "use letters, digits and single underscores, starting with a letter")
        limit = MAX_NEURON_NAME if kind == "neuron" else MAX_NAME
        if len(name) > limit:
            raise SpecError(f"{kind} name {name[:20]}... is {len(name)} characters long, more than the limit of "
                            f"{limit}", pos, "choose a shorter name")
        if (keyword.iskeyword(name) and not allow_keyword) or (name in RESERVED_NAMES and not allow_keyword):
            raise SpecError(f"{kind} name {name!r} is reserved", pos, _reserved_hint(name))
        if is_white_noise_name(name) and kind != "neuron":  # (a neuron's name is not an expression's)
            raise SpecError(f"{kind} name {name!r} is reserved: `xi` and `xi_<suffix>` are white noise in "
                            "`equations`", pos, f"choose another name, e.g. {name}0")
        if name.startswith("_") or "__" in name:
            raise SpecError(f"{kind} name {name!r} may not start with '_' or contain '__' (reserved for generated code)",
                            pos, "choose another name")
        if name in self.generated:
            raise SpecError(f"{kind} name {name!r} is the name of a generated Triton function of this neuron", pos,
                            "choose another name (the names NEURON_forward_core, NEURON_backward_core and "
                            "NEURON_<variant>_kernel belong to the generated code)")
        return name

    def declare(self, name: str, kind: str, pos: SourcePos) -> None:
        if name in self.declared:
            other_kind, other_pos = self.declared[name]
            if other_kind == "input" and self.default_input:
                raise SpecError(f"{kind} {name!r} collides with the input {name!r} (the default input when "
                                "`inputs` is not given)", pos,
                                f"rename the {kind}, or name the inputs yourself, e.g. inputs: [u]")
            if other_kind == kind:
                raise SpecError(f"{kind} {name!r} is listed twice (first at line {other_pos.line})", pos,
                                f"list each {kind} once")
            if (other_pos.line, other_pos.col) > (pos.line, pos.col):  # point at the later of the two
                kind, pos, other_kind, other_pos = other_kind, other_pos, kind, pos
            raise SpecError(f"{kind} {name!r} collides with the {other_kind} of the same name (line {other_pos.line})",
                            pos, "inputs, parameters and states need distinct names: rename one of them")
        self.declared[name] = (kind, pos)

    def expression(self, node: Node, env, what: str, later=None, initial: bool = False,
                   current: str | None = None, forbidden: dict | None = None, comparison: bool = False,
                   noise: bool = False, draws: bool | None = None) -> sympy.Expr:
        """Parse an expression of ``node`` against ``env``; ``initial``: computed once (no states, inputs or
        draws, unless ``draws``); ``noise``: white noise allowed (equations)."""
        if node.kind != "scalar" or node.value is None or isinstance(node.value, bool):
            raise SpecError(f"{what} must be a number or an expression, not {type_name(node)}", node.pos,
                            "write an expression such as `v + x / tau`")
        if isinstance(node.value, (int, float)):
            number = read_number(node, what)  # refuses .inf and .nan
            return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(number)
        forbidden = dict(forbidden or {})
        if initial:
            kinds = {**{n: "state" for n in self.state_names},
                     **{n: kind for n, (kind, _) in self.declared.items() if kind != "parameter"}}
            forbidden |= {name: (f"an initial value cannot use the {kind} {name!r}",
                                 "an initial value may use numbers and parameters only")
                          for name, kind in kinds.items()}
        parser = ExpressionParser(env, later=later, what=what, current=current, forbidden=forbidden,
                                  budget=self.condition_budget,
                                  draws=self.draws if (not initial if draws is None else draws) else None, noise=noise)
        try:
            expr = parser.parse(str(node.value), _locator(node), comparison=comparison)
        except SpecError as exc:
            if initial and "unknown name" in exc.message:
                only = "an initial value may use numbers and parameters only"
                exc.hint = f"{exc.hint} ({only})" if exc.hint.startswith("did you mean") else only
                exc.args = (exc.format(),)
            elif node.cut_at_comma and _unbalanced(str(node.value)):
                exc.hint = (f"YAML's inline {{...}} or [...] split this value at its commas (it read `{node.value}`): "
                            "quote the whole value in \"...\", or write the mapping as a block, one `name: value` "
                            "a line")
                exc.args = (exc.format(),)
            raise
        self.terms += parser.nodes
        if self.terms > MAX_SPEC_TERMS:
            raise SpecError(f"the spec's expressions have more than {MAX_SPEC_TERMS} terms in all", node.pos,
                            "a neuron needs far fewer: check that this is the right file")
        if initial and (expr.atoms(Spike) or any(f.func.__name__ == "Detach" for f in expr.atoms(sympy.Function))):
            raise SpecError(f"{what} may not use spike() or detach()", node.pos, "use numbers and parameters")
        return expr


def _unbalanced(text: str) -> bool:
    """Whether ``text`` opens more brackets than it closes (or the other way round)."""
    return any(text.count(a) != text.count(b) for a, b in ("()", "[]"))
