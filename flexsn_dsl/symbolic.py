"""The sympy vocabulary of the IR: spike, its surrogate gradient, detach, sigmoid (and the forms only
the Triton cores print: a fused multiply-add, a product in a given order, a spike as a comparison)."""
from __future__ import annotations

import sympy
from sympy import S
from sympy.printing.str import StrPrinter


class Spike(sympy.Function):
    """Heaviside forward (1 where u >= 0); the derivative is the surrogate gradient."""

    nargs = 1
    is_real = True

    @classmethod
    def eval(cls, u):
        if u.is_number and u.is_real is not False:  # a constant argument, pi - 3 included
            return S.One if bool(sympy.N(u) >= 0) else S.Zero
        return None

    def fdiff(self, argindex=1):
        return SurrogateGrad(self.args[0])


class _Derivative(sympy.Function):
    """A first derivative that is printed, never differentiated again."""

    is_real = True
    _of = "spike()"

    def fdiff(self, argindex=1):
        raise NotImplementedError(f"second derivatives of {self._of} are not supported")


class SurrogateGrad(_Derivative):
    """dSpike/du = g(u); replaced by the spec's surrogate formula before printing."""

    nargs = 1


class Detach(sympy.Function):
    """Identity forward, zero gradient."""

    nargs = 1
    is_real = True

    @classmethod
    def eval(cls, u):
        if u.is_number:
            return u
        return None

    def fdiff(self, argindex=1):
        return S.Zero


class Sigmoid(sympy.Function):
    """The logistic function 1 / (1 + exp(-u))."""

    nargs = 1
    is_real = True

    @classmethod
    def eval(cls, u):
        if u.is_Number:
            return 1 / (1 + sympy.exp(-u))
        return None

    def fdiff(self, argindex=1):
        return self * (1 - self)


