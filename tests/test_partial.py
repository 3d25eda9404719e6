"""autodiff.partial, the chain rule the backward is built with, against sympy's own diff: the
same expression (its piecewise parts once evaluated) for every line of the zoo and of steps using every function
of the language."""
from __future__ import annotations

from pathlib import Path

import pytest
import sympy

from flexsn_dsl.autodiff import name_spike_arguments, partial
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.symbolic import differentiable_powers

ROOT = Path(__file__).resolve().parents[1]

EVERY_FUNCTION = """
neuron: every
inputs: [x, y]
parameters:
  k: {value: 1.7, learnable: true}
  a: 0.3
states:
  v: a
  u: 0.5
step:
  h: tanh(x) + exp(-abs(v)) * sigmoid(v) + where((x > 0.5) | (y < -0.5), x * x, sqrt(abs(x) + 1))
  g: clip(v, -1, 1) / k + max(x, v) + min(y, 0.2) + relu(v - 0.1) + log(1 + x * x)
  p: x ** 17 - 3 * x ** -2 + (x * x) ** k + abs(x) ** y + 0.0 ** x + u ** 2.5 + sin(u) * cos(y)
  s: spike(h - g * k)
  v: 0.5 * v + 0.1 * (h + g) + detach(y) * s + exp(-u) * sqrt(v * v + 1) + p
  u: u * 0.9 + y / k ** 2
outputs: [s, v, p]
"""
SPECS = [*sorted((ROOT / "neurons").glob("*.yaml")), "every"]


def _evaluated(expr: sympy.Expr) -> sympy.Expr:
    """``expr`` with its piecewise parts evaluated as sympy's diff leaves them (partial leaves them as they stand:
    sympy's evaluation rewrites their conditions, at a cost exponential in their size)."""
    return expr.replace(lambda e: isinstance(e, sympy.Piecewise), lambda e: sympy.Piecewise(*e.args))


@pytest.mark.parametrize("spec", SPECS, ids=lambda p: getattr(p, "stem", p))
def test_partial_is_sympys_derivative(spec):
    compiled = compile_spec(text=EVERY_FUNCTION) if spec == "every" else compile_spec(spec)
    checked = 0
    for _, expr in name_spike_arguments(compiled.ir).assignments:
        expr = differentiable_powers(expr)
        for sym in sorted(expr.free_symbols, key=lambda s: s.name):
            assert _evaluated(partial(expr, sym)) == sympy.diff(expr, sym), (expr, sym)
            checked += 1
    assert checked > 3
