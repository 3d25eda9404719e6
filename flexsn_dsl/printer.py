"""Print sympy expressions as torch or Triton source (one printer, two dialects)."""
from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Callable, Mapping

import sympy
from sympy.codegen.cfunctions import expm1, log1p
from sympy.logic.boolalg import ITE, BooleanFalse, BooleanFunction, BooleanTrue

from .literals import identifier, number
from .symbolic import (Detach, FusedMultiplyAdd, PowBaseGrad, PowExpGrad, Reciprocal, Scaled, Sigmoid, Spike,
                       SpikeAtLeast, SurrogateGrad)

ATOM, POW, UNARY, MUL, ADD, CMP, AND, OR = 100, 60, 50, 40, 30, 20, 15, 10


@dataclass(frozen=True)
class Dialect:
    name: str
    functions: Mapping[type, str]        # sympy function -> "name({0})" template
    where: str                           # "where({0}, {1}, {2})" template
    spike: str                           # template of the Heaviside forward
    detach: str                          # template of detach
    scalar_where: Callable[[str, str, str, str], str]  # (cond, a, b, like) -> source
    helpers: Mapping[type, str] = field(default_factory=dict)  # sympy function -> the helper its template calls


def _torch_scalar_where(cond: str, a: str, b: str, like: str) -> str:
    return f"torch.where({cond}, {like}.new_full((), {a}), {b})"


def _triton_scalar_where(cond: str, a: str, b: str, like: str) -> str:
    return f"tl.where({cond}, tl.zeros_like({like}) + {a}, {b})"


TORCH = Dialect(
    name="torch",
    functions={sympy.exp: "torch.exp({0})", sympy.log: "torch.log({0})", sympy.Abs: "torch.abs({0})",
               sympy.sin: "torch.sin({0})", sympy.cos: "torch.cos({0})", sympy.tanh: "torch.tanh({0})",
               Sigmoid: "torch.sigmoid({0})", sympy.sign: "torch.sign({0})", Reciprocal: "torch.reciprocal({0})", sympy.atan: "torch.atan({0})",
               sympy.erf: "torch.erf({0})", sympy.cosh: "torch.cosh({0})", sympy.sinh: "torch.sinh({0})",
               sympy.tan: "torch.tan({0})", expm1: "torch.expm1({0})", log1p: "torch.log1p({0})",
               sympy.floor: "torch.floor({0})"},
    where="torch.where({0}, {1}, {2})",
    spike="_spike({0})",
    detach="({0}).detach()",
    scalar_where=_torch_scalar_where,
)

TRITON = Dialect(
    name="triton",
    functions={sympy.exp: "_exp({0})", sympy.log: "tl.log({0})", sympy.Abs: "tl.abs({0})",
               sympy.sin: "tl.sin({0})", sympy.cos: "tl.cos({0})", sympy.tanh: "(2.0 * tl.sigmoid(2.0 * ({0})) - 1.0)",
               Sigmoid: "tl.sigmoid({0})", Reciprocal: "_reciprocal({0})", sympy.atan: "_atan({0})", sympy.erf: "tl.erf({0})",
               sympy.cosh: "(0.5 * (tl.exp({0}) + tl.exp(-({0}))))", sympy.sinh: "(0.5 * (_expm1({0}) - _expm1(-({0}))))",
               sympy.tan: "(tl.sin({0}) / tl.cos({0}))", expm1: "_expm1({0})", log1p: "_log1p({0})",
               sympy.floor: "tl.floor({0})"},
    where="tl.where({0}, {1}, {2})",
    spike="_heaviside({0})",
    detach="{0}",
    scalar_where=_triton_scalar_where,
    helpers={sympy.exp: "_exp", Reciprocal: "_reciprocal", sympy.atan: "_atan", expm1: "_expm1", log1p: "_log1p",
             sympy.sinh: "_expm1"},
)

# Triton helpers for single PTX instructions: float32 in compiled kernels only (the interpreter has no
# inline assembly), the generic expression otherwise.
_GPU = '''from flexsn_dsl.triton_runtime import interpreting  # noqa: E402

_GPU = tl.constexpr(not interpreting())  # compiled, not run by Triton's interpreter
'''
_INSTRUCTION_HELPERS = {
    "_exp": '''@triton.jit
def _exp(x):
    """exp(x). Float32 compiled for the GPU: ex2.approx.ftz of x * log2(e), the instruction tl.exp
    compiles to, without the guard that keeps results below 2 ** -126 (they flush to 0); else tl.exp."""
    if _GPU and x.dtype == tl.float32:
        return tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x * 1.4426950408889634],
                                         dtype=tl.float32, is_pure=True, pack=1)
    else:
        return tl.exp(x)
''',
    "_reciprocal": '''@triton.jit
def _reciprocal(x):
    """1 / x. Float32 compiled for the GPU: rcp.approx.ftz (within 1 ulp; inf for |x| < 2 ** -126,
    0 for |x| > 2 ** 126), one instruction where a division is about ten; else a division."""
    if _GPU and x.dtype == tl.float32:
        return tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                         is_pure=True, pack=1)
    else:
        return 1.0 / x
''',
}

