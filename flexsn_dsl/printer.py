"""Print sympy expressions as torch or Triton source (one printer, two dialects)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Mapping

import sympy
from sympy.logic.boolalg import BooleanFalse, BooleanTrue

from .literals import identifier, number
from .symbolic import Detach, Sigmoid, Spike, SurrogateGrad

ATOM, POW, UNARY, MUL, ADD, CMP, AND, OR = 100, 60, 50, 40, 30, 20, 15, 10


@dataclass(frozen=True)
class Dialect:
    name: str
    functions: Mapping[type, str]        # sympy function -> "name({0})" template
    where: str                           # "where({0}, {1}, {2})" template
    spike: str                           # template of the Heaviside forward
    detach: str                          # template of detach
    integer_power_limit: int             # x**n with |n| up to this prints as products
    general_power: str                   # template for b ** e
    scalar_where: Callable[[str, str, str, str], str]  # (cond, a, b, like) -> source


def _torch_scalar_where(cond: str, a: str, b: str, like: str) -> str:
    return f"torch.where({cond}, {like}.new_full((), {a}), {b})"


def _triton_scalar_where(cond: str, a: str, b: str, like: str) -> str:
    return f"tl.where({cond}, tl.zeros_like({like}) + {a}, {b})"


TORCH = Dialect(
    name="torch",
    functions={sympy.exp: "torch.exp({0})", sympy.log: "torch.log({0})", sympy.Abs: "torch.abs({0})",
               sympy.sin: "torch.sin({0})", sympy.cos: "torch.cos({0})", sympy.tanh: "torch.tanh({0})",
               Sigmoid: "torch.sigmoid({0})", sympy.sign: "torch.sign({0})", sympy.atan: "torch.atan({0})",
               sympy.erf: "torch.erf({0})", sympy.cosh: "torch.cosh({0})", sympy.sinh: "torch.sinh({0})"},
    where="torch.where({0}, {1}, {2})",
    spike="_spike({0})",
    detach="({0}).detach()",
    integer_power_limit=0,
    general_power="{0} ** {1}",
    scalar_where=_torch_scalar_where,
)

TRITON = Dialect(
    name="triton",
    functions={sympy.exp: "tl.exp({0})", sympy.log: "tl.log({0})", sympy.Abs: "tl.abs({0})",
               sympy.sin: "tl.sin({0})", sympy.cos: "tl.cos({0})", sympy.tanh: "(2.0 * tl.sigmoid(2.0 * ({0})) - 1.0)",
               Sigmoid: "tl.sigmoid({0})", sympy.atan: "libdevice.atan({0})", sympy.erf: "tl.erf({0})",
               sympy.cosh: "(0.5 * (tl.exp({0}) + tl.exp(-({0}))))", sympy.sinh: "(0.5 * (tl.exp({0}) - tl.exp(-({0}))))"},
    where="tl.where({0}, {1}, {2})",
    spike="_heaviside({0})",
    detach="{0}",
    integer_power_limit=16,
    general_power="tl.exp({1} * tl.log({0}))",
    scalar_where=_triton_scalar_where,
)

_CMP = {sympy.StrictLessThan: "<", sympy.LessThan: "<=", sympy.StrictGreaterThan: ">",
        sympy.GreaterThan: ">=", sympy.Eq: "==", sympy.Ne: "!="}


def float_literal(value: float) -> str:
    """A float as source: exact for finite values, ``float('inf')``-style text otherwise."""
    if math.isnan(value):
        return "float('nan')"
    if math.isinf(value):
        return "float('inf')" if value > 0 else "-float('inf')"
    return number(float(value))


class Printer:
    """Prints expressions; ``names`` maps symbols to source names (default: symbol name)."""

    def __init__(self, dialect: Dialect, names: Mapping[sympy.Symbol, str] | None = None):
        self.dialect = dialect
        self.names = dict(names or {})

    def __call__(self, expr) -> str:
        return self._print(sympy.sympify(expr), 0)

    def _wrap(self, text: str, prec: int, outer: int) -> str:
        return f"({text})" if prec < outer else text

    def _print(self, e, outer: int) -> str:
        if isinstance(e, (BooleanTrue, BooleanFalse)):
            return "True" if isinstance(e, BooleanTrue) else "False"
        if isinstance(e, sympy.Expr) and e.is_number and not e.has(Spike, SurrogateGrad, Detach):
            value = float(sympy.N(e, 17))
            text = float_literal(value)
            return self._wrap(text, UNARY, outer) if text.startswith("-") else text
        if isinstance(e, sympy.Symbol):
            return identifier(self.names.get(e, e.name))
        if isinstance(e, sympy.Add):
            return self._add(e, outer)
        if isinstance(e, sympy.Mul):
            return self._mul(e, outer)
        if isinstance(e, sympy.Pow):
            return self._pow(e, outer)
        if isinstance(e, sympy.Piecewise):
            return self._piecewise(e)
        if isinstance(e, sympy.Rel):
            op = _CMP[type(e)]
            return self._wrap(f"{self._print(e.lhs, CMP + 1)} {op} {self._print(e.rhs, CMP + 1)}", CMP, outer)
        if isinstance(e, (sympy.And, sympy.Or)):
            if self.dialect is TRITON:  # as int8: the interpreter cannot combine a scalar (parameter) bool
                joiner = " & " if isinstance(e, sympy.And) else " | "
                return self._wrap("(" + joiner.join(f"({self._print(a, 0)}).to(tl.int8)" for a in e.args) + ") != 0",
                                  CMP, outer)
            joiner, prec = (" & ", AND) if isinstance(e, sympy.And) else (" | ", OR)
            return self._wrap(joiner.join(f"({self._print(a, 0)})" for a in e.args), prec, outer)
        if isinstance(e, Spike):
            return self.dialect.spike.format(self._print(e.args[0], 0))
        if isinstance(e, Detach):
            return self.dialect.detach.format(self._print(e.args[0], outer if self.dialect is TRITON else 0))
        if isinstance(e, SurrogateGrad):
            raise ValueError("SurrogateGrad must be substituted before printing")
        if isinstance(e, (sympy.Max, sympy.Min)):
            return self._extremum(e)
        if isinstance(e, sympy.Heaviside):
            x = e.args[0]
            h0 = e.args[1] if len(e.args) > 1 else sympy.Rational(1, 2)
            inner = sympy.Piecewise((0, x < 0), (h0, True))
            return self._piecewise(sympy.Piecewise((1, x > 0), (inner, True)), fold=False)
        if isinstance(e, sympy.sign) and e.func not in self.dialect.functions:
            x = e.args[0]
            return self._piecewise(sympy.Piecewise((1, x > 0), (sympy.Piecewise((-1, x < 0), (0, True)), True)),
                                   fold=False)
        if isinstance(e, sympy.Function) and e.func in self.dialect.functions:
            args = [self._print(a, 0) for a in e.args]
            return self.dialect.functions[e.func].format(*args)
        raise ValueError(f"cannot print {type(e).__name__} ({e}) for {self.dialect.name}")

    def _add(self, e: sympy.Add, outer: int) -> str:
        terms = e.as_ordered_terms()
        parts = [self._print(terms[0], ADD)]
        for term in terms[1:]:
            if term.could_extract_minus_sign():
                parts.append(f"- {self._print(-term, ADD + 1)}")
            else:
                parts.append(f"+ {self._print(term, ADD + 1)}")
        return self._wrap(" ".join(parts), ADD, outer)

    def _mul(self, e: sympy.Mul, outer: int) -> str:
        if e.could_extract_minus_sign():
            return self._wrap(f"-{self._print(-e, UNARY)}", UNARY, outer)
        num, den = [], []
        for factor in e.as_ordered_factors():
            if isinstance(factor, sympy.Pow) and factor.exp.is_number and factor.exp.is_negative:
                den.append(sympy.Pow(factor.base, -factor.exp))
            elif isinstance(factor, sympy.Rational) and not factor.is_Integer and factor.p == 1:
                den.append(sympy.Integer(factor.q))
            elif not (factor.is_Number and float(factor) == 1.0):  # a 1.0 factor is a wasted multiplication
                num.append(factor)
        if len(num) == 1 and not den:
            return self._print(num[0], outer)
        num_text = " * ".join(self._print(f, MUL) for f in num) if num else "1.0"
        if not den:
            return self._wrap(num_text, MUL, outer)
        den_text = self._print(den[0], MUL + 1) if len(den) == 1 else \
            "(" + " * ".join(self._print(f, MUL) for f in den) + ")"
        return self._wrap(f"{num_text} / {den_text}", MUL, outer)

    def _pow(self, e: sympy.Pow, outer: int) -> str:
        base, exp = e.base, e.exp
        if exp.is_number and exp.is_negative:
            return self._wrap(f"1.0 / {self._print(sympy.Pow(base, -exp, evaluate=False), MUL + 1)}", MUL, outer)
        if exp == sympy.Rational(1, 2):
            return self._sqrt(base)
        if exp.is_number and float(exp).is_integer():
            n = int(float(exp))
            if n == 1:
                return self._print(base, outer)
            if 0 < n <= self.dialect.integer_power_limit:
                return self._wrap(" * ".join([self._print(base, MUL + 1)] * n), MUL, outer)
        exp_text = str(int(float(exp))) if exp.is_number and float(exp).is_integer() else self._print(exp, POW + 1)
        text = self.dialect.general_power.format(self._print(base, POW + 1), exp_text)
        return self._wrap(text, POW if self.dialect is TORCH else ATOM, outer)

    def _extremum(self, e) -> str:
        is_max = isinstance(e, sympy.Max)
        numbers = [a for a in e.args if a.is_number]
        tensors = [self._print(a, 0) for a in e.args if not a.is_number]
        if self.dialect is TORCH:
            text = tensors[0]
            for other in tensors[1:]:
                text = f"torch.{'maximum' if is_max else 'minimum'}({text}, {other})"
            for number in numbers:
                text = f"torch.clamp({text}, {'min' if is_max else 'max'}={self._print(number, 0)})"
            return text
        text = tensors[0]
        for other in tensors[1:] + [self._print(n, 0) for n in numbers]:
            text = f"tl.{'maximum' if is_max else 'minimum'}({text}, {other})"
        return text

    def _sqrt(self, base) -> str:
        module = "torch" if self.dialect is TORCH else "tl"
        return f"{module}.sqrt({self._print(base, 0)})"

    def _select(self, cond, a, b, result_text: str | None = None) -> str:
        cond_text = self._print(cond, 0)
        a_text = self._print(a, 0)
        b_text = result_text if result_text is not None else self._print(b, 0)
        a_num = isinstance(a, sympy.Expr) and a.is_number
        b_num = (result_text is None and isinstance(b, sympy.Expr) and b.is_number) or \
            (result_text is not None and _is_literal(result_text))
        if a_num and b_num:
            like = sorted(cond.free_symbols, key=lambda s: s.name)
            if like:
                return self.dialect.scalar_where(cond_text, a_text, b_text, self._print(like[0], ATOM))
        return self.dialect.where.format(cond_text, a_text, b_text)

    def _piecewise(self, e: sympy.Piecewise, fold: bool = True) -> str:
        pairs = list(e.args)
        result_expr, result_text = pairs[-1].expr, None
        if not isinstance(pairs[-1].cond, BooleanTrue):
            result_text = "float('nan')"
        for expr, cond in reversed(pairs[:-1] if result_text is None else pairs):
            text = self._select(cond, expr, result_expr, result_text=result_text)
            result_text, result_expr = text, None
        return result_text if result_text is not None else self._print(result_expr, 0)


def _is_literal(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
