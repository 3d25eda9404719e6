"""Stage 2: numbers in a spec: YAML scalars read as float64, sympy constants checked to be finite."""
from __future__ import annotations

import math
import re

import sympy

from ..errors import SpecError
from ..source import Node
from ..symbolic import Detach, Spike


# A plain YAML scalar that YAML 1.1 reads as text but everyone means as a number: 1e-3, 5E2.
_NUMBER_TEXT = re.compile(r"[-+]?(\d[\d_]*\.?[\d_]*|\.\d[\d_]*)([eE][-+]?\d+)?")
_OCTAL_TEXT = re.compile(r"[-+]?0o_?[0-7]+(_[0-7]+)*")  # YAML 1.2 octal (YAML 1.1 writes 012: refused in source.py)


def type_name(node: Node) -> str:
    """What a node holds, for messages: its kind, 'nothing', or its scalar's Python type."""
    if node.kind != "scalar":
        return node.kind
    value = node.value
    return "nothing" if value is None else type(value).__name__


def read_number(node: Node, what: str) -> float:
    """A scalar as a finite float64 (1e-3 and 0o17 written plainly too); ``what`` names it in errors."""
    value = node.value
    if node.kind == "scalar" and node.style is None and isinstance(value, str):
        if _NUMBER_TEXT.fullmatch(value):
            value = float(value.replace("_", ""))  # 1e-3: YAML 1.1 reads it as text
        elif _OCTAL_TEXT.fullmatch(value):
            value = int(value, 0)
    if node.kind != "scalar" or isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(f"{what} must be a number, not nothing" if node.kind == "scalar" and value is None
                        else f"{what} must be a number, not {type_name(node)} {value!r}" if node.kind == "scalar"
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


def finite(expr: sympy.Expr) -> bool:
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


def finite_with(expr: sympy.Expr, values: dict[sympy.Symbol, sympy.Expr]) -> bool:
    """:func:`finite` of ``expr`` with ``values`` substituted."""
    try:
        return finite(expr.xreplace(values))
    except (TypeError, ValueError, ZeroDivisionError):  # e.g. "Invalid comparison of non-real zoo"
        return False
