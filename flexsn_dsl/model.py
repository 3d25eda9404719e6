"""Stage 2: YAML nodes -> a validated neuron model whose expressions are sympy.

Every name, expression and key keeps the file, line and column it came from,
and every rule of the language is checked here, so later stages can assume a
well-formed model.
"""
from __future__ import annotations

import keyword
import math
import re
import sys
import warnings
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import sympy

from .errors import SourcePos, SpecError, SpecWarning
from .expressions import DSL_FUNCTIONS, MAX_CONDITION_NODES, ExpressionParser, closest
from .names import generated_names
from .plugins import Plugins, Surrogate
from .source import Node, parse_yaml, read_spec
from .symbolic import Detach, Spike, nonlinear_term, real_symbol

CONTINUOUS_KEYS = ("equations", "method", "threshold", "reset", "detach_reset", "refractory")
TOP_LEVEL_KEYS = ("neuron", "description", "inputs", "parameters", "states", "recurrent", "surrogate", "step", *CONTINUOUS_KEYS,
                  "outputs", "passes")
REQUIRED_KEYS = ("neuron", "states")
METHODS = ("exact", "euler", "rk2", "rk4", "exponential_euler")
SPIKE_OUTPUT = "s"             # the spike output of a continuous-time spec
REFRACTORY_STATE = "refractory"  # the steps a continuous-time neuron stays refractory
RESERVED_NAMES = frozenset({"pi", "tl", "triton", "libdevice", "torch", "math", "range", "float", *DSL_FUNCTIONS})
DEFAULT_SURROGATE = "sigmoid"
MAX_STEP_LINES = 1000
MAX_NEURON_NAME = 64  # the neuron's name is part of file and module names (build/NAME_torch.py, the cache)
MAX_NAME = 128  # any other name
# Attributes of the runtime module (a FlexSN, an nn.Module): every parameter becomes an
# attribute too, so it may not take one of these names (tests compare this with the real classes).
MODULE_ATTRIBUTES = frozenset({
    "T_destination", "add_module", "apply", "backend", "bfloat16", "buffers", "call_super_init", "children",
    "compile", "cpu", "cuda", "detach", "double", "dump_patches", "eval", "extra_repr", "float", "forward",
    "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "info", "ipu", "load_state_dict",
    "modules", "mtia", "named_buffers", "named_children", "named_modules", "named_parameters", "parameter_texts",
    "parameters",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "reset", "set_extra_state", "set_submodule",
    "share_memory", "spec", "specialize", "state_dict", "state_seqs", "states", "step_mode", "store_state_seqs", "to",
    "to_empty", "train", "training", "type", "xpu", "zero_grad",
})
# Modules a neuron's name may not shadow: `flexsn-dsl build` writes NAME.py and NAME_torch.py, which
# an import of the same name would pick up when run from the output folder.
SHADOWED_MODULES = frozenset({
    *sys.stdlib_module_names, *sys.builtin_module_names, "flexsn_dsl", "torch", "triton", "numpy", "sympy",
    "mpmath", "yaml", "pluggy", "pytest", "pip", "setuptools", "sitecustomize", "usercustomize",
})
MAX_SPEC_TERMS = 20_000  # syntax-tree nodes over all expressions of a spec (bounds the time sympy takes)
# A plain YAML scalar that YAML 1.1 reads as text but everyone means as a number: 1e-3, 5E2.
_NUMBER_TEXT = re.compile(r"[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?")
_OCTAL_TEXT = re.compile(r"[-+]?0o_?[0-7]+(_[0-7]+)*")  # YAML 1.2 octal (YAML 1.1 writes 012: refused in source.py)


SIZE_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")  # a size in `shape`: C, N, H_out


@dataclass(frozen=True)
class Parameter:
    """A parameter; ``shape`` is None for a scalar, else its sizes (numbers or size names),
    and then ``init`` is the initial value of every element (an expression of scalar parameters)."""

    name: str
    value: float
    learnable: bool
    pos: SourcePos
    shape: tuple[int | str, ...] | None = None
    init: sympy.Expr | None = None

    @property
    def shaped(self) -> bool:
        return self.shape is not None

    def initial_value(self, scalars: dict[str, float]) -> float | None:
        """A shaped parameter's initial element value with these scalar parameter values
        (None when it is not a finite real number)."""
        number = self.init.xreplace({real_symbol(n): sympy.Float(v) for n, v in scalars.items()})
        if not number.is_number or not _finite(number):
            return None
        return float(number)


@dataclass(frozen=True)
class State:
    name: str
    init: sympy.Expr  # an expression of parameter symbols
    pos: SourcePos


@dataclass(frozen=True)
class Recurrent:
    """``NAME: {from: SOURCE}``: a per-step value ``NAME_t = W · SOURCE_{t-1}`` over the last
    dimension, with a learnable ``NAME_weight`` W [N, N]; ``symbol`` is SOURCE's value after a
    step (its next-state symbol for a state)."""

    name: str
    source: str
    symbol: sympy.Symbol
    pos: SourcePos

    @property
    def weight_name(self) -> str:
        return f"{self.name}_weight"

    @property
    def prev_name(self) -> str:
        """The key of the carried previous value of SOURCE in ``FlexSN.states``."""
        return f"{self.name}_prev"


@dataclass(frozen=True)
class Assignment:
    """One line of ``step``: ``symbol = expr`` (``symbol`` is unique; ``name`` the user's)."""

    name: str
    symbol: sympy.Symbol
    expr: sympy.Expr
    pos: SourcePos


