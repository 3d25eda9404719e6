"""The sympy vocabulary of the IR: spike, its surrogate gradient, detach, sigmoid."""
from __future__ import annotations

import sympy
from sympy import S


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


class SurrogateGrad(sympy.Function):
    """dSpike/du = g(u); replaced by the spec's surrogate formula before printing."""

    nargs = 1
    is_real = True

    def fdiff(self, argindex=1):
        raise NotImplementedError("second derivatives of spike() are not supported")


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


def real_symbol(name: str) -> sympy.Symbol:
    return sympy.Symbol(name, real=True)


def substitute_surrogate(expr: sympy.Expr, gradient: sympy.Expr, x: sympy.Symbol) -> sympy.Expr:
    """Replace every SurrogateGrad(u) in ``expr`` by ``gradient`` with x := u."""
    mapping = {call: gradient.xreplace({x: call.args[0]}) for call in expr.atoms(SurrogateGrad)}
    return expr.xreplace(mapping) if mapping else expr
