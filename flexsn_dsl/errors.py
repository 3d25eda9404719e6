"""Errors with source positions: the one exception type the API raises for bad specs."""
from __future__ import annotations

from dataclasses import dataclass

MAX_SHOWN = 120  # longest source excerpt shown under a message


def printable(text: object) -> str:
    """A file name or other untrusted name on one line: newlines and tabs written ``\\n``, ``\\t``
    (a name cannot forge lines or columns of a report; the CLI escapes other controls as it prints)."""
    return str(text).replace("\n", "\\n").replace("\t", "\\t")


@dataclass(frozen=True)
class SourcePos:
    """A place in a spec file; line and col are 1-based."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{printable(self.file)}:{self.line}:{self.col}"

    def shifted(self, line_offset: int, col: int) -> "SourcePos":
        return SourcePos(self.file, self.line + line_offset, col)


class SpecError(Exception):
    """A spec (or plugin) that cannot be built.

    Attributes: ``pos`` (a :class:`SourcePos`, or None), ``message`` (what is
    wrong), ``hint`` (what to change, may be empty) and ``source_line`` (the
    offending line of the file, when known).
    """

    def __init__(self, message: str, pos: SourcePos | None = None, hint: str = "",
                 source_line: str | None = None):
        self.message = message
        self.pos = pos
        self.hint = hint
        self.source_line = source_line
        super().__init__(self.format())

    @property
    def file(self) -> str | None:
        return self.pos.file if self.pos else None

    @property
    def line(self) -> int | None:
        return self.pos.line if self.pos else None

    @property
    def col(self) -> int | None:
        return self.pos.col if self.pos else None

    def format(self) -> str:
        where = f"{self.pos}: " if self.pos else ""
        text = f"{where}error: {self.message}"
        if self.source_line is not None and self.pos is not None:
            shown = self.source_line.rstrip("\r\n").replace("\t", " ")
            caret = max(self.pos.col - 1, 0)
            if len(shown) > MAX_SHOWN:  # a window around the column, not a megabyte of text
                start = max(0, min(caret - MAX_SHOWN // 2, len(shown) - MAX_SHOWN))
                window = shown[start:start + MAX_SHOWN]
                prefix = "..." if start > 0 else ""
                suffix = "..." if start + MAX_SHOWN < len(shown) else ""
                shown, caret = prefix + window + suffix, caret - start + len(prefix)
            text += f"\n    {shown}\n    {' ' * caret}^"
        if self.hint:
            text += f"\n  hint: {self.hint}"
        return text

    def with_source(self, lines: list[str]) -> "SpecError":
        """Attach the offending source line (for the caret display)."""
        if self.pos is not None and self.source_line is None and 0 < self.pos.line <= len(lines):
            self.source_line = lines[self.pos.line - 1]
            self.args = (self.format(),)
        return self


class PluginError(SpecError):
    """A plugin that registers something invalid or raises; names the plugin."""


class SpecTypeError(SpecError, TypeError):
    """A Python argument of the wrong type (``params=[...]``, ``loads(None)``): a TypeError,
    and a SpecError like every other refusal of the API."""


class MissingDependency(ImportError):
    """An optional package that a feature needs is not installed; the message says how to get it."""


class ShapeError(ValueError):
    """An input whose shape cannot broadcast against a shaped parameter, or a parameter
    tensor (``params=``, ``load_state_dict``) whose shape does not fit the spec's ``shape``."""


class SpecWarning(UserWarning):
    """A spec that builds, but perhaps not as meant (e.g. a refractory period that is not a
    whole number of steps); carries the position and a hint like :class:`SpecError`."""

    def __init__(self, message: str, pos: SourcePos | None = None, hint: str = ""):
        self.message = message
        self.pos = pos
        self.hint = hint
        super().__init__(self.format())

    def format(self) -> str:
        where = f"{self.pos}: " if self.pos else ""
        return f"{where}warning: {self.message}" + (f"\n  hint: {self.hint}" if self.hint else "")


class NIRError(ValueError):
    """A NIR graph or file (or a module to export) that cannot be converted; one line saying which
    node, field or file and why."""
