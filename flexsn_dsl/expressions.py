"""Expressions: a whitelisted grammar parsed with Python's ``ast``, built into sympy.

No text is ever evaluated: ``ast.parse`` only builds a syntax tree, which is
walked node by node; anything outside the grammar of the language is refused
with the position of the offending token.
"""
from __future__ import annotations

import ast
import contextvars
import difflib
import math
import operator
from dataclasses import dataclass
from typing import Callable, Mapping

import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.logic.boolalg import ITE

from .errors import SourcePos, SpecError
from .symbolic import DRAW_KINDS, Detach, Sigmoid, Spike, draw_symbol, is_white_noise_name, white_noise_symbol

MAX_EXPR_CHARS = 4000
MAX_EXPR_NODES = 2000
MAX_EXPR_DEPTH = 60


MAX_CONDITION_NODES = 20_000  # nodes that conditions may expand into, per spec (see _unfold)
_BUDGET: contextvars.ContextVar[list[int] | None] = contextvars.ContextVar("flexsn_dsl_condition_budget",
                                                                           default=None)


class TooManyCases(ValueError):
    """Conditions that would expand into more than MAX_CONDITION_NODES nodes."""


def _size(expr, memo: dict) -> int:
    """The number of nodes of ``expr`` as a tree (shared subtrees counted each time), memoized."""
    key = id(expr)
    if key not in memo:  # the value keeps ``expr`` alive, so its id is not reused meanwhile
        memo[key] = (expr, 1 + sum(_size(arg, memo) for arg in expr.args))
    return memo[key][1]


def _fold_constant_calls(expr: sympy.Basic) -> sympy.Basic:
    """spike/detach/sigmoid of constants as numbers (sympy loops on them inside comparisons)."""
    def constant_call(e):
        return isinstance(e, (Spike, Detach, Sigmoid)) and e.args[0].is_number

    def fold(e):
        a = e.args[0]
        return _heaviside(a) if isinstance(e, Spike) else a if isinstance(e, Detach) else 1 / (1 + sympy.exp(-a))
    return expr.replace(constant_call, fold) if expr.has(Spike, Detach, Sigmoid) else expr


def _unfold(cond, budget: list[int] | None = None, memo: dict | None = None):
    """``cond`` without Piecewise inside: ``P < b`` becomes ``(c1 & (e1 < b)) | (~c1 & c2 & (e2 < b)) | ...``.

    A Piecewise inside a condition (``where(clip(x, 0, 1) > 0.5, ...)``, ``max(relu(a), b)``)
    is otherwise folded by sympy, which simplifies the result at a cost exponential in the
    number of comparisons (a few nested clips take minutes) and leaves ITE, which the IR
    does not have. This expansion is plain rewriting; its size is charged to ``budget``
    (the parser's, else MAX_CONDITION_NODES) and TooManyCases is raised when it runs out.
    """
    if not isinstance(cond, sympy.Basic) or not cond.has(sympy.Piecewise):
        return cond
    if budget is None:
        budget = _BUDGET.get() or [MAX_CONDITION_NODES]
    memo = {} if memo is None else memo
    if isinstance(cond, (sympy.And, sympy.Or)):
        return cond.func(*[_unfold(arg, budget, memo) for arg in cond.args])
    if isinstance(cond, sympy.Not):
        return sympy.Not(_unfold(cond.args[0], budget, memo)).to_nnf(simplify=False)
    inner = next(e for e in sympy.preorder_traversal(cond) if isinstance(e, sympy.Piecewise))
    branches, earlier = [], []
    for expr, case in inner.args:
        case = _unfold(case, budget, memo)
        rest = _unfold(_fold_constant_calls(cond.xreplace({inner: expr})), budget, memo)
        budget[0] -= 1 + _size(case, memo) + sum(_size(c, memo) for c in earlier) + _size(rest, memo)
        if budget[0] < 0:
            raise TooManyCases(f"conditions would expand into more than {MAX_CONDITION_NODES} terms")
        guard = sympy.And(case, *[sympy.Not(c).to_nnf(simplify=False) for c in earlier])
        branches.append(sympy.And(guard, rest))
        earlier.append(case)
    return sympy.Or(*branches)