# Triton helpers for functions Triton has only in libdevice (which its interpreter lacks): the same
# code compiled and interpreted, accurate in float32 and float64; and a spike's forward as a comparison.
_FUNCTION_HELPERS = {
    "_heaviside_ge": '''@triton.jit
def _heaviside_ge(a, b):
    """spike(a - b) forward as one comparison: 1 where a >= b (where a - b >= 0, for finite a and b), else 0,
    in a's dtype (the comparison converted: no float32 select in a float64 kernel)."""
    return (a >= b).to(a.dtype)
''',
    "_atan": '''@triton.jit
def _atan(x):
    """atan(x): |x| > 1 by atan(a) = pi/2 - atan(1/a), then a > tan(pi/12) by atan(a) = pi/6 +
    atan((sqrt(3) a - 1) / (sqrt(3) + a)), then the odd Taylor series to x ** 27 on |a| <= tan(pi/12)
    (error below 1e-17), by Horner's rule in z = a ** 2."""
    a = tl.abs(x)
    big = a > 1.0
    a = tl.where(big, 1.0 / tl.where(big, a, 1.0), a)
    far = a > tl.full((), 0.2679491924311227, a.dtype)  # tan(pi/12), in a's dtype (not a float32 number)
    a = tl.where(far, (1.7320508075688772 * a - 1.0) / (1.7320508075688772 + a), a)
    z = a * a
    p = -1.0 / 27.0
''' + "".join(f"    p = p * z {'+' if k % 4 == 1 else '-'} 1.0 / {k}.0\n" for k in range(25, 1, -2)) + '''    r = a + a * z * p
    r = tl.where(far, r + 0.5235987755982989, r)
    r = tl.where(big, 1.5707963267948966 - r, r)
    return tl.where(x < 0.0, -r, r)
''',
    "_expm1": '''@triton.jit
def _expm1(x):
    """exp(x) - 1, accurate near 0 (Kahan: (u - 1) * x / log(u) with u = exp(x))."""
    u = tl.exp(x)
    m = u - 1.0
    r = tl.where(m == -1.0, -1.0, m * x / tl.log(tl.where(m == 0.0, 2.0, u)))
    return tl.where(m == 0.0, x, tl.where(x > 80.0, u, r))
''',
    "_log1p": '''@triton.jit
def _log1p(x):
    """log(1 + x), accurate near 0 (Goldberg: log(u) * x / (u - 1) with u = 1 + x; log(u) itself
    where u - 1 is x exactly, infinite x included)."""
    u = 1.0 + x
    d = u - 1.0
    return tl.where(d == 0.0, x, tl.where(d == x, tl.log(u), tl.log(u) * x / tl.where(d == 0.0, 1.0, d)))
''',
}

MAX_SQUARING_EXPONENT = 2 ** 53  # integer powers up to this by repeated squaring; above, floats are even

# Triton helpers for powers; b ** e, d/db and d/de as torch.pow and its autograd compute them.
_POW_HELPERS = {
    "_pow": '''@triton.jit
def _pow(b, e):
    """b ** e for a tensor e, as torch.pow: |b| ** e with the sign of an odd integral power of a
    negative base, NaN for a non-integral one; 0 ** e is 0, 1, inf for e > 0, e == 0, e < 0."""
    b = tl.zeros_like(e) + b
    m = tl.exp(e * tl.log(tl.abs(b)))
    signed = tl.where(tl.floor(0.5 * e) == 0.5 * e, m, -m)
    m = tl.where(b < 0.0, tl.where(tl.floor(e) == e, signed, float("nan")), m)
    return tl.where(e == 0.0, 1.0, m)
''',
    "_pow_dbase": '''@triton.jit
def _pow_dbase(b, e):
    """d(b ** e)/db as torch computes it: e * b ** (e - 1), and 0 where e == 0."""
    return tl.where(e == 0.0, 0.0, e * _pow(b, e - 1.0))
''',
    "_pow_dexp": '''@triton.jit
def _pow_dexp(b, e):
    """d(b ** e)/de as torch computes it: b ** e * log(b), and 0 where b == 0 and e >= 0."""
    b = tl.zeros_like(e) + b
    d = _pow(b, e) * tl.log(b)
    return tl.where(b == 0.0, tl.where(e >= 0.0, 0.0, d), d)
''',
}