@dataclass(frozen=True)
class Continuous:
    """The continuous-time part of a spec (``equations``), lowered to step lines by
    :mod:`flexsn_dsl.continuous`. Expressions use the symbols of inputs, parameters and
    states (a state symbol in ``threshold`` and ``reset`` means its integrated value)."""

    equations: dict[str, Assignment]   # state -> its derivative (``symbol`` is d<state>__dt)
    method: str                        # one of METHODS (the default already resolved)
    method_pos: SourcePos
    threshold: sympy.Expr | None       # u of s = spike(u); None: no spike output
    threshold_pos: SourcePos | None
    reset: dict[str, Assignment]       # state -> its value where the neuron spiked
    detach_reset: bool
    period: sympy.Expr | None          # refractory period (an expression of parameters); None: none
    period_pos: SourcePos | None
    hold: tuple[str, ...]              # states not integrated while refractory
    condition: sympy.Basic | None = None  # refractory while this holds after a spike (instead of a period)
    condition_pos: SourcePos | None = None

    @property
    def refractory(self) -> bool:
        """Whether spikes make the neuron refractory (for a period, or while a condition holds)."""
        return self.period is not None or self.condition is not None

    @property
    def lines(self) -> list[Assignment]:
        """Every expression, as pseudo step lines (for checks of parameter values)."""
        lines = [Assignment(f"the equation of {eq.name!r}", eq.symbol, eq.expr, eq.pos)
                 for eq in self.equations.values()]
        if self.threshold is not None:
            lines.append(Assignment("`threshold`", real_symbol("threshold__"), self.threshold, self.threshold_pos))
        return lines + [Assignment(f"the reset of {r.name!r}", r.symbol, r.expr, r.pos) for r in self.reset.values()]


@dataclass
class NeuronModel:
    """A validated spec. Expressions use one real sympy symbol per input, parameter,
    previous state and assigned name; a reassigned state ``v`` gets ``v__next``."""

    name: str
    description: str
    file: str
    text: str
    inputs: list[str]
    parameters: dict[str, Parameter]
    states: dict[str, State]
    surrogate: Surrogate
    surrogate_params: dict[str, float]
    steps: list[Assignment]
    outputs: list[tuple[str, sympy.Symbol]]
    next_states: dict[str, sympy.Symbol]
    passes: list[str] = field(default_factory=list)
    positions: dict[str, SourcePos] = field(default_factory=dict)
    continuous: Continuous | None = None  # set for `equations` specs (then ``steps`` is empty)
    warnings: list[SpecWarning] = field(default_factory=list)
    recurrent: dict[str, Recurrent] = field(default_factory=dict)

    @property
    def checked_lines(self) -> list[Assignment]:
        """The expressions :func:`fold_values` checks: the steps, or the continuous-time lines."""
        return self.steps + (self.continuous.lines if self.continuous else [])

    @property
    def learnable(self) -> list[str]:
        return [p.name for p in self.parameters.values() if p.learnable]

    @property
    def shaped(self) -> list[str]:
        return [p.name for p in self.parameters.values() if p.shaped]

    @property
    def runtime_params(self) -> list[str]:
        """Parameters passed to the kernels at run time (learnable or shaped); the other
        (scalar, constant) ones are baked into the generated code."""
        return [p.name for p in self.parameters.values() if p.learnable or p.shaped]

    def symbol(self, name: str) -> sympy.Symbol:
        return real_symbol(name)


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


def _type_name(node: Node) -> str:
    if node.kind != "scalar":
        return node.kind
    value = node.value
    return "nothing" if value is None else type(value).__name__