def _piecewise(*pairs) -> sympy.Expr:
    return sympy.Piecewise(*[(expr, _unfold(cond)) for expr, cond in pairs])


def _heaviside_step(a: sympy.Expr, h0: sympy.Expr) -> sympy.Expr:
    """heaviside(a, h0): 0 where a < 0, h0 where a == 0, 1 where a > 0 (numpy's); h0 = 1 when left out,
    so heaviside(a) is spike(a)'s forward (1 where a >= 0). A Piecewise of constants: no gradient
    through ``a`` (spike() is the step with a surrogate gradient)."""
    if h0 == 1:
        return _piecewise((1, a >= 0), (0, True))
    return _piecewise((0, a < 0), (1, a > 0), (h0, True))


def _indicator(cond) -> sympy.Expr:
    """A condition as a value: 1 where it holds, else 0 (no gradient)."""
    return _piecewise((1, cond), (0, True))


def _heaviside(a: sympy.Expr) -> sympy.Expr:
    """spike() of a constant (e.g. spike(pi - 3)): 1 or 0. Left as Spike(pi - 3), sympy loops
    forever when such a term meets a comparison."""
    return sympy.Integer(1) if bool(a >= 0) else sympy.Integer(0)


@dataclass(frozen=True)
class Function:
    """A function of the language: its arity and how it maps to sympy."""

    arity: int
    build: Callable[..., sympy.Expr]
    condition_arg: bool = False  # first argument is a condition (where)
    optional: int = 0  # trailing arguments that may be left out (heaviside(x, h0))
    pairs: bool = False  # any number of (value, condition) arguments, the last condition may be True (Piecewise)


DSL_FUNCTIONS: dict[str, Function] = {
    "exp": Function(1, sympy.exp),
    "log": Function(1, sympy.log),
    "sqrt": Function(1, sympy.sqrt),
    "abs": Function(1, sympy.Abs),
    "sin": Function(1, sympy.sin),
    "cos": Function(1, sympy.cos),
    "tanh": Function(1, sympy.tanh),
    "cosh": Function(1, sympy.cosh),
    "sinh": Function(1, sympy.sinh),
    "tan": Function(1, sympy.tan),
    "atan": Function(1, sympy.atan),
    "erf": Function(1, sympy.erf),
    "expm1": Function(1, expm1),
    "log1p": Function(1, log1p),
    "sigmoid": Function(1, lambda a: 1 / (1 + sympy.exp(-a)) if a.is_number else Sigmoid(a)),
    "relu": Function(1, lambda a: _piecewise((a, a > 0), (0, True))),
    "min": Function(2, lambda a, b: _piecewise((a, a <= b), (b, True))),
    "max": Function(2, lambda a, b: _piecewise((a, a >= b), (b, True))),
    "clip": Function(3, lambda a, lo, hi: _piecewise((lo, a < lo), (hi, a > hi), (a, True))),
    "where": Function(3, lambda c, a, b: _piecewise((a, c), (b, True)), condition_arg=True),
    "sign": Function(1, lambda a: _piecewise((1, a > 0), (-1, a < 0), (0, True))),
    "heaviside": Function(2, lambda a, h0=sympy.Integer(1): _heaviside_step(a, h0), optional=1),
    "spike": Function(1, lambda a: _heaviside(a) if a.is_number else Spike(a)),
    "detach": Function(1, lambda a: a if a.is_number else Detach(a)),
    # draws: a fresh number per occurrence, element, step and call (the parser numbers the occurrences)
    "rand": Function(0, draw_symbol),
    "randn": Function(0, draw_symbol),
}

