"""Expressions: a whitelisted grammar parsed with Python's ``ast``, built into sympy.

No text is ever evaluated: ``ast.parse`` only builds a syntax tree, which is
walked node by node; anything outside the grammar of the language is refused
with the position of the offending token.
"""
from __future__ import annotations

import ast
import difflib
from dataclasses import dataclass
from typing import Callable, Mapping

import sympy

from .errors import SourcePos, SpecError
from .symbolic import Detach, Sigmoid, Spike

MAX_EXPR_CHARS = 4000
MAX_EXPR_NODES = 2000
MAX_EXPR_DEPTH = 60


def _piecewise(*pairs) -> sympy.Expr:
    return sympy.Piecewise(*pairs)


@dataclass(frozen=True)
class Function:
    """A function of the language: its arity and how it maps to sympy."""

    arity: int
    build: Callable[..., sympy.Expr]
    condition_arg: bool = False  # first argument is a condition (where)


DSL_FUNCTIONS: dict[str, Function] = {
    "exp": Function(1, sympy.exp),
    "log": Function(1, sympy.log),
    "sqrt": Function(1, sympy.sqrt),
    "abs": Function(1, sympy.Abs),
    "sin": Function(1, sympy.sin),
    "cos": Function(1, sympy.cos),
    "tanh": Function(1, sympy.tanh),
    "sigmoid": Function(1, Sigmoid),
    "relu": Function(1, lambda a: _piecewise((a, a > 0), (0, True))),
    "min": Function(2, lambda a, b: _piecewise((a, a <= b), (b, True))),
    "max": Function(2, lambda a, b: _piecewise((a, a >= b), (b, True))),
    "clip": Function(3, lambda a, lo, hi: _piecewise((lo, a < lo), (hi, a > hi), (a, True))),
    "where": Function(3, lambda c, a, b: _piecewise((a, c), (b, True)), condition_arg=True),
    "spike": Function(1, Spike),
    "detach": Function(1, Detach),
}

# Extra names accepted in surrogate gradient formulas (sympy spellings).
SURROGATE_FUNCTIONS: dict[str, Function] = {
    **{k: v for k, v in DSL_FUNCTIONS.items() if k not in ("spike", "detach")},
    "Abs": Function(1, sympy.Abs),
    "Max": Function(2, sympy.Max),
    "Min": Function(2, sympy.Min),
    "Heaviside": Function(1, lambda a: sympy.Heaviside(a, sympy.Rational(1, 2))),
    "sign": Function(1, sympy.sign),
    "atan": Function(1, sympy.atan),
    "erf": Function(1, sympy.erf),
    "cosh": Function(1, sympy.cosh),
    "sinh": Function(1, sympy.sinh),
}

_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/", ast.Pow: "**"}
_CMPOPS = {ast.Lt: sympy.StrictLessThan, ast.LtE: sympy.LessThan, ast.Gt: sympy.StrictGreaterThan,
           ast.GtE: sympy.GreaterThan, ast.Eq: sympy.Eq, ast.NotEq: sympy.Ne}


def closest(name: str, candidates) -> str:
    """' (did you mean X?)' for the closest candidate, or ''."""
    match = difflib.get_close_matches(name, sorted(candidates), n=1, cutoff=0.6)
    return f"did you mean {match[0]!r}?" if match else ""