class _Builder:
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
        self.generated: frozenset[str] = frozenset()  # the generated code's names for this neuron
        self.warnings: list[SpecWarning] = []

    # -- small checks ------------------------------------------------------
    def _get(self, key: str) -> Node | None:
        return self.root.value.get(key)

    def _key_pos(self, key: str) -> SourcePos:
        return self.root.key_pos.get(key, self.root.pos)

    def _expect(self, node: Node, kind: str, what: str, example: str) -> None:
        if node.kind != kind or (kind == "scalar" and node.value is None):
            raise SpecError(f"{what} must be a {kind if kind != 'scalar' else 'value'}, not {_type_name(node)}",
                            node.pos, f"write it like: {example}")

    def _identifier(self, name: object, pos: SourcePos, kind: str, allow_keyword: bool = False) -> str:
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise SpecError(f"{kind} name {name!r} is not a valid identifier", pos,
                            "use letters, digits and single underscores, starting with a letter")
        limit = MAX_NEURON_NAME if kind == "neuron" else MAX_NAME
        if len(name) > limit:
            raise SpecError(f"{kind} name {name[:20]}... is {len(name)} characters long, more than the limit of "
                            f"{limit}", pos, "choose a shorter name")
        if (keyword.iskeyword(name) and not allow_keyword) or (name in RESERVED_NAMES and not allow_keyword):
            raise SpecError(f"{kind} name {name!r} is reserved", pos, _reserved_hint(name))
        if name.startswith("_") or "__" in name:
            raise SpecError(f"{kind} name {name!r} may not start with '_' or contain '__' (reserved for generated code)",
                            pos, "choose another name")
        if name in self.generated:
            raise SpecError(f"{kind} name {name!r} is the name of a generated Triton function of this neuron", pos,
                            "choose another name (the names NEURON_forward_core, NEURON_backward_core and "
                            "NEURON_<variant>_kernel belong to the generated code)")
        return name

    def _declare(self, name: str, kind: str, pos: SourcePos) -> None:
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

    def _number(self, node: Node, what: str) -> float:
        value = node.value
        if node.kind == "scalar" and node.style is None and isinstance(value, str):
            if _NUMBER_TEXT.fullmatch(value):
                value = float(value.replace("_", ""))  # 1e-3: YAML 1.1 reads it as text
            elif _OCTAL_TEXT.fullmatch(value):
                value = int(value, 0)
        if node.kind != "scalar" or isinstance(value, bool) or not isinstance(value, (int, float)):
            raise SpecError(f"{what} must be a number, not nothing" if node.kind == "scalar" and value is None
                            else f"{what} must be a number, not {_type_name(node)} {value!r}" if node.kind == "scalar"
                            else f"{what} must be a number, not a {node.kind}", node.pos,
                            "write a number such as 1.0 or -0.5" + (" (without quotes)" if node.style else ""))
        if isinstance(value, float) and math.isnan(value):
            raise SpecError(f"{what} is NaN", node.pos, "write a finite number")
        try:
            number = float(value)
        except OverflowError:  # an int beyond float64
            number = math.inf
        if not math.isfinite(number):
            raise SpecError(f"{what} is infinite or too large for a float64", node.pos, "write a finite number")
        return number

    # -- sections ----------------------------------------------------------
    def build(self) -> NeuronModel:
        top = self.root.value
        for key in top:
            if key not in TOP_LEVEL_KEYS:
                hint = closest(key, TOP_LEVEL_KEYS)
                raise SpecError(f"unknown key {key!r}", self.root.key_pos[key],
                                hint or f"the keys are: {', '.join(TOP_LEVEL_KEYS)}")
        for key in REQUIRED_KEYS:
            if key not in top:
                raise SpecError(f"missing required key {key!r}", self.root.pos,
                                {"neuron": "add `neuron: my_neuron` (an identifier naming the model)",
                                 "states": "add `states:` mapping each state to its initial value, e.g. `v: 0.0`"
                                 }[key])
        self._step_or_equations()
        name_node = top["neuron"]
        self._expect(name_node, "scalar", "`neuron`", "neuron: lif")
        name = self._identifier(name_node.value, name_node.pos, "neuron", allow_keyword=True)
        if name.lower() in SHADOWED_MODULES:
            raise SpecError(f"neuron name {name!r} is the name of a Python module", name_node.pos,
                            f"choose another name, e.g. {name}_neuron: `flexsn-dsl build` writes {name}.py, "
                            f"which would shadow the module {name!r} for code run next to it")
        self.generated = generated_names(name)
        description = ""
        if "description" in top:
            node = top["description"]
            if node.kind != "scalar" or not isinstance(node.value, str):
                raise SpecError("`description` must be text", node.pos, "write description: some text")
            description = node.value.strip()
        inputs = self._inputs()
        parameters = self._parameters()
        states = self._states(parameters)
        recurrent_nodes = self._recurrent_names()
        surrogate, surrogate_params = self._surrogate()
        continuous = None
        if "equations" in top:
            continuous, next_states, env = self._continuous(inputs, parameters, states, list(recurrent_nodes))
            steps: list[Assignment] = []
            default_outputs = [SPIKE_OUTPUT] if continuous.threshold is not None else list(states)
        else:
            steps, next_states, env, default_outputs = self._steps(inputs, parameters, states, list(recurrent_nodes))
        outputs = self._outputs(env, default_outputs)
        recurrent = self._recurrent(recurrent_nodes, steps, continuous, next_states, env, outputs)
        passes = self._passes()
        model = NeuronModel(name, description, self.file, self.text, inputs, parameters, states, surrogate,
                            surrogate_params, steps, outputs, next_states, passes,
                            {k: self._key_pos(k) for k in top}, continuous, self.warnings, recurrent)
        fold_values(model, {p.name: p.value for p in parameters.values()},
                    lambda n: f"{n} = {parameters[n].value:g} (line {parameters[n].pos.line})")
        return model

    def _step_or_equations(self) -> None:
        """A spec has `step` (discrete time) or `equations` (continuous time), never both; the
        keys of continuous time need `equations`."""
        top = self.root.value
        if "step" in top and "equations" in top:
            later = max(("step", "equations"), key=lambda k: (self._key_pos(k).line, self._key_pos(k).col))
            raise SpecError("a spec has either `step` (discrete time) or `equations` (continuous time), not both",
                            self._key_pos(later), "keep `equations` with `method`, `threshold` and `reset`, "
                            "or keep the hand-discretised `step` lines, and remove the other")
        if "step" not in top and "equations" not in top:
            raise SpecError("missing required key 'step'", self.root.pos,
                            "add `step:` with the update lines, e.g. `s: spike(v - 1.0)`")
        if "step" in top:
            for key in CONTINUOUS_KEYS:
                if key in top:
                    raise SpecError(f"`{key}` belongs to continuous-time specs (with `equations`), not to `step`",
                                    self._key_pos(key), "write the spike and reset as step lines, or write the "
                                    "neuron with `equations:` instead of `step:`")

    def _inputs(self) -> list[str]:
        node = self._get("inputs")
        if node is None:
            self._declare("x", "input", self.root.pos)
            self.default_input = True
            return ["x"]
        self._expect(node, "list", "`inputs`", "inputs: [x]")
        if not node.value:
            raise SpecError("`inputs` is empty", node.pos, "list at least one input, e.g. inputs: [x]")
        names = []
        for item in node.value:
            self._expect(item, "scalar", "an input", "inputs: [x, y]")
            name = self._identifier(item.value, item.pos, "input")
            self._declare(name, "input", item.pos)
            names.append(name)
        return names

    def _parameters(self) -> dict[str, Parameter]:
        node = self._get("parameters")
        if node is None or (node.kind == "scalar" and node.value is None):
            return {}
        self._expect(node, "mapping", "`parameters`", "parameters: {tau: 2.0}")
        keys = ("value", "learnable", "shape")
        out, inits = {}, {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            self._identifier(name, pos, "parameter")
            self._declare(name, "parameter", pos)
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
                    shape = self._shape(value.value["shape"], name)
                    inits[name] = value.value["value"]  # a number or an expression of scalar parameters
                    number = math.nan  # evaluated below, once every scalar parameter is known
                else:
                    number = self._number(value.value["value"], f"the value of parameter {name!r}")
            else:
                number = self._number(value, f"parameter {name!r}")
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
                init = sympy.Float(self._number(value, what))
            else:
                init = self._expression(value, env, what, initial=True, forbidden=forbidden)
            param = replace(out[name], init=init)
            number = param.initial_value(scalars)
            if number is None:
                raise SpecError(f"{what} ({init}) is not a finite real number", value.pos,
                                "a division by zero, or log/sqrt of a number <= 0: change the expression")
            out[name] = replace(param, value=number)
        return out

    def _shape(self, node: Node, name: str) -> tuple[int | str, ...]:
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
                                f"size name, not {_type_name(item)} {size!r}", item.pos,
                                "write numbers and capitalised names given when loading, e.g. shape: [C, 1, 1] "
                                "with sizes={'C': 64}")
        return tuple(shape)

    def _states(self, parameters: dict[str, Parameter]) -> dict[str, State]:
        node = self.root.value["states"]
        self._expect(node, "mapping", "`states`", "states: {v: 0.0}")
        if not node.value:
            raise SpecError("`states` is empty", node.pos, "declare at least one state, e.g. v: 0.0")
        env = {p: real_symbol(p) for p in parameters}
        self.state_names = [n for n in node.value if n not in parameters]
        out = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            self._identifier(name, pos, "state")
            self._declare(name, "state", pos)
            if value.kind == "mapping":
                for key in value.value:
                    if key != "init":
                        raise SpecError(f"unknown key {key!r} in state {name!r}", value.key_pos[key],
                                        "a state takes `init` (a number or an expression of parameters)")
                if "init" not in value.value:
                    raise SpecError(f"state {name!r} has no `init`", value.pos, f"write {name}: {{init: 0.0}}")
                value = value.value["init"]
            init = self._expression(value, env, f"initial value of state {name!r}", initial=True)
            out[name] = State(name, init, pos)
        top = self.root.value
        if "equations" in top and "threshold" in top and SPIKE_OUTPUT in self.declared:
            kind, pos = self.declared[SPIKE_OUTPUT]
            raise SpecError(f"the {kind} {SPIKE_OUTPUT!r} has the name of the spike output of `threshold`", pos,
                            f"rename the {kind}: with `threshold`, {SPIKE_OUTPUT!r} is the spike output")
        if "equations" in top and "refractory" in top:
            if REFRACTORY_STATE in self.declared:
                kind, pos = self.declared[REFRACTORY_STATE]
                raise SpecError(f"`refractory` adds a state named {REFRACTORY_STATE!r} (the steps left), and the "
                                f"{kind} {REFRACTORY_STATE!r} has that name", pos, f"rename the {kind}")
            pos = self._key_pos("refractory")
            self._declare(REFRACTORY_STATE, "state", pos)
            out[REFRACTORY_STATE] = State(REFRACTORY_STATE, sympy.Integer(0), pos)
        return out

    def _expression(self, node: Node, env, what: str, later=None, initial: bool = False,
                    current: str | None = None, forbidden: dict | None = None, comparison: bool = False) -> sympy.Expr:
        if node.kind != "scalar" or node.value is None or isinstance(node.value, bool):
            raise SpecError(f"{what} must be a number or an expression, not {_type_name(node)}", node.pos,
                            "write an expression such as `v + x / tau`")
        if isinstance(node.value, (int, float)):
            number = self._number(node, what)  # refuses .inf and .nan
            return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(number)
        forbidden = dict(forbidden or {})
        if initial:
            kinds = {**{n: "state" for n in self.state_names},
                     **{n: kind for n, (kind, _) in self.declared.items() if kind != "parameter"}}
            forbidden |= {name: (f"an initial value cannot use the {kind} {name!r}",
                                 "an initial value may use numbers and parameters only")
                          for name, kind in kinds.items()}
        parser = ExpressionParser(env, later=later, what=what, current=current, forbidden=forbidden,
                                  budget=self.condition_budget)
        try:
            expr = parser.parse(str(node.value), _locator(node), comparison=comparison)
        except SpecError as exc:
            if initial and "unknown name" in exc.message:
                only = "an initial value may use numbers and parameters only"
                exc.hint = f"{exc.hint} ({only})" if exc.hint.startswith("did you mean") else only
                exc.args = (exc.format(),)
            raise
        self.terms += parser.nodes
        if self.terms > MAX_SPEC_TERMS:
            raise SpecError(f"the spec's expressions have more than {MAX_SPEC_TERMS} terms in all", node.pos,
                            "a neuron needs far fewer: check that this is the right file")
        if initial and (expr.atoms(Spike) or any(f.func.__name__ == "Detach" for f in expr.atoms(sympy.Function))):
            raise SpecError(f"{what} may not use spike() or detach()", node.pos, "use numbers and parameters")
        return expr

    def _surrogate(self) -> tuple[Surrogate, dict[str, float]]:
        node = self._get("surrogate")
        params: dict[str, Node] = {}
        if node is None:
            name, pos = DEFAULT_SURROGATE, self.root.pos
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
            raise SpecError(f"`surrogate` must be a name or a mapping, not {_type_name(node)}", node.pos,
                            "write surrogate: atan   or   surrogate: {name: atan, alpha: 2.0}")
        surrogate = self.plugins.surrogate(name)
        if surrogate is None:
            hint = closest(name, self.plugins.surrogates)
            raise SpecError(f"unknown surrogate {name!r}{self.plugins.broken()}", pos,
                            hint or f"surrogates: {', '.join(sorted(self.plugins.surrogates))}")
        values = dict(surrogate.params)
        for key, value in params.items():
            if key not in surrogate.params:
                hint = closest(key, surrogate.params)
                known = ", ".join(surrogate.params) or "none"
                raise SpecError(f"surrogate {name!r} has no parameter {key!r}", node.key_pos[key],
                                hint or f"its parameters: {known}")
            values[key] = self._number(value, f"surrogate parameter {key!r}")
        if params and not _finite_with(surrogate.gradient, {real_symbol(k): sympy.Float(v) for k, v in values.items()}):
            defaults = {real_symbol(k): sympy.Float(v) for k, v in surrogate.params.items()}
            culprit = next((k for k in params if not _finite_with(
                surrogate.gradient, {**defaults, real_symbol(k): sympy.Float(values[k])})), None)
            where = params[culprit].pos if culprit else node.pos
            shown = ", ".join(f"{k}={v:g}" for k, v in values.items())
            raise SpecError(f"surrogate {name!r} with {shown} has a gradient that is not a finite real number "
                            f"(g(x) = {surrogate.gradient})", where,
                            "choose other parameter values (a division by zero or a negative root here)")
        return surrogate, values

    def _recurrent_names(self) -> dict[str, Node]:
        """The names `recurrent` declares (each a per-step value like an input) -> their `from` node."""
        node = self._get("recurrent")
        if node is None:
            return {}
        self._expect(node, "mapping", "`recurrent`", "recurrent: {r: {from: s}}")
        if not node.value:
            raise SpecError("`recurrent` is empty", node.pos, "write recurrent: {r: {from: s}}, or remove the key")
        out = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            self._identifier(name, pos, "recurrent input")
            self._declare(name, "recurrent input", pos)
            for derived, what in ((f"{name}_weight", "its weight"), (f"{name}_prev", "its carried previous value")):
                if derived in self.declared:
                    kind, other = self.declared[derived]
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
            self._expect(source, "scalar", f"`from` of recurrent input {name!r}", f"{name}: {{from: s}}")
            out[name] = source
        return out

    def _recurrent(self, nodes: dict[str, Node], steps: list[Assignment], continuous: Continuous | None,
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
                raise SpecError(f"recurrent input {name!r} is used nowhere in {where}", self.root.value["recurrent"]
                                .key_pos[name], f"use {name} like an input (e.g. h: v + (x + {name} - v) / tau), "
                                "or remove it")
            out[name] = Recurrent(name, source, sources[source], self.root.value["recurrent"].key_pos[name])
        return out

    def _steps(self, inputs, parameters, states, recurrent=()):
        node = self.root.value["step"]
        self._expect(node, "mapping", "`step`", "step: {s: spike(v - 1.0)}")
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
            self._identifier(name, pos, "step")
            kind = self.declared.get(name, ("", None))[0]
            if kind in ("input", "parameter", "recurrent input"):
                raise SpecError(f"cannot assign the {kind} {name!r}", pos,
                                f"a step may assign states and new names; rename this line")
            expr = self._expression(value, env, f"step {name!r}", later=later,
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

    def _continuous(self, inputs, parameters, states, recurrent=()):
        """`equations` with `method`, `threshold`, `reset`, `detach_reset` and `refractory`."""
        top = self.root.value
        node = top["equations"]
        self._expect(node, "mapping", "`equations`", "equations: {v: (x - v) / tau}")
        if not node.value:
            raise SpecError("`equations` is empty", node.pos, "give the time derivative of a state, e.g. v: (x - v) / tau")
        dt = parameters.get("dt")
        if dt is None:
            raise SpecError("`equations` need the length of one step: a parameter `dt`", self._key_pos("equations"),
                            "add `dt: 0.5` under `parameters:` (in the unit of the time constants)")
        if dt.shaped:
            raise SpecError("`dt` cannot have a shape: it is the length of one step, the same for every neuron "
                            "(the kernels advance all neurons together)", dt.pos,
                            "write dt: 0.5 (a number); give per-neuron time constants a shape instead")
        if dt.learnable:
            raise SpecError(f"`dt` must be a positive constant, not {dt.value:g}, learnable", dt.pos, DT_HINT)
        if dt_problem(dt.value) is not None:
            raise SpecError(dt_problem(dt.value), dt.pos, DT_HINT)
        user_states = [n for n in states if n != REFRACTORY_STATE]
        env = {n: real_symbol(n) for n in [*inputs, *recurrent, *parameters, *user_states]}
        equations: dict[str, Assignment] = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            if name not in user_states:
                kind = self.declared.get(name, (None,))[0]
                what = f"the {kind} {name!r}" if kind else f"{name!r}, which is not declared"
                hint = closest(name, user_states) or f"declare it under `states:` (e.g. {name}: 0.0), or give the " \
                    f"derivative of one of the states: {', '.join(user_states)}"
                raise SpecError(f"`equations` gives the time derivative of {what}; only states have one", pos, hint)
            expr = self._expression(value, env, f"the equation of {name!r}")
            self._no_spike(expr, value, f"the equation of {name!r}")
            equations[name] = Assignment(name, real_symbol(f"d{name}__dt"), expr, value.pos)
        method, method_pos = self._method(equations)
        threshold, threshold_pos = None, None
        if "threshold" in top:
            threshold, threshold_pos = self._threshold(top["threshold"], env, [*inputs, *recurrent, *user_states])
        reset = self._reset(env, user_states, threshold is not None)
        detach_reset = False
        if "detach_reset" in top:
            flag = top["detach_reset"]
            if not isinstance(flag.value, bool):
                raise SpecError(f"`detach_reset` must be true or false, not {flag.value!r}", flag.pos,
                                "write detach_reset: true")
            detach_reset = flag.value
        (period, period_pos), (condition, condition_pos), hold = self._refractory(parameters, env, user_states, reset,
                                                                                 threshold is not None)
        changed = [*equations, *reset] + ([REFRACTORY_STATE] if REFRACTORY_STATE in states else [])
        next_states = {n: real_symbol(f"{n}__next") if n in changed else real_symbol(n) for n in states}
        out_env = {**{n: real_symbol(n) for n in inputs}, **next_states}
        if threshold is not None:
            out_env[SPIKE_OUTPUT] = real_symbol(SPIKE_OUTPUT)
        part = Continuous(equations, method, method_pos, threshold, threshold_pos, reset, detach_reset,
                          period, period_pos, hold, condition, condition_pos)
        return part, next_states, out_env

    def _no_spike(self, expr: sympy.Expr, node: Node, what: str) -> None:
        if expr.has(Spike, Detach):
            raise SpecError(f"{what} may not use spike() or detach()", node.pos,
                            "spikes come from `threshold`; `detach_reset: true` detaches the reset")

    def _method(self, equations: dict[str, Assignment]) -> tuple[str, SourcePos]:
        top = self.root.value
        states = [real_symbol(n) for n in equations]
        nonlinear = next(((name, term) for name, eq in equations.items()
                          if (term := nonlinear_term(eq.expr, states)) is not None), None)
        if "method" not in top:
            pos = self._key_pos("equations")
            if nonlinear is None:
                return "exact", pos
            name, term = nonlinear
            self.warnings.append(SpecWarning(
                f"no `method` given and the equations are not linear in the states (the equation of {name!r} "
                f"has the term {term}): they are integrated with `euler`", pos,
                "add `method: euler` to keep it, or choose a more accurate one: `rk2`, `rk4`, or "
                "`exponential_euler` (for equations linear in their own state, like gating variables)"))
            return "euler", pos
        node = top["method"]
        if node.kind != "scalar" or not isinstance(node.value, str) or node.value not in METHODS:
            shown = node.value if node.kind == "scalar" else node.kind
            hint = closest(str(shown), METHODS) if isinstance(shown, str) else ""
            raise SpecError(f"unknown method {shown!r}", node.pos, hint or f"methods: {', '.join(METHODS)}")
        if node.value == "exact" and nonlinear is not None:
            name, term = nonlinear
            raise SpecError(f"`method: exact` needs equations linear in the states, but the equation of {name!r} "
                            f"has the nonlinear term {term}", equations[name].pos,
                            "choose method: rk4 (or rk2, euler, exponential_euler), or make the equations linear")
        return node.value, node.pos

    def _threshold(self, node: Node, env, varying: list[str]) -> tuple[sympy.Expr, SourcePos]:
        expr = self._expression(node, env, "`threshold`", comparison=True)
        if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan)):
            expr = expr.lhs - expr.rhs
        elif isinstance(expr, (sympy.LessThan, sympy.StrictLessThan)):
            expr = expr.rhs - expr.lhs
        elif isinstance(expr, sympy.logic.boolalg.Boolean):
            raise SpecError(f"`threshold` must be one comparison a >= b (or a > b), or an expression u "
                            f"meaning u >= 0, not {expr}", node.pos, "write e.g. threshold: v >= v_th")
        self._no_spike(expr, node, "`threshold`")
        if not expr.free_symbols:
            raise SpecError(f"`threshold` is constant ({expr})", node.pos,
                            "compare a state with its threshold, e.g. v >= v_th")
        if not {s.name for s in expr.free_symbols} & set(varying):
            raise SpecError(f"`threshold` depends on no state or input (only on parameters: {expr} >= 0), so it "
                            "would spike every step or never", node.pos,
                            "compare a state with its threshold, e.g. v >= v_th")
        return expr, node.pos

    def _reset(self, env, user_states: list[str], has_threshold: bool) -> dict[str, Assignment]:
        node = self._get("reset")
        if node is None:
            return {}
        if not has_threshold:
            raise SpecError("`reset` without `threshold`: nothing says when to reset", self._key_pos("reset"),
                            "add `threshold: v >= v_th` (or remove `reset`)")
        self._expect(node, "mapping", "`reset`", "reset: {v: v_reset}")
        out = {}
        for name, value in node.value.items():
            pos = node.key_pos[name]
            if name not in user_states:
                kind = self.declared.get(name, (None,))[0]
                what = f"the {kind} {name!r}" if kind else f"{name!r}, which is not declared"
                raise SpecError(f"`reset` assigns {what}; only states can be reset", pos,
                                closest(name, user_states) or f"reset one of the states: {', '.join(user_states)}")
            expr = self._expression(value, env, f"the reset of {name!r}")
            self._no_spike(expr, value, f"the reset of {name!r}")
            out[name] = Assignment(name, real_symbol(f"{name}__reset"), expr, value.pos)
        return out

    def _refractory(self, parameters, env, user_states, reset, has_threshold):
        """`refractory`: ((period, where), (condition, where), hold); a period or a condition, not both."""
        node = self._get("refractory")
        if node is None:
            return (None, None), (None, None), ()
        if not has_threshold:
            raise SpecError("`refractory` without `threshold`: nothing starts a refractory period",
                            self._key_pos("refractory"), "add `threshold: v >= v_th` (or remove `refractory`)")
        self._expect(node, "mapping", "`refractory`", "refractory: {period: 2.0, hold: [v]}")
        keys = ("period", "condition", "hold")
        for key in node.value:
            if key not in keys:
                raise SpecError(f"unknown key {key!r} in `refractory`", node.key_pos[key],
                                closest(key, keys) or "`refractory` takes `period` or `condition`, and `hold`")
        if "period" in node.value and "condition" in node.value:
            raise SpecError("`refractory` has both `period` and `condition`", node.key_pos["condition"],
                            "keep one: `period: 2.0` (a fixed time) or `condition: v > v_th` (while it holds)")
        hold = self._hold(node, user_states, reset)
        if "condition" in node.value:
            return (None, None), self._refractory_condition(node.value["condition"], env, user_states), hold
        if "period" not in node.value:
            raise SpecError("`refractory` has no `period` or `condition`", node.pos,
                            "write refractory: {period: 2.0}, or refractory: {condition: v > v_th}")
        return self._refractory_period(node.value["period"], parameters), (None, None), hold

    def _refractory_condition(self, node: Node, env, user_states: list[str]) -> tuple[sympy.Basic, SourcePos]:
        """A comparison (`<`, `<=`, `>`, `>=`), or several joined with `&` / `|`, of the states at the start of a step."""
        expr = self._expression(node, env, "the refractory condition", comparison=True)
        comparisons = (sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan, sympy.GreaterThan)
        parts = [expr]
        while any(isinstance(p, (sympy.And, sympy.Or)) for p in parts):
            parts = [a for p in parts for a in (p.args if isinstance(p, (sympy.And, sympy.Or)) else (p,))]
        if not all(isinstance(p, comparisons) for p in parts):
            raise SpecError(f"the refractory condition must be a comparison (<, <=, >, >=), or several joined "
                            f"with & or |, not {expr}", node.pos, "write e.g. condition: v > v_th")
        self._no_spike(expr, node, "the refractory condition")
        if not any(real_symbol(n) in expr.free_symbols for n in user_states):
            raise SpecError(f"the refractory condition {expr} does not depend on a state: it cannot end",
                            node.pos, "compare a state, e.g. condition: v > v_th")
        return expr, node.pos

    def _refractory_period(self, period_node: Node, parameters) -> tuple[sympy.Expr, SourcePos]:
        env = {p: real_symbol(p) for p in parameters}
        period = self._expression(period_node, env, "the refractory period", initial=True)
        shaped = sorted(s.name for s in period.free_symbols if parameters[s.name].shaped)
        if shaped:
            raise SpecError(f"the refractory period may not use the shaped parameter {shaped[0]!r}: it is one whole "
                            "number of steps for every neuron, compiled into the kernels", period_node.pos,
                            "use scalar constant parameters or a number, e.g. period: 2.0")
        values = {real_symbol(p.name): sympy.Float(p.value) for p in parameters.values()}
        number = sympy.sympify(period).xreplace(values)
        if not number.is_number or not _finite(number) or float(number) < 0:
            raise SpecError(f"the refractory period is {number}, not a number >= 0", period_node.pos,
                            "write a duration in the unit of dt, e.g. period: 2.0")
        problem = period_problem(float(number), parameters["dt"].value)
        if problem is not None:
            raise SpecError(problem, period_node.pos, "give a period >= 0 of at most that many steps")
        if any(parameters[s.name].learnable for s in period.free_symbols):
            raise SpecError("the refractory period may not use learnable parameters (it is a whole number of "
                            "steps)", period_node.pos, "use constant parameters or a number")
        _, warning = refractory_steps(float(number), parameters["dt"].value, period_node.pos)
        if warning is not None:
            self.warnings.append(warning)
        return period, period_node.pos

    def _hold(self, node: Node, user_states: list[str], reset) -> tuple[str, ...]:
        """The states `hold` lists (default: those `reset` sets)."""
        if "hold" not in node.value:
            return tuple(reset)
        hold_node = node.value["hold"]
        self._expect(hold_node, "list", "`hold`", "hold: [v]")
        hold: list[str] = []
        for item in hold_node.value:
            if item.kind != "scalar" or item.value not in user_states:
                raise SpecError(f"`hold` lists {item.value!r}, which is not a state", item.pos,
                                closest(str(item.value), user_states) or f"states: {', '.join(user_states)}")
            if item.value in hold:
                raise SpecError(f"`hold` lists {item.value!r} twice", item.pos, "list each state once")
            hold.append(item.value)
        return tuple(hold)

    def _outputs(self, env, default: list[str]) -> list[tuple[str, sympy.Symbol]]:
        node = self._get("outputs")
        if node is None:
            if not default:
                raise SpecError("no outputs: no step line is `name: spike(...)`", self._key_pos("step"),
                                "add `outputs: [name, ...]` listing what the neuron returns")
            return [(n, env[n]) for n in default]
        self._expect(node, "list", "`outputs`", "outputs: [s]")
        if not node.value:
            raise SpecError("`outputs` is empty", node.pos, "list at least one name, e.g. outputs: [s]")
        out, seen = [], set()
        for item in node.value:
            if item.kind != "scalar" or not isinstance(item.value, str):
                raise SpecError("an output must be a name", item.pos, "outputs: [s, v]")
            name = item.value
            if name not in env:
                hint = closest(name, env)
                what = "the spike output s" if self.root.value.get("threshold") else "names assigned in step"
                raise SpecError(f"output {name!r} is not an input, state or step name", item.pos,
                                hint or f"list {what}, states or inputs")
            if self.declared.get(name, ("",))[0] == "parameter":
                raise SpecError(f"output {name!r} is a parameter, not an input, state or step name", item.pos,
                                f"assign it in step (e.g. {name}_out: {name}) and list that name")
            if name in seen:
                raise SpecError(f"output {name!r} is listed twice", item.pos, "list each output once")
            seen.add(name)
            out.append((name, env[name]))
        return out

    def _passes(self) -> list[str]:
        node = self._get("passes")
        if node is None:
            return []
        self._expect(node, "list", "`passes`", "passes: [safe_exp]")
        names = []
        for item in node.value:
            if item.kind != "scalar" or not isinstance(item.value, str):
                raise SpecError("a pass must be a name", item.pos, "passes: [safe_exp]")
            if item.value not in self.plugins.passes:
                hint = closest(item.value, self.plugins.passes)
                known = ", ".join(sorted(self.plugins.passes)) or "none registered"
                raise SpecError(f"unknown code-generation pass {item.value!r}{self.plugins.broken()}", item.pos,
                                hint or f"passes: {known}")
            names.append(item.value)
        return names