# Extra names accepted in surrogate gradient formulas (sympy spellings).
SURROGATE_FUNCTIONS: dict[str, Function] = {
    **{k: v for k, v in DSL_FUNCTIONS.items() if k not in ("spike", "detach", *DRAW_KINDS)},
    "Abs": Function(1, sympy.Abs),
    "Max": Function(2, sympy.Max),
    "Min": Function(2, sympy.Min),
    "Heaviside": Function(1, lambda a: sympy.Heaviside(a, sympy.Rational(1, 2))),
    "sign": Function(1, sympy.sign),
    "Piecewise": Function(0, _piecewise, pairs=True),
    "Pow": Function(2, sympy.Pow),
    "Rational": Function(2, lambda p, q: p / q),
    "sech": Function(1, lambda a: 1 / sympy.cosh(a)),
    "asinh": Function(1, lambda a: sympy.log(a + sympy.sqrt(a ** 2 + 1))),
}
# What users write for a function of the language under another name (other libraries' spellings).
FUNCTION_SYNONYMS = {"heaviside": "heaviside", "step": "spike", "unit_step": "spike", "sgn": "sign",
                     "signum": "sign", "arctan": "atan", "ln": "log", "fabs": "abs",
                     "maximum": "max", "minimum": "min", "clamp": "clip", "logistic": "sigmoid", "exp_m1": "expm1",
                     "log_1p": "log1p", "expit": "sigmoid", "absolute": "abs", "cosine": "cos", "sine": "sin",
                     "tangent": "tan", "arctangent": "atan", "arcsin": None, "arccos": None, "asin": None,
                     "acos": None, "asinh": None, "arcsinh": None, "acosh": None, "arccosh": None, "atanh": None,
                     "arctanh": None}
# What users call as a function that the language writes with an operator.
WRITTEN_OTHERWISE = {"pow": "a ** b", "power": "a ** b", "square": "a ** 2", "exp2": "2 ** a",
                     "log10": "log(a) / log(10)", "log2": "log(a) / log(2)"}

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_OPERATORS = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv, "**": operator.pow}
_OTHER_BINOPS = {ast.FloorDiv: "//", ast.Mod: "%", ast.MatMult: "@", ast.LShift: "<<", ast.RShift: ">>",
                 ast.BitXor: "^"}
_CMPOPS = {ast.Lt: sympy.StrictLessThan, ast.LtE: sympy.LessThan, ast.Gt: sympy.StrictGreaterThan,
           ast.GtE: sympy.GreaterThan, ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne}
_GRAMMAR_HINT = "use numbers, names, + - * / **, parentheses and the listed functions"
# Python syntax outside the language: (what it is called, what to do instead).
_SYNTAX = {
    ast.Attribute: ("attribute access (a.b)", _GRAMMAR_HINT),
    ast.Subscript: ("indexing (a[i])", _GRAMMAR_HINT),
    ast.Lambda: ("lambda", _GRAMMAR_HINT),
    ast.JoinedStr: ("an f-string", "write an expression, not text"),
    ast.IfExp: ("`a if c else b`", "write where(c, a, b)"),
    ast.NamedExpr: ("`:=`", "assign names on their own step lines"),
    ast.Tuple: ("a tuple", "write one expression; functions take their arguments in parentheses, f(a, b)"),
    ast.List: ("a list", "write one expression"),
    ast.Dict: ("a dict", "write one expression"),
    ast.Set: ("a set", "write one expression"),
    ast.ListComp: ("a comprehension", "write one expression"),
    ast.SetComp: ("a comprehension", "write one expression"),
    ast.DictComp: ("a comprehension", "write one expression"),
    ast.GeneratorExp: ("a generator expression", "write one expression"),
    ast.Starred: ("`*` unpacking", "pass the arguments one by one"),
    ast.Await: ("await", _GRAMMAR_HINT),
    ast.Yield: ("yield", _GRAMMAR_HINT),
    ast.YieldFrom: ("yield", _GRAMMAR_HINT),
    ast.Slice: ("a slice", _GRAMMAR_HINT),
}
# Functions whose result is a Piecewise with a condition on their arguments.
_CONDITIONAL = ("where", "relu", "min", "max", "clip", "sign", "heaviside")
_NOT_FINITE = "is not a finite real number"


