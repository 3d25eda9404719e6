"""Numerics passes for flexsn-dsl.

``safe_exp`` (stage ``ir``): every ``exp(u)`` of the step becomes
``exp(min(u, 80))`` (and ``sinh``/``cosh`` get their argument clipped to
[-80, 80]), before code is printed, so the torch step, the Triton kernels and
the derived backward all use it. exp overflows float32 at u ~ 88.7 (float64 at
~709.8); with the cap, exp stays below 5.6e34, which leaves float32 room for
the products and sums around it. Below the cap nothing changes (bit for bit);
above it the gradient through exp is 0 instead of inf/NaN.

``fast_math`` (stage ``source``): in the generated Triton cores, every
division ``a / b`` becomes ``_fast_div(a, b)``, a helper that uses
``tl.fdiv(a, b, approx=True)`` (``div.approx.f32`` on NVIDIA, at most 2 ulp
for |b| in [2**-126, 2**126]) when the operands are float32, and Triton's own
division for other dtypes or on a Triton without ``approx`` (3.6 has none,
3.9 has it). Use it when the kernels are arithmetic-bound.

Enable them per spec (``passes: [safe_exp]``) or per build
(``flexsn-dsl build --pass safe_exp``, ``flexsn_dsl.load(..., passes=["safe_exp"])``).
``make_safe_exp(cap)`` builds the pass with another cap, for a plugin of your own
(e.g. ``cap=10`` for float16, which overflows at exp(11.09)).
"""
from __future__ import annotations

import ast
import copy
import dataclasses
from typing import Callable

import sympy

import flexsn_dsl

__version__ = "0.1.0"

CAP = 80.0


def _capped(u: sympy.Expr, cap: sympy.Float) -> sympy.Expr:
    if u.is_number or (u - cap).is_nonpositive:  # already bounded: leave it alone
        return u
    return sympy.Min(u, cap)


def _clipped(u: sympy.Expr, cap: sympy.Float) -> sympy.Expr:
    if u.is_number:
        return u
    return sympy.Max(sympy.Min(u, cap), -cap)


def safe_exp_rewrite(expr: sympy.Expr, cap: float = CAP) -> sympy.Expr:
    """``expr`` with exp(u) -> exp(min(u, cap)) and sinh/cosh(u) -> sinh/cosh(clip(u, -cap, cap))."""
    c = sympy.Float(cap)
    expr = expr.replace(lambda e: isinstance(e, sympy.exp), lambda e: sympy.exp(_capped(e.args[0], c)))
    return expr.replace(lambda e: isinstance(e, (sympy.sinh, sympy.cosh)),
                        lambda e: e.func(_clipped(e.args[0], c)))


def make_safe_exp(cap: float = CAP) -> Callable:
    """The ``safe_exp`` IR pass with exponent cap ``cap``."""
    if not cap > 0:
        raise ValueError(f"the cap must be positive, got {cap!r}")

    def safe_exp(ir):
        """Cap exponents: exp(u) -> exp(min(u, CAP)), sinh/cosh(u) -> clip u to [-CAP, CAP] (no inf/NaN)."""
        rewritten = ir.replace_exprs(lambda e: safe_exp_rewrite(e, cap))
        return dataclasses.replace(rewritten, surrogate=safe_exp_rewrite(ir.surrogate, cap))

    safe_exp.__doc__ = safe_exp.__doc__.replace("CAP", f"{cap:g}")
    return safe_exp


FAST_DIV_HELPER = '''

import inspect as _inspect  # noqa: E402  (fast_math)

# tl.fdiv(..., approx=True) is recent (Triton 3.9 has it, 3.6 does not); without it _fast_div is plain a / b
_FAST_DIV_APPROX = tl.constexpr("approx" in _inspect.signature(tl.fdiv).parameters)


@triton.jit
def _fast_div(a, b):
    """fast_math: approximate float32 division (tl.fdiv approx=True, <= 2 ulp); a / b otherwise."""
    q = a / b
    if _FAST_DIV_APPROX:
        if q.dtype == tl.float32:
            q = tl.fdiv(a, b, approx=True)
    return q
'''


class _DivToCall(ast.NodeTransformer):
    def visit_BinOp(self, node: ast.BinOp) -> ast.AST:
        self.generic_visit(node)
        if isinstance(node.op, ast.Div):
            return ast.copy_location(ast.Call(ast.Name("_fast_div", ast.Load()), [node.left, node.right], []), node)
        return node


def _is_core(node: ast.AST) -> bool:
    return isinstance(node, ast.FunctionDef) and node.name.endswith(("_forward_core", "_backward_core"))


def fast_math(source: str, module_name: str) -> str:
    """Approximate float32 division in the Triton cores: a / b -> _fast_div(a, b) (tl.fdiv approx=True)."""
    tree = ast.parse(source)
    lines = source.splitlines(keepends=True)
    edits: list[tuple[int, int, str]] = []
    for node in tree.body:
        if not _is_core(node):
            continue
        for stmt in node.body:
            if not any(isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) for n in ast.walk(stmt)):
                continue
            indent = lines[stmt.lineno - 1][:stmt.col_offset]
            new = ast.unparse(ast.fix_missing_locations(_DivToCall().visit(copy.deepcopy(stmt))))
            edits.append((stmt.lineno, stmt.end_lineno, indent + new + "\n"))
    if not edits:
        return source
    for start, end, text in reversed(edits):
        lines[start - 1:end] = [text]
    out = "".join(lines)
    first_jit = out.index("@triton.jit")  # the helper goes before the first kernel function
    return out[:first_jit].rstrip("\n") + "\n" + FAST_DIV_HELPER + "\n\n" + out[first_jit:]


@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry) -> None:
    registry.register("safe_exp", stage="ir", function=make_safe_exp(CAP), order=50,
                      description=f"cap exponents: exp(u) -> exp(min(u, {CAP:g})), sinh/cosh(u) -> "
                                  f"clip u to [-{CAP:g}, {CAP:g}]; no inf/NaN from exponential neurons")
    registry.register("fast_math", stage="source", function=fast_math, order=100,
                      description="Triton cores: float32 a / b -> tl.fdiv(a, b, approx=True) (<= 2 ulp); "
                                  "other dtypes (and Triton without approx) unchanged")