MAX_REFRACTORY_STEPS = 2 ** 31 - 1  # a refractory period counts whole steps in a float32 counter
DT_HINT = "write dt: 0.5 (a number of time units, not learnable)"


def dt_problem(dt: float) -> str | None:
    """What is wrong with a value of `dt` (a positive normal float64: 1/dt is finite), or None."""
    if not math.isfinite(dt) or dt <= 0:
        return f"`dt` must be a positive constant, not {dt:g}"
    if dt < sys.float_info.min:
        return f"`dt` = {dt:g} is below the smallest normal float64 ({sys.float_info.min:.3g}): 1 / dt overflows"
    return None


def period_problem(period: float, dt: float) -> str | None:
    """What is wrong with a refractory period with this `dt` (a number >= 0 of at most
    MAX_REFRACTORY_STEPS steps), or None."""
    if not math.isfinite(period) or period < 0:
        return f"the refractory period is {period:g}, not a number >= 0"
    if period / dt > MAX_REFRACTORY_STEPS:
        return (f"the refractory period {period:g} is {period / dt:g} steps of dt = {dt:g}, more than the "
                f"{MAX_REFRACTORY_STEPS} a step counter holds")
    return None


def check_values(model: NeuronModel, values: dict[str, float], given: set[str]) -> None:
    """Refuse parameter values the language forbids beyond finiteness (`dt` a positive normal
    number; a refractory period >= 0 of at most MAX_REFRACTORY_STEPS steps): the same rules for
    the spec's own values and every value that replaces one (``params=``, ``--param``,
    ``load_state_dict``, NIR), named in ``given``; a SpecError at the parameter's line otherwise."""
    c = model.continuous
    if c is None:
        return

    def origin(names: list[str]) -> str:
        shown = [n for n in names if n in given] or names
        return ", ".join(f"{n} = {values[n]:g}" for n in shown) + (" as given" if set(shown) & given else "")
    dt = float(values["dt"])
    problem = dt_problem(dt)
    if problem is not None:
        raise SpecError(f"{problem} ({origin(['dt'])})", model.parameters["dt"].pos, DT_HINT)
    if c.period is not None:
        period = sympy.sympify(c.period).xreplace({real_symbol(n): sympy.Float(v) for n, v in values.items()})
        problem = period_problem(float(period), dt)
        if problem is not None:
            raise SpecError(f"{problem} ({origin(sorted({s.name for s in c.period.free_symbols} | {'dt'}))})",
                            c.period_pos, "give a period >= 0 of at most that many steps")