class Reciprocal(sympy.Function):
    """``1 / u`` as one reciprocal instruction where the target has one (a shared denominator of the
    backward, :func:`flexsn_dsl.autodiff.share_reciprocals`)."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        return -self ** 2


class FusedMultiplyAdd(sympy.Function):
    """``x * c + r`` rounded once (Triton's ``tl.fma``): printed only, never differentiated
    (:mod:`flexsn_dsl.chain`)."""

    nargs = 3
    is_real = True


class Scaled(sympy.Function):
    """``x * c`` with ``c``'s own product computed first (one multiplication of ``x``): printed only, never
    differentiated (:mod:`flexsn_dsl.chain`)."""

    nargs = 2
    is_real = True


class SpikeAtLeast(sympy.Function):
    """``spike(a - b)``'s forward as the comparison ``a >= b``: printed only, never differentiated
    (:mod:`flexsn_dsl.chain`)."""

    nargs = 2
    is_real = True


class GeneralPow(sympy.Function):
    """``b ** e`` with a symbolic exponent, while it is differentiated: its derivatives are
    :class:`PowBaseGrad` and :class:`PowExpGrad` (torch's, where sympy's ``e * b**e / b`` and
    ``b**e * log(b)`` are NaN or complex at b <= 0)."""

    nargs = 2
    is_real = True

    def fdiff(self, argindex=1):
        return (PowBaseGrad if argindex == 1 else PowExpGrad)(*self.args)


class PowBaseGrad(_Derivative):
    """d(b**e)/db as torch computes it: ``e * b**(e - 1)``, 0 where e == 0."""

    nargs = 2
    _of = "powers"


class PowExpGrad(_Derivative):
    """d(b**e)/de as torch computes it: ``b**e * log(b)``, 0 where b == 0 and e >= 0."""

    nargs = 2
    _of = "powers"


def differentiable_powers(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with every power of a symbolic exponent as :class:`GeneralPow`."""
    if not any(p.exp.free_symbols for p in expr.atoms(sympy.Pow)):
        return expr
    return expr.replace(lambda e: isinstance(e, sympy.Pow) and e.exp.free_symbols, lambda e: GeneralPow(*e.args))


def plain_powers(expr: sympy.Expr) -> sympy.Expr:
    """Undo :func:`differentiable_powers`, nested powers (a tower ``v**v**x``) included."""
    if not expr.has(GeneralPow):
        return expr
    return expr.replace(lambda e: isinstance(e, GeneralPow), lambda e: sympy.Pow(*e.args))


def real_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


DRAW_KINDS = ("rand", "randn")  # a uniform draw in [0, 1), a standard normal one


def draw_symbol(kind: str, occurrence: int) -> sympy.Symbol:
    """The value of the ``occurrence``-th draw of a spec (counted over the whole spec from 0):
    ``rand__3``, ``randn__0``; a fresh number per element, step and call."""
    return real_symbol(f"{kind}__{occurrence}")


def draw_of(symbol: sympy.Symbol) -> tuple[str, int] | None:
    """(kind, occurrence) of a draw's symbol, None for any other symbol."""
    kind, sep, number = symbol.name.partition("__")
    return (kind, int(number)) if sep and kind in DRAW_KINDS and number.isascii() and number.isdigit() else None


def is_white_noise_name(name: str) -> bool:
    """Whether ``name`` is a white-noise process of `equations`: ``xi`` or ``xi_<suffix>``."""
    return name == "xi" or (name.startswith("xi_") and len(name) > 3)


def white_noise_symbol(name: str) -> sympy.Symbol:
    """The symbol of the white-noise process ``name`` (xi, xi_a) in an equation."""
    return real_symbol(f"{name}__white")


def substitute_surrogate(expr: sympy.Expr, gradient: sympy.Expr, x: sympy.Symbol) -> sympy.Expr:
    """Replace every SurrogateGrad(u) in ``expr`` by ``gradient`` with x := u."""
    mapping = {call: gradient.xreplace({x: call.args[0]}) for call in expr.atoms(SurrogateGrad)}
    return expr.xreplace(mapping) if mapping else expr


def is_linear(expr: sympy.Expr, symbols) -> bool:
    """Whether ``expr`` is affine in ``symbols`` (every derivative free of them)."""
    symbols = set(symbols)
    return not any(sympy.diff(expr, x).free_symbols & symbols for x in symbols if expr.has(x))


def nonlinear_term(expr: sympy.Expr, symbols) -> sympy.Expr | None:
    """A term of the sum ``expr`` that is not affine in ``symbols`` (None when ``expr`` is affine).

    The terms are found structurally (a constant factor is distributed over a sum, nothing is
    expanded), so a power such as ``(v + 1)**100000`` costs its size, not its expansion."""
    symbols = list(symbols)
    if is_linear(expr, symbols):
        return None
    return next((t for t in _terms(expr, set(symbols)) if not is_linear(t, symbols)), expr)


def _terms(expr: sympy.Expr, symbols: set) -> list[sympy.Expr]:
    """The additive terms of ``expr``: sums split, and ``c * (a + b)`` with c free of ``symbols``
    split into ``c * a`` and ``c * b`` (linear in the size of ``expr``)."""
    if expr.is_Add:
        return [t for a in expr.args for t in _terms(a, symbols)]
    if expr.is_Mul:
        dependent = [f for f in expr.args if f.free_symbols & symbols]
        if len(dependent) == 1 and dependent[0].is_Add:
            rest = sympy.Mul(*[f for f in expr.args if f is not dependent[0]])
            return [rest * t for t in _terms(dependent[0], symbols)]
    return [expr]


class _LanguagePrinter(StrPrinter):
    """sympy's text with the language's spellings: where(...), spike(...), detach(...), abs(...)."""

    def _print_Piecewise(self, expr):
        *cases, (last, condition) = expr.args
        if condition != sympy.true:  # no otherwise-branch: sympy's own spelling
            return self._print_Basic(expr)
        text = self._print(last)
        for value, condition in reversed(cases):
            text = f"where({self._print(condition)}, {self._print(value)}, {text})"
        return text

    def _print_Spike(self, expr):
        return f"spike({self._print(expr.args[0])})"

    def _print_Detach(self, expr):
        return f"detach({self._print(expr.args[0])})"

    def _print_Sigmoid(self, expr):
        return f"sigmoid({self._print(expr.args[0])})"

    def _print_Abs(self, expr):
        return f"abs({self._print(expr.args[0])})"


def language_text(expr: sympy.Expr) -> str:
    """``expr`` written in the spec language (for display)."""
    return _LanguagePrinter().doprint(expr)