def _without_ite(expr: sympy.Basic) -> sympy.Basic:
    """Rewrite ITE(c, a, b) as (c & a) | (~c & b).

    sympy folds a Piecewise inside a condition (e.g. ``where(clip(x, 0, 1) > 0.5, ...)``)
    into ITE, which is not in the vocabulary of the IR: conditions are comparisons
    combined with And and Or.
    """
    if not expr.has(ITE):
        return expr

    def rewrite(c, a, b):
        return sympy.Or(sympy.And(c, a), sympy.And(sympy.Not(c).to_nnf(simplify=False), b))
    return expr.replace(lambda e: isinstance(e, ITE), lambda e: rewrite(*e.args))


def closest(name: str, candidates) -> str:
    """' (did you mean X?)' for the closest candidate, or ''."""
    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else ""


def closest_function(name: str, functions) -> str:
    """The hint for an unknown function: the function of the same meaning where there is one
    (``step`` -> ``spike``), or its writing with an operator (``pow`` -> ``a ** b``), else the closest in
    spelling, else the list."""
    meaning = FUNCTION_SYNONYMS.get(name.lower(), "")
    if name.lower() in WRITTEN_OTHERWISE:
        return f"write {WRITTEN_OTHERWISE[name.lower()]}"
    if meaning is None:
        return f"{name}() is not in the language: functions: {', '.join(sorted(functions))}"
    if meaning in functions:
        steps = " (spike(u) is the step whose gradient is the surrogate; heaviside(u) the step with none)" \
            if meaning in ("spike", "heaviside") and {"spike", "heaviside"} <= set(functions) else ""
        return f"did you mean {meaning!r}? (the language's name for it){steps}"
    return closest(name, functions) or f"functions: {', '.join(sorted(functions))}"