def refractory_steps(period: float, dt: float, pos: SourcePos | None) -> tuple[int, SpecWarning | None]:
    """n = round(period / dt): the steps a spike makes the neuron refractory, the spike step included;
    and a warning when the period is not a whole number of steps."""
    ratio = period / dt
    steps = round(ratio)
    if abs(ratio - steps) <= 1e-9 * max(1.0, ratio):
        return steps, None
    return steps, SpecWarning(f"the refractory period {period:g} is {ratio:g} steps of dt = {dt:g}: it rounds to "
                              f"{steps} steps ({steps * dt:g} time units)", pos,
                              "make the period a whole multiple of dt")


@dataclass(frozen=True)
class Folded:
    """A model's expressions with the constant parameters substituted and folded by sympy
    (learnable parameters stay symbols); every constant in them is a finite float64."""

    steps: tuple[sympy.Expr, ...]
    initial_states: tuple[sympy.Expr, ...]
    constants: dict[sympy.Symbol, sympy.Expr]  # constant parameters, and steps that fold to a number


def _finite(expr: sympy.Expr) -> bool:
    """Whether every constant part of ``expr`` (each is printed as one float literal) is a
    finite real float64: no infinity, NaN, complex number or value beyond 1.8e308."""
    stack = [expr]
    while stack:
        e = stack.pop()
        if isinstance(e, sympy.Expr) and e.is_number and not e.has(Spike, Detach):
            try:
                number = complex(e)
            except (TypeError, ValueError, OverflowError, ZeroDivisionError):  # zoo, nan, 1e400 as a Float
                return False
            if number.imag != 0 or not math.isfinite(number.real):
                return False
        else:
            stack.extend(e.args)
    return True


