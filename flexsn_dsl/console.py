"""What the command-line tools (cli.py, bench.py) share: the ``--param``, ``--size`` and ``--pass``
options and their parsing, usage errors, and output with terminal control characters escaped."""
from __future__ import annotations

import argparse
import contextlib
import os
import re
import sys
from typing import Iterator, Mapping, Sequence, TextIO

from .errors import SpecError

# C0 controls but tab and newline, DEL, C1 controls (CSI is \x9b), and the bidirectional
# overrides and isolates that reorder what a terminal shows
_CONTROLS = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u200e\u200f\u202a-\u202e\u2066-\u2069]")


class UsageError(Exception):
    """A bad command-line option: one line on stderr, exit status 2 (as argparse's own errors)."""


def escape_controls(text: str) -> str:
    """``text`` with every control character but newline and tab written as a visible escape
    (``\\x1b``, ``\\u202e``): text from specs, file names and plugins cannot drive the terminal."""
    return _CONTROLS.sub(lambda m: f"\\x{ord(m[0]):02x}" if ord(m[0]) < 0x100 else f"\\u{ord(m[0]):04x}", text)


class _Escaping:
    """A text stream that escapes control characters in everything written to it."""

    def __init__(self, stream: TextIO):
        self._stream = stream

    def write(self, text: str) -> int:
        return self._stream.write(escape_controls(text))

    def __getattr__(self, name: str):
        return getattr(self._stream, name)


@contextlib.contextmanager
def escaped_output() -> Iterator[None]:
    """While active, what is written to sys.stdout and sys.stderr has its control characters escaped."""
    saved = sys.stdout, sys.stderr
    sys.stdout, sys.stderr = _Escaping(sys.stdout), _Escaping(sys.stderr)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved


def add_spec_options(parser: argparse.ArgumentParser, sizes: bool = True, passes: str | None = None) -> None:
    """Add ``--param NAME=VALUE``, with ``sizes`` ``--size NAME=N``, and with ``passes`` (its help)
    ``--pass NAME`` (into ``passes``): each repeatable, read by :func:`parse_params` and :func:`parse_sizes`."""
    parser.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    if sizes:
        parser.add_argument("--size", action="append", default=[], metavar="NAME=N",
                            help="a size named in parameter shapes, e.g. --size C=64 (repeatable)")
    if passes is not None:
        parser.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME", help=passes)


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


def parse_sizes(items: Sequence[str]) -> dict[str, int]:
    """``--size NAME=N`` options (sizes named in parameter shapes) as a dict."""
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not (value.strip().isascii() and value.strip().isdigit()):
            raise SpecError(f"--size {item!r} is not NAME=WHOLE_NUMBER", hint="e.g. --size C=64")
        out[name.strip()] = int(value)
    return out


def check_size_names(sizes: Mapping[str, int], models: Sequence) -> None:
    """A SpecError for a ``--size`` name that none of ``models`` (NeuronModels) uses."""
    known = list(dict.fromkeys(n for m in models for n in m.size_names))
    unknown = [name for name in sizes if name not in known]
    if unknown and models:
        single = len(models) == 1
        whose = f"{models[0].name} has no" if single else "none of the specs has a"
        known_text = f"{'its' if single else 'their'} sizes: {', '.join(known)}" if known else \
            f"{'it has' if single else 'they have'} no parameter with a shape"
        raise SpecError(f"--size {unknown[0]}={sizes[unknown[0]]}: {whose} size {unknown[0]!r} ({known_text})")


def compile_with_options(path: os.PathLike | str, args: argparse.Namespace):
    """Compile a spec with the command's --param, --plugin and --pass; check its --size values."""
    from .compiler import compile_spec
    from .ir import resolve_shapes
    compiled = compile_spec(path, params=parse_params(args.param), plugins=args.plugin,
                            passes=getattr(args, "passes", []))
    resolve_shapes(compiled.model, parse_sizes(args.size), {}, require=False)
    return compiled


def table(rows: list[list[str]], header: list[str]) -> str:
    """Rows as left-aligned text columns under a header and a rule."""
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def at_least(option: str, value: int | None, low: int) -> None:
    """A UsageError for a whole-number option below ``low`` (None: not given)."""
    if value is not None and value < low:
        raise UsageError(f"{option} {value}: give a whole number of at least {low}")


def refuse_overwriting_inputs(outputs: dict[str, str | None], inputs: Sequence[str]) -> None:
    """A UsageError, before any work, for an output option naming a file that the command reads."""
    for option, out in outputs.items():
        if not out:
            continue
        for source in inputs:
            if _same_file(out, source):
                raise UsageError(f"{option} {out!r} is {source!r}, which this command reads: give another file")


def _same_file(a: str, b: str) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:  # one does not exist (yet): compare where they would be
        return os.path.realpath(a) == os.path.realpath(b)