class ExpressionParser:
    """Parses one expression string against an environment of names.

    ``env`` maps the names in scope to sympy expressions; ``later`` maps names
    that exist but are not yet usable (assigned further down) to where they are
    assigned, for a precise message; ``current`` is the name being defined (a use
    of it is a self-reference); ``forbidden`` maps names that exist but may not be
    used here to why (e.g. states in an initial value); ``budget`` is a one-item list
    of the condition terms left (see ``_unfold``), shared to bound a whole spec. ``draws`` is the
    spec's list of draws so far (``rand()``, ``randn()``): each call appends its symbol, numbered by
    its place in the list; None where draws are not allowed. ``noise``: white noise (``xi``,
    ``xi_<suffix>``) may be used (equations). After :meth:`parse`, ``nodes`` is the size of the
    expression's syntax tree.
    """

    def __init__(self, env: Mapping[str, sympy.Expr], functions: Mapping[str, Function] = DSL_FUNCTIONS,
                 later: Mapping[str, SourcePos] | None = None, what: str = "expression",
                 current: str | None = None, forbidden: Mapping[str, tuple[str, str]] | None = None,
                 budget: list[int] | None = None, draws: list[sympy.Symbol] | None = None,
                 noise: bool = False):
        self.env = env
        self.draws = draws
        self.noise = noise
        self.functions = functions
        self.later = later or {}
        self.what = what
        self.current = current
        self.forbidden = forbidden or {}
        self.budget = budget if budget is not None else [MAX_CONDITION_NODES]
        self.nodes = 0

    def parse(self, text: str, locate: Callable[[int, int], SourcePos], comparison: bool = False) -> sympy.Basic:
        """Parse ``text``; ``locate(line, col)`` maps a place in ``text`` (line 1-based,
        col a 0-based character offset in that line) to the file. With ``comparison``, the
        whole text may also be a condition: comparisons, joined with & and | (a sympy relational
        or boolean is returned)."""
        self.locate = locate
        self.text = text
        if len(text) > MAX_EXPR_CHARS:
            raise SpecError(f"{self.what} is {len(text)} characters long, more than the limit of {MAX_EXPR_CHARS}",
                            locate(1, 0), "split it into several step lines")
        stripped = text.strip()
        if not stripped:
            raise SpecError(f"empty {self.what}", locate(1, 0), "write an expression here")
        self.lead = len(text) - len(text.lstrip())
        self.lines = stripped.split("\n")
        bad = next((i for i, ch in enumerate(stripped) if ch == "\x00"), None)
        if bad is not None:
            raise SpecError(f"{self.what} contains a NUL character", self._at_index(bad), "remove it")
        try:
            tree = ast.parse(stripped, mode="eval")
        except SyntaxError as exc:
            pos = self._at(exc.lineno or 1, (exc.offset or 1) - 1, chars=True)
            message = (exc.msg or "invalid syntax").replace("Perhaps you forgot a comma?", "").rstrip(" .")
            raise SpecError(f"syntax error in {self.what}: {message}", pos, _GRAMMAR_HINT) from None
        except (RecursionError, MemoryError, ValueError):
            raise SpecError(f"{self.what} is nested too deeply", locate(1, 0),
                            "split it into several step lines") from None
        self._check_size(tree.body)
        token = _BUDGET.set(self.budget)
        try:
            joined = isinstance(tree.body, ast.BinOp) and isinstance(tree.body.op, (ast.BitAnd, ast.BitOr))
            if comparison and (isinstance(tree.body, ast.Compare) or joined):
                expr = self._condition(tree.body)
            else:
                expr = self._expr(tree.body)
        except (RecursionError, MemoryError):
            raise SpecError(f"{self.what} is too complex", self._pos(tree.body),
                            "split it into several step lines") from None
        finally:
            _BUDGET.reset(token)
        return expr

    # -- positions -----------------------------------------------------------
    def _at(self, lineno: int, col: int, chars: bool = False) -> SourcePos:
        """The file position of (line, col) of the stripped text; ``col`` counts UTF-8 bytes
        (as ``ast`` does) unless ``chars``."""
        lineno = min(max(lineno, 1), len(self.lines))
        line_text = self.lines[lineno - 1]
        if not chars:
            col = len(line_text.encode("utf-8")[:max(col, 0)].decode("utf-8", "ignore"))
        col = min(max(col, 0), len(line_text))
        return self._at_index(sum(len(line) + 1 for line in self.lines[:lineno - 1]) + col)

    def _at_index(self, index: int) -> SourcePos:
        index += self.lead
        line = self.text.count("\n", 0, index) + 1
        return self.locate(line, index - (self.text.rfind("\n", 0, index) + 1))

    def _pos(self, node: ast.AST) -> SourcePos:
        return self._at(getattr(node, "lineno", 1), getattr(node, "col_offset", 0))

    def _check_size(self, root: ast.AST) -> None:
        """Bound the tree: nodes, and nesting (a chain a + b + c + ... counts as one level)."""
        count = 0
        stack = [(root, 1)]
        while stack:
            node, depth = stack.pop()
            count += 1
            if depth > MAX_EXPR_DEPTH:
                raise SpecError(f"{self.what} is nested more than {MAX_EXPR_DEPTH} levels deep", self._pos(node),
                                "split it into several step lines")
            if count > MAX_EXPR_NODES:
                raise SpecError(f"{self.what} has more than {MAX_EXPR_NODES} terms", self._pos(root),
                                "split it into several step lines")
            for child in ast.iter_child_nodes(node):
                chained = isinstance(node, ast.BinOp) and child is node.left and isinstance(child, ast.BinOp)
                stack.append((child, depth if chained else depth + 1))
        self.nodes = count

    def _fail(self, node: ast.AST, message: str, hint: str = "") -> SpecError:
        return SpecError(message, self._pos(node), hint)

    def _finite(self, node: ast.AST, value: sympy.Expr, what: str = "the value") -> sympy.Expr:
        """Refuse constants that are infinite, NaN or complex (log(0), sqrt(-1), exp(1000), ...)."""
        if not value.is_number:
            return value
        try:
            number = complex(value)
            ok = number.imag == 0 and math.isfinite(number.real)
        except (OverflowError, TypeError, ValueError, ZeroDivisionError):
            ok = False
        if not ok:
            raise self._fail(node, f"{what} {_NOT_FINITE}",
                             "check the arguments (log and sqrt need positive numbers; numbers must fit a float64)")
        return value

    # -- grammar -----------------------------------------------------------
    def _expr(self, node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise self._fail(node, f"{node.value!r} is not a number", "only numbers are allowed as literals")
            if isinstance(node.value, float) and not math.isfinite(node.value):
                raise self._fail(node, "this number is too large for a float64", "write a smaller number")
            if isinstance(node.value, int) and abs(node.value) > 1e308:
                raise self._fail(node, "this number is too large for a float64", "write a smaller number")
            return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(node.value)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self._expr(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            chain = []  # a + b + c + ... is nested to the left: walk it without recursion
            while isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
                chain.append(node)
                node = node.left
            value = self._expr(node)
            for link in reversed(chain):
                value = self._binop(link, value, self._expr(link.right))
            return value
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare) or (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr))):
            cond = self._condition(node)  # a comparison as a value: 1 where it holds, else 0 (no gradient)
            try:
                return _indicator(cond)
            except TooManyCases as exc:
                raise self._fail(node, f"this comparison nests too many conditional functions "
                                       f"({', '.join(_CONDITIONAL)}): {exc}",
                                 "give the inner part its own step line (e.g. m: max(a, b)) and use that name here"
                                 ) from None
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise self._sympy_error(node, exc) from None
        if isinstance(node, ast.BoolOp):
            raise self._fail(node, "`and`/`or` are not part of the language",
                             "combine comparisons with & and |, e.g. where((a > 0) & (b < 1), x, y)")
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            raise self._fail(node, "`not` is not part of the language",
                             "use the opposite comparison, e.g. a <= b for not (a > b)")
        if isinstance(node, ast.UnaryOp):
            raise self._fail(node, "operator ~ is not part of the language", _GRAMMAR_HINT)
        if isinstance(node, ast.BinOp) and type(node.op) in _OTHER_BINOPS:
            op = _OTHER_BINOPS[type(node.op)]
            raise self._fail(node, f"operator {op} is not part of the language",
                             "operators are + - * / ** (and & | between comparisons)")
        name, hint = _SYNTAX.get(type(node), (f"{type(node).__name__} syntax", _GRAMMAR_HINT))
        raise self._fail(node, f"{name} is not part of the language", hint)

    def _binop(self, node: ast.BinOp, left: sympy.Expr, right: sympy.Expr) -> sympy.Expr:
        op = _BINOPS[type(node.op)]
        if op == "/" and right.is_Number and right.is_zero:
            raise self._fail(node, "division by zero", "check the denominator")
        if op == "**":
            self._check_power(node, left, right)
        try:
            value = _OPERATORS[op](left, right)
        except (TypeError, ValueError, ArithmeticError) as exc:
            raise self._sympy_error(node, exc) from None
        return self._finite(node, value, "the result of this operation")

    def _sympy_error(self, node: ast.AST, exc: Exception) -> SpecError:
        detail = f" ({exc})" if str(exc) else ""
        return self._fail(node, f"this expression is not a finite real number for some values{detail}",
                          "a branch divides by zero or takes log/sqrt of a negative number: "
                          "guard it with where(...) or change it")

    def _check_power(self, node: ast.BinOp, base: sympy.Expr, exponent: sympy.Expr) -> None:
        """Refuse constant powers that would be huge, infinite or complex before sympy computes them."""
        if not (base.is_Number and exponent.is_Number):
            return
        if base.is_zero and exponent < 0:
            raise self._fail(node, "division by zero (0 to a negative power)", "check the base and the exponent")
        if base < 0 and not exponent.is_Integer:
            raise self._fail(node, f"a negative number to a non-integer power {_NOT_FINITE}",
                             "check the base and the exponent")
        magnitude = abs(float(base))
        digits = float(exponent) * math.log10(magnitude) if magnitude not in (0.0, 1.0) else 0.0
        if digits > 308 or digits < -10_000:  # too large for a float64; too small to compute exactly in time
            raise self._fail(node, "this power is out of the range of a float64", "check the base and the exponent")

    def _name(self, node: ast.Name) -> sympy.Expr:
        name = node.id
        if name in self.env:
            return self.env[name]
        if name == "pi":
            return sympy.pi
        if is_white_noise_name(name) and name not in self.forbidden:
            if self.noise:
                return white_noise_symbol(name)
            raise self._fail(node, f"{name!r} is white noise, which only `equations` right-hand sides may use "
                                   f"(not {self.what})",
                             "draw a standard normal number per step with randn() instead, e.g. "
                             "v: v + sigma * sqrt(dt) * randn()")
        if name in self.forbidden:
            message, hint = self.forbidden[name]
            raise self._fail(node, message, hint)
        if name == self.current:
            raise self._fail(node, f"{name!r} is used in its own definition",
                             f"to use the previous value of {name!r}, declare it as a state "
                             f"(states: {{{name}: 0.0}}); otherwise compute it from other names")
        if name in self.later:
            where = self.later[name]
            raise self._fail(node, f"{name!r} is used before it is assigned (it is assigned at line {where.line})",
                             "move this line below the assignment, or use a state, input or parameter")
        if name in self.functions:
            raise self._fail(node, f"{name!r} is a function", f"call it: {name}(...)")
        hint = closest(name, list(self.env) + list(self.later))
        raise self._fail(node, f"unknown name {name!r}", hint or "declare it as an input, parameter or state, or assign it in step")

    def _call(self, node: ast.Call) -> sympy.Expr:
        if not isinstance(node.func, ast.Name):
            raise self._fail(node, "only the language's functions can be called", f"functions: {', '.join(sorted(self.functions))}")
        name = node.func.id
        function = self.functions.get(name)
        if function is None:
            raise self._fail(node.func, f"unknown function {name!r}", closest_function(name, self.functions))
        if node.keywords:
            raise self._fail(node.keywords[0], f"{name}() takes no keyword arguments", "pass arguments by position")
        starred = next((a for a in node.args if isinstance(a, ast.Starred)), None)
        if starred is not None:
            raise self._fail(starred, "`*` unpacking is not part of the language", "pass the arguments one by one")
        if name in DRAW_KINDS:
            return self._draw(node, name)
        fewest = function.arity - function.optional
        if function.pairs:
            args = [self._pair(a, name) for a in node.args]
            if not args:
                raise self._fail(node, f"{name}() takes (value, condition) pairs, got none",
                                 f"write e.g. {name}((1 - Abs(x), Abs(x) < 1), (0, True))")
        elif not fewest <= len(node.args) <= function.arity:
            counts = " or ".join(str(n) for n in range(fewest, function.arity + 1))
            forms = " or ".join(f"{name}({', '.join('abc'[:n])})" for n in range(fewest, function.arity + 1))
            raise self._fail(node, f"{name}() takes {counts} argument{'s' if function.arity != 1 else ''}, "
                                   f"got {len(node.args)}", f"write {forms}")
        elif function.condition_arg:
            args = [self._condition(node.args[0])] + [self._expr(a) for a in node.args[1:]]
        else:
            args = [self._expr(a) for a in node.args]
        try:
            value = _without_ite(function.build(*args))
        except TooManyCases as exc:
            raise self._fail(node, f"the condition of this {name}() nests too many conditional functions "
                                   f"({', '.join(_CONDITIONAL)}): {exc}",
                             "give the inner part its own step line (e.g. m: max(a, b)) and use that name here"
                             ) from None
        except (TypeError, ValueError, ArithmeticError) as exc:  # e.g. "Invalid comparison of non-real I"
            raise self._sympy_error(node, exc) from None
        return self._finite(node, value, f"{name}(...)")

    def _pair(self, node: ast.AST, name: str) -> tuple[sympy.Expr, sympy.Basic]:
        """A ``(value, condition)`` argument of a Piecewise; the condition may be ``True``."""
        if not (isinstance(node, ast.Tuple) and len(node.elts) == 2):
            raise self._fail(node, f"each argument of {name}() is a (value, condition) pair",
                             f"write e.g. {name}((1 - Abs(x), Abs(x) < 1), (0, True))")
        value, cond = node.elts
        holds = isinstance(cond, ast.Constant) and cond.value is True
        return self._expr(value), sympy.true if holds else self._condition(cond)

    def _draw(self, node: ast.Call, kind: str) -> sympy.Symbol:
        """A new draw: its symbol, numbered by its occurrence in the spec."""
        if node.args:
            scaled = "a + (b - a) * rand()" if kind == "rand" else "mu + sigma * randn()"
            raise self._fail(node.args[0], f"{kind}() takes no arguments, got {len(node.args)}",
                             f"write {kind}(); for another range or scale, e.g. {scaled}")
        if self.draws is None:
            raise self._fail(node, f"{self.what} may not use {kind}(): it is computed once, not per step",
                             "use numbers and parameters here; draw in `step`, `equations`, `threshold` or `reset`")
        symbol = draw_symbol(kind, len(self.draws))
        self.draws.append(symbol)
        return symbol

    def _joined(self, node: ast.AST):
        """An operand of & or |: a comparison (or a parenthesised join of them)."""
        if isinstance(node, ast.Compare) or (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr))):
            return self._condition(node)
        raise self._fail(node, "& and | join comparisons", "compare this operand, e.g. (s > 0) & (x < 1); "
                                                          "to multiply or add values use * and +")

    def _condition(self, node: ast.AST):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            chain = []  # (a > 0) & (b > 0) & ... is nested to the left: walk it without recursion
            while isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
                chain.append(node)
                node = node.left
            value = self._joined(node)
            for link in reversed(chain):
                right = self._joined(link.right)
                try:
                    value = sympy.And(value, right) if isinstance(link.op, ast.BitAnd) else sympy.Or(value, right)
                except (TypeError, ValueError, ArithmeticError) as exc:
                    raise self._sympy_error(link, exc) from None
            return value
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    raise self._fail(node, "only < <= > >= == != comparisons are allowed",
                                     "compare numbers with < <= > >= == != (not `is` or `in`)")
            terms = [self._expr(node.left)] + [self._expr(c) for c in node.comparators]
            try:
                parts = [_CMPOPS[type(op)](terms[i], terms[i + 1]) for i, op in enumerate(node.ops)]
            except (TypeError, ValueError, ArithmeticError) as exc:
                raise self._sympy_error(node, exc) from None
            return sympy.And(*parts) if len(parts) > 1 else parts[0]
        if isinstance(node, ast.BoolOp):
            raise self._fail(node, "`and`/`or` are not part of the language",
                             "combine comparisons with & and |, e.g. where((a > 0) & (b < 1), x, y)")
        raise self._fail(node, "the condition of where() must be a comparison",
                         "compare with < <= > >= == != and combine with & and |, e.g. where(v > 0, a, b)")