def _finite_with(expr: sympy.Expr, values: dict[sympy.Symbol, sympy.Expr]) -> bool:
    """:func:`_finite` of ``expr`` with ``values`` substituted."""
    try:
        return _finite(expr.xreplace(values))
    except (TypeError, ValueError, ZeroDivisionError):  # e.g. "Invalid comparison of non-real zoo"
        return False


def fold_values(model: NeuronModel, values: dict[str, float],
                describe: Callable[[str], str] | None = None, steps: list[Assignment] | None = None) -> Folded:
    """Substitute parameter ``values`` into the model and fold constants; refuse a step or
    initial value that becomes infinite, NaN or complex (x / tau with tau: 0, tau * 1e308).

    Runtime (learnable or shaped) parameters stay symbols in the result but are checked with their initial
    values too. ``describe(name)`` says where a parameter's value came from. ``steps`` are the
    lines to fold (default: the model's, with a continuous-time model's equations, threshold and
    reset as lines)."""
    describe = describe or (lambda n: f"{n} = {values[n]:g}")
    runtime = set(model.runtime_params)  # learnable or shaped
    constants = {real_symbol(n): sympy.Float(v) for n, v in values.items() if n not in runtime}
    checked = {**constants, **{real_symbol(n): sympy.Float(values[n]) for n in runtime}}
    hint = ("a division by zero, log/sqrt of a number <= 0, or a number beyond 1.8e308: change the "
            "parameter value, or guard the expression with where(...)")

    folded_steps: dict[sympy.Symbol, Assignment] = {}  # steps that fold to a number

    def fold(expr: sympy.Expr, what: str, pos: SourcePos) -> sympy.Expr:
        try:
            folded = sympy.sympify(expr).xreplace(constants)
            if _finite(folded) and _finite_with(folded, checked):
                return folded
        except (TypeError, ValueError, ZeroDivisionError):  # e.g. "Invalid comparison of non-real zoo"
            pass
        culprits = [describe(s.name) for s in sorted(expr.free_symbols, key=str) if s.name in values] + \
                   [f"{folded_steps[s].name} = {float(constants[s]):g} (line {folded_steps[s].pos.line})"
                    for s in sorted(expr.free_symbols, key=str) if s in folded_steps]
        raise SpecError(f"{what} is not a finite real number" + (f" with {', '.join(culprits)}" if culprits else ""),
                        pos, hint)

    folded_lines = []
    for step in (model.checked_lines if steps is None else steps):
        what = f"step {step.name!r}" if model.continuous is None or steps is not None else step.name
        folded = fold(step.expr, what, step.pos)
        if folded.is_number:
            constants[step.symbol] = checked[step.symbol] = folded
            folded_steps[step.symbol] = step
        folded_lines.append(folded)
    inits = [fold(state.init, f"the initial value of state {state.name!r}", state.pos)
             for state in model.states.values()]
    return Folded(tuple(folded_lines), tuple(inits), constants)


def build_model(text: str, file: str, plugins: Plugins) -> NeuronModel:
    """Parse and validate spec text; raise :class:`SpecError` with the source line on bad input."""
    lines = text.splitlines()
    try:
        root = parse_yaml(text, file)
        model = _Builder(root, text, file, plugins).build()
    except SpecError as exc:
        raise exc.with_source(lines) from None
    for warning in model.warnings:
        warnings.warn(warning, stacklevel=3)
    return model


def read_model(path: str | Path, plugins: Plugins) -> NeuronModel:
    """Read (:func:`source.read_spec`) and validate a spec file."""
    return build_model(read_spec(path), str(path), plugins)