def _squaring_helper(n: int) -> str:
    """``_pow_<n>(x)``: x ** n by repeated squaring (exact for any sign of x, as torch)."""
    lines = ["@triton.jit", f"def _pow_{number(n)}(x):", f'    """x ** {number(n)} by repeated squaring."""']
    factors, power, name = [], 1, "x"
    while True:
        if n & power:
            factors.append(name)
        if 2 * power > n:
            break
        lines.append(f"    x{2 * power} = {name} * {name}")
        power, name = 2 * power, f"x{2 * power}"
    return "\n".join(lines + ["    return " + " * ".join(factors)]) + "\n"


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
        self.helpers: set[str | int] = set()  # Triton helpers the printed text calls: names, or n of _pow_<n>

    def helper_source(self) -> str:
        """The ``@triton.jit`` helpers the text printed so far calls (:meth:`helper_blocks`), as source."""
        return "".join(block + "\n\n" for block in self.helper_blocks())

    def helper_blocks(self) -> list[str]:
        """The source blocks of the helpers the text printed so far calls: ``_pow_<n>`` by n, then
        the general power and its derivatives, the functions, the instructions (each once, in this
        fixed order)."""
        squares = sorted(h for h in self.helpers if isinstance(h, int))
        named = [h for h in _POW_HELPERS if h in self.helpers]
        instructions = [h for h in _INSTRUCTION_HELPERS if h in self.helpers]
        functions = [h for h in _FUNCTION_HELPERS if h in self.helpers]
        return [_squaring_helper(n) for n in squares] + [_POW_HELPERS[h] for h in named] + \
            [_FUNCTION_HELPERS[h] for h in functions] + ([_GPU] if instructions else []) + \
            [_INSTRUCTION_HELPERS[h] for h in instructions]

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
            lhs, rhs = self._operands([e.lhs, e.rhs], CMP + 1) if self.dialect is TRITON else \
                (self._print(e.lhs, CMP + 1), self._print(e.rhs, CMP + 1))
            return self._wrap(f"{lhs} {op} {rhs}", CMP, outer)
        if isinstance(e, BooleanFunction) and not isinstance(e, (sympy.And, sympy.Or)):
            return self._print(and_or(e), outer)
        if isinstance(e, (sympy.And, sympy.Or)):
            if self.dialect is TRITON:  # as int8: the interpreter cannot combine a scalar (parameter) bool
                joiner = " & " if isinstance(e, sympy.And) else " | "
                return self._wrap("(" + joiner.join(f"({self._print(a, 0)}).to(tl.int8)" for a in e.args) + ") != 0",
                                  CMP, outer)
            joiner, prec = (" & ", AND) if isinstance(e, sympy.And) else (" | ", OR)
            return self._wrap(joiner.join(f"({self._print(a, 0)})" for a in e.args), prec, outer)
        if isinstance(e, Spike):
            return self.dialect.spike.format(self._print(e.args[0], 0))
        if isinstance(e, Scaled):
            return self._wrap(f"{self._print(e.args[0], MUL)} * {self._print(e.args[1], MUL + 1)}", MUL, outer)
        if isinstance(e, Detach):
            return self.dialect.detach.format(self._print(e.args[0], outer if self.dialect is TRITON else 0))
        if isinstance(e, (PowBaseGrad, PowExpGrad)):
            return self._pow_grad(e)
        if isinstance(e, SurrogateGrad):
            raise ValueError("SurrogateGrad must be substituted before printing")
        if isinstance(e, (sympy.Max, sympy.Min)):
            return self._extremum(e)
        if isinstance(e, FusedMultiplyAdd) and self.dialect is TRITON:
            return f"tl.fma({', '.join(self._operands(e.args))})"
        if isinstance(e, SpikeAtLeast) and self.dialect is TRITON:
            self.helpers.add("_heaviside_ge")
            return f"_heaviside_ge({', '.join(self._operands(e.args))})"
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
            if e.func in self.dialect.helpers:
                self.helpers.add(self.dialect.helpers[e.func])
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
            if isinstance(factor, sympy.Pow) and factor.exp.is_number and factor.exp.is_negative and \
                    (self.dialect is TRITON or factor.exp == -1):  # torch: x ** -n, as torch differentiates it
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
        if exp == sympy.Rational(1, 2):
            return self._sqrt(base)
        if self.dialect is TORCH and exp == -1:
            return self._wrap(f"1.0 / {self._print(base, MUL + 1)}", MUL, outer)
        if self.dialect is TORCH:  # torch.pow is right for every base and exponent, and so is its autograd
            exp_text = self._integer(exp) or self._print(exp, POW + 1)
            return self._wrap(f"{self._print(base, POW + 1)} ** {exp_text}", POW, outer)
        if exp.is_number and exp.is_negative:
            return self._wrap(f"1.0 / {self._print(sympy.Pow(base, -exp, evaluate=False), MUL + 1)}", MUL, outer)
        n = self._integer(exp)
        if n == "1":
            return self._print(base, outer)
        if n is not None:
            if int(n) > MAX_SQUARING_EXPONENT:  # as a float (as torch takes it) n is even: |b| ** n
                return f"tl.exp({float_literal(float(n))} * tl.log(tl.abs({self._print(base, 0)})))"
            self.helpers.add(int(n))
            return f"{identifier(f'_pow_{n}')}({self._print(base, 0)})"
        if exp.is_number:  # non-integral: exp(e log b) is 0, inf, NaN for b = 0 (e > 0, e < 0), b < 0, as torch
            return f"tl.exp({self._print(exp, MUL)} * tl.log({self._print(base, 0)}))"
        self.helpers.add("_pow")
        return f"_pow({self._print(base, 0)}, {self._print(exp, 0)})"

    @staticmethod
    def _integer(exp) -> str | None:
        """An integral numeric exponent as an integer literal (``2.0`` -> ``2``), else None."""
        if exp.is_Integer:
            return number(int(exp))
        if exp.is_number:
            value = float(exp)
            return number(int(value)) if value.is_integer() else None
        return None

    def _pow_grad(self, e) -> str:
        name = "_pow_dbase" if isinstance(e, PowBaseGrad) else "_pow_dexp"
        if self.dialect is not TRITON:
            raise ValueError(f"{type(e).__name__} prints only for Triton")
        self.helpers |= {"_pow", name}
        return f"{name}({self._print(e.args[0], 0)}, {self._print(e.args[1], 0)})"

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
        operands = self._operands([a for a in e.args if not a.is_number] + numbers)
        text = operands[0]
        for other in operands[1:]:
            text = f"tl.{'maximum' if is_max else 'minimum'}({text}, {other})"
        return text

    def _operands(self, args, outer: int = 0) -> list[str]:
        """Arguments of a Triton operation that takes a Python number at float32 before Triton 3.9 (comparisons,
        ``tl.fma``, ``tl.minimum``, ``tl.maximum``, and so the helpers that compare: in a float64 kernel 0.9
        became 0.8999999761581421): a number that float32 changes is printed as a constant of the dtype of the
        first symbol the first argument with symbols reads."""
        like = next((min(a.free_symbols, key=lambda s: s.name) for a in args if a.free_symbols), None)
        return [f"tl.full((), {self._print(a, 0)}, {self._print(like, ATOM)}.dtype)"
                if like is not None and a.is_number and not _float32_exact(float(sympy.N(a, 17)))
                else self._print(a, outer) for a in args]

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


