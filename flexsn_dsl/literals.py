"""The only way text reaches generated source: checked identifiers, exact numbers, quoted strings.

Specs, their file names, plugins, passes and the cache directory are untrusted
input. Every name, number or string the code generators put into a module goes
through one of these functions, which either return text that Python reads back
as exactly one identifier / number / string literal, or raise ``ValueError``.
"""
from __future__ import annotations

import keyword
import math
import re
from typing import Any

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")


def identifier(name: Any, keyword_ok: bool = False) -> str:
    """``name`` itself when it is an ASCII Python identifier and (unless ``keyword_ok``, for a name
    only used as a prefix) not a keyword; else ValueError."""
    if not isinstance(name, str) or not _IDENTIFIER.fullmatch(name) or (keyword.iskeyword(name) and not keyword_ok):
        raise ValueError(f"{name!r} is not an identifier (ASCII letters, digits and underscores, not starting "
                         "with a digit, not a Python keyword): it cannot be used in generated code")
    return name


def number(value: Any) -> str:
    """A finite int or float printed so that Python reads back exactly ``value``; else ValueError."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise ValueError(f"{value!r} ({type(value).__name__}) is not a number that can be used in generated code")
    if isinstance(value, int):
        return str(int(value))
    if not math.isfinite(value):
        raise ValueError(f"{value!r} is not a finite number: it cannot be used in generated code")
    return repr(float(value))


def literal(text: Any) -> str:
    """A Python string literal of ``text`` (its repr: no line breaks, quotes escaped); else ValueError."""
    if not isinstance(text, str):
        raise ValueError(f"{text!r} ({type(text).__name__}) is not a string")
    return repr(text)


def value(obj: Any) -> str:
    """A Python literal of nested tuples, lists and dicts of strings and numbers (e.g. a FlexSNInfo's fields)."""
    if isinstance(obj, str):
        return literal(obj)
    if isinstance(obj, (tuple, list)):
        items = ", ".join(value(item) for item in obj)
        if isinstance(obj, list):
            return f"[{items}]"
        return f"({items},)" if len(obj) == 1 else f"({items})"
    if isinstance(obj, dict):
        return "{" + ", ".join(f"{value(k)}: {value(v)}" for k, v in obj.items()) + "}"
    return number(obj)