class ExpressionParser:
    """Parses one expression string against an environment of names.

    ``env`` maps the names in scope to sympy expressions; ``later`` maps names
    that exist but are not yet usable (assigned further down) to where they are
    assigned, for a precise message.
    """

    def __init__(self, env: Mapping[str, sympy.Expr], functions: Mapping[str, Function] = DSL_FUNCTIONS,
                 later: Mapping[str, SourcePos] | None = None, what: str = "expression"):
        self.env = env
        self.functions = functions
        self.later = later or {}
        self.what = what

    def parse(self, text: str, locate: Callable[[int, int], SourcePos]) -> sympy.Expr:
        """Parse ``text``; ``locate(lineno, col_offset)`` maps AST positions to the file."""
        self.locate = locate
        if len(text) > MAX_EXPR_CHARS:
            raise SpecError(f"{self.what} is longer than {MAX_EXPR_CHARS} characters", locate(1, 0),
                            "split it into several step lines")
        if not text.strip():
            raise SpecError(f"empty {self.what}", locate(1, 0), "write an expression here")
        try:
            tree = ast.parse(text.strip(), mode="eval")
        except SyntaxError as exc:
            offset = max((exc.offset or 1) - 1, 0)
            lead = len(text) - len(text.lstrip())
            raise SpecError(f"syntax error in {self.what}: {exc.msg}", locate(exc.lineno or 1, offset + lead),
                            "use numbers, names, + - * / **, parentheses and the listed functions") from None
        except (RecursionError, MemoryError, ValueError):
            raise SpecError(f"{self.what} is nested too deeply", locate(1, 0),
                            "split it into several step lines") from None
        self.lead = len(text) - len(text.lstrip())
        self._check_size(tree.body)
        return self._expr(tree.body)

    # -- helpers -----------------------------------------------------------
    def _pos(self, node: ast.AST) -> SourcePos:
        line = getattr(node, "lineno", 1)
        return self.locate(line, getattr(node, "col_offset", 0) + (self.lead if line == 1 else 0))

    def _check_size(self, root: ast.AST) -> None:
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
            stack.extend((child, depth + 1) for child in ast.iter_child_nodes(node))

    def _fail(self, node: ast.AST, message: str, hint: str = "") -> SpecError:
        return SpecError(message, self._pos(node), hint)

    # -- grammar -----------------------------------------------------------
    def _expr(self, node: ast.AST) -> sympy.Expr:
        if isinstance(node, ast.Constant):
            if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
                raise self._fail(node, f"{node.value!r} is not a number", "only numbers are allowed as literals")
            return sympy.Integer(node.value) if isinstance(node.value, int) else sympy.Float(node.value)
        if isinstance(node, ast.Name):
            return self._name(node)
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, (ast.USub, ast.UAdd)):
            operand = self._expr(node.operand)
            return -operand if isinstance(node.op, ast.USub) else operand
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = self._expr(node.left), self._expr(node.right)
            op = _BINOPS[type(node.op)]
            if op == "+":
                return left + right
            if op == "-":
                return left - right
            if op == "*":
                return left * right
            if op == "/":
                if right == 0:
                    raise self._fail(node, "division by zero", "check the denominator")
                return left / right
            return left ** right
        if isinstance(node, ast.Call):
            return self._call(node)
        if isinstance(node, ast.Compare) or (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr))):
            raise self._fail(node, "a comparison is only allowed as the condition of where(cond, a, b)",
                             "write where(cond, value_if_true, value_if_false)")
        if isinstance(node, ast.BoolOp):
            raise self._fail(node, "`and`/`or` are not part of the language",
                             "combine comparisons with & and | inside where(...), e.g. where((a > 0) & (b < 1), x, y)")
        raise self._fail(node, f"{type(node).__name__.lower()} syntax is not part of the language",
                         "use numbers, names, + - * / **, parentheses and the listed functions")

    def _name(self, node: ast.Name) -> sympy.Expr:
        name = node.id
        if name in self.env:
            return self.env[name]
        if name == "pi":
            return sympy.pi
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
            hint = closest(name, self.functions)
            raise self._fail(node.func, f"unknown function {name!r}",
                             hint or f"functions: {', '.join(sorted(self.functions))}")
        if node.keywords:
            raise self._fail(node.keywords[0].value, f"{name}() takes no keyword arguments", "pass arguments by position")
        if len(node.args) != function.arity:
            raise self._fail(node, f"{name}() takes {function.arity} argument{'s' if function.arity != 1 else ''}, "
                                   f"got {len(node.args)}", f"write {name}({', '.join('abc'[:function.arity])})")
        if isinstance(node.args[0], ast.Starred):
            raise self._fail(node.args[0], "starred arguments are not part of the language")
        if function.condition_arg:
            args = [self._condition(node.args[0])] + [self._expr(a) for a in node.args[1:]]
        else:
            args = [self._expr(a) for a in node.args]
        return function.build(*args)

    def _condition(self, node: ast.AST):
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.BitAnd, ast.BitOr)):
            left, right = self._condition(node.left), self._condition(node.right)
            return sympy.And(left, right) if isinstance(node.op, ast.BitAnd) else sympy.Or(left, right)
        if isinstance(node, ast.Compare):
            for op in node.ops:
                if type(op) not in _CMPOPS:
                    raise self._fail(node, "only < <= > >= == != comparisons are allowed")
            terms = [self._expr(node.left)] + [self._expr(c) for c in node.comparators]
            parts = [_CMPOPS[type(op)](terms[i], terms[i + 1]) for i, op in enumerate(node.ops)]
            return sympy.And(*parts) if len(parts) > 1 else parts[0]
        raise self._fail(node, "the condition of where() must be a comparison",
                         "compare with < <= > >= == != and combine with & and |, e.g. where(v > 0, a, b)")