_FLOAT32_MAX = (2 - 2 ** -23) * 2 ** 127


def _float32_exact(value: float) -> bool:
    """Whether float32 holds ``value`` as it is, as a normal number or zero (what Triton 3.6 takes a Python
    number as: a float32 constant in that range, else float64)."""
    if value == 0 or math.isinf(value) or math.isnan(value):
        return True
    return 2.0 ** -126 <= abs(value) <= _FLOAT32_MAX and struct.unpack("<f", struct.pack("<f", value))[0] == value


def and_or(cond: BooleanFunction) -> sympy.Basic:
    """A condition other than And and Or (sympy's ``ITE``, ``Not``, ``Xor``, ... in the conditions of a
    derivative or of a folded Piecewise) as comparisons joined by And and Or; ``ITE(c, a, b)`` is
    ``(c & a) | (~c & b)`` (each condition once), the others their negation normal form."""
    if isinstance(cond, ITE):
        c, a, b = cond.args
        return sympy.Or(sympy.And(c, a), sympy.And(sympy.Not(c), b))
    if isinstance(cond, sympy.Not) and isinstance(cond.args[0], ITE):
        c, a, b = cond.args[0].args
        return sympy.Or(sympy.And(c, sympy.Not(a)), sympy.And(sympy.Not(c), sympy.Not(b)))
    return cond.to_nnf(simplify=False)


def _is_literal(text: str) -> bool:
    try:
        float(text)
        return True
    except ValueError:
        return False
