"""What the command-line tools (cli.py, bench.py) share: ``--param`` parsing."""
from __future__ import annotations

from typing import Sequence

from .errors import SpecError


def parse_params(items: Sequence[str]) -> dict[str, float]:
    """``--param NAME=NUMBER`` options as a dict (a SpecError for any other form)."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise SpecError(f"--param {item!r} is not NAME=NUMBER", hint="e.g. --param tau=3.0") from None
        if not sep:
            raise SpecError(f"--param {item!r} is not NAME=NUMBER", hint="e.g. --param tau=3.0")
    return out
