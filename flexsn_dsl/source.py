"""Stage 1: spec text -> a tree of YAML nodes that remember where they came from.

YAML is composed with PyYAML's *safe* loader and never constructed into
arbitrary Python objects: tags such as ``!!python/object`` are rejected,
duplicate keys (which PyYAML silently merges) are errors, and alias expansion
is bounded.
"""
from __future__ import annotations

import os
import re
import stat
from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import SourcePos, SpecError, SpecTypeError

MAX_SPEC_BYTES = 1_000_000
MAX_NODES = 10_000  # YAML values, aliases expanded (a spec has a few dozen)
MAX_DEPTH = 40  # YAML nesting (a spec needs 3 or 4 levels)


@dataclass
class Node:
    """A YAML value: ``value`` is a dict[str, Node], a list[Node] or a scalar."""

    value: Any
    pos: SourcePos
    key_pos: dict[str, SourcePos] = field(default_factory=dict)
    style: str | None = None  # scalar style: None (plain), "'", '"', "|", ">"
    source: str | None = field(default=None, repr=False)  # the whole spec text (scalars only)
    span: tuple[int, int] = (0, 0)  # where the scalar's text lies in ``source``
    flow: bool = False  # an item of a flow mapping or list ({a: 1, b: 2}, [a, b]), which YAML splits at commas

    @property
    def cut_at_comma(self) -> bool:
        """Whether this is a plain item of a flow mapping or list that a comma ended (YAML splits
        ``{v: min(a, b)}`` into ``v: min(a`` and a key ``b)``)."""
        return self.flow and self.style is None and self.source is not None and \
            self.source[self.span[1]:].lstrip(" \t\r\n").startswith(",")

    @property
    def kind(self) -> str:
        if isinstance(self.value, dict):
            return "mapping"
        if isinstance(self.value, list):
            return "list"
        return "scalar"

    def text_pos(self, offset: int) -> SourcePos:
        """Position of character ``offset`` of a scalar's text (its value, as loaded).

        The value is aligned with the source text, so this works for quoted,
        multi-line, literal (``|``) and folded (``>``) scalars: indentation,
        line folding, escapes and quote doubling are accounted for.
        """
        if self.source is None or not isinstance(self.value, str):
            quote = 1 if self.style in ("'", '"') else 0
            return SourcePos(self.pos.file, self.pos.line, self.pos.col + quote + offset)
        src, value = self.source, self.value
        i, end = self.span
        if self.style in ("|", ">"):  # the text starts on the line after the header
            newline = src.find("\n", i, end)
            i = newline + 1 if newline >= 0 else end
        elif self.style in ("'", '"'):
            i += 1
        j = 0
        while j < offset and i < end and j < len(value):
            c, s = value[j], src[i]
            if self.style == "'" and c == "'" and s == "'":
                i, j = i + 2, j + 1  # '' stands for '
            elif c == s:
                i, j = i + 1, j + 1
            elif s in " \t\r\n":
                i += 1  # indentation or a folded line break
            elif c in " \n":
                j += 1  # a space or newline produced by folding
            elif self.style == '"' and s == "\\":
                i, j = i + {"x": 4, "u": 6, "U": 10}.get(src[i + 1:i + 2], 2), j + 1
            else:
                i, j = i + 1, j + 1
        if j >= len(value) or value[j] not in " \t\n":
            while i < end and src[i] in " \t\r\n":
                i += 1
        return self._index_pos(min(i, max(end, self.span[0])))

    def _index_pos(self, index: int) -> SourcePos:
        """The line and column of ``source[index]``, counted from this node's start."""
        src, start = self.source, self.span[0]
        line, col = self.pos.line, self.pos.col
        k = start
        while k < index:
            ch = src[k]
            if ch == "\r" and src[k + 1:k + 2] == "\n":
                k += 1
                continue
            if ch in "\r\n":
                line, col = line + 1, 1
            else:
                col += 1
            k += 1
        return SourcePos(self.pos.file, line, col)


def _mark_pos(file: str, mark: Any) -> SourcePos:
    return SourcePos(file, mark.line + 1, mark.column + 1)


_SAFE_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq",
}
_INT, _FLOAT, _STR = "tag:yaml.org,2002:int", "tag:yaml.org,2002:float", "tag:yaml.org,2002:str"
_LEADING_ZERO = re.compile(r"[-+]?0[0-9_]+")  # 012: octal in YAML 1.1, text in YAML 1.2
MAX_INT_CHARS = 400  # an integer this long is far beyond a float64 (and slow to convert)


def _number_text_error(node: yaml.ScalarNode, pos: SourcePos) -> SpecError | None:
    """Plain numbers that YAML 1.1 reads differently from a person: 012 (octal 10),
    1:30 (base 60: 90); and integers too long for any float64."""
    if node.style is not None or node.tag not in (_INT, _FLOAT, _STR):
        return None
    text = node.value
    if _LEADING_ZERO.fullmatch(text):
        sign = text[0] if text[0] in "+-" else ""
        decimal = sign + (text.lstrip("+-").replace("_", "").lstrip("0") or "0")
        read = f"as the octal number {int(text.replace('_', ''), 8)}" if node.tag == _INT else "as text"
        return SpecError(f"YAML 1.1 reads {text} (a number with a leading zero) {read}", pos,
                         f"write {decimal} without the leading zero (or 0o... for an octal number), "
                         "or quote it if it is text")
    if node.tag == _STR:
        return None
    if ":" in text:
        value = f"{_sexagesimal(text):g}"
        return SpecError(f"YAML 1.1 reads {text} as a base-60 number ({value})", pos,
                         f"write the number itself (e.g. {value}), or quote it if it is text")
    if node.tag == _INT and len(text) > MAX_INT_CHARS:
        return SpecError(f"this integer has {len(text)} characters, far too large for a float64", pos,
                         "write a number between -1.8e308 and 1.8e308")
    return None


def _sexagesimal(text: str) -> float:
    sign = -1 if text.startswith("-") else 1
    value = 0.0
    for part in text.lstrip("+-").replace("_", "").split(":"):
        value = value * 60 + float(part)
    return sign * value


# What a duplicate key means, by the path of the mapping it is in.
_DUPLICATES = {
    ("step",): ("{key!r} is assigned twice in `step` (first at line {line})",
                "each name is assigned at most once per step: give one of the values a new name "
                "(e.g. {key}2) or merge the two lines"),
    ("states",): ("state {key!r} is declared twice (first at line {line})", "declare each state once"),
    ("parameters",): ("parameter {key!r} is declared twice (first at line {line})", "declare each parameter once"),
    (): ("top-level key {key!r} is given twice (first at line {line})",
         "give each key once; YAML would silently keep only the last one"),
}


class _Converter:
    def __init__(self, file: str, loader: _Loader, text: str):
        self.file = file
        self.loader = loader
        self.text = text
        self.count = 0
        self.active: set[int] = set()  # ids of the nodes being converted (recursive aliases)

    def convert(self, node: yaml.Node, path: tuple[str, ...] = (), flow: bool = False) -> Node:
        self.count += 1
        pos = _mark_pos(self.file, node.start_mark)
        if self.count > MAX_NODES:
            raise SpecError(f"the spec has more than {MAX_NODES} YAML values (alias bomb?)", pos,
                            "write the spec out plainly; aliases that expand hugely are refused")
        if len(path) > MAX_DEPTH:
            raise SpecError(f"YAML values are nested more than {MAX_DEPTH} levels deep", pos,
                            "a spec needs only a few levels: neuron, states, step, ... at the top, "
                            "then name: value")
        if id(node) in self.active:
            raise SpecError("a YAML alias refers to a value that contains it (a recursive alias)", pos,
                            "write the value out instead of using the alias")
        if node.tag not in _SAFE_TAGS:
            raise _tag_error(node, pos)
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Node] = {}
            key_pos: dict[str, SourcePos] = {}
            self.active.add(id(node))
            for key_node, value_node in node.value:
                kpos = _mark_pos(self.file, key_node.start_mark)
                if key_node.tag == "tag:yaml.org,2002:merge":
                    raise SpecError("YAML merge keys (<<) are not supported", kpos,
                                    "write the keys out in this mapping")
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _SAFE_TAGS:
                    raise SpecError("mapping keys must be plain names", kpos,
                                    "write `name: value`, with a name (not a list, mapping or tagged value) "
                                    "before the colon")
                key = self._scalar(key_node, kpos)
                if key is None or isinstance(key, (list, dict)):
                    raise SpecError("mapping keys must be plain names", kpos,
                                    "write `name: value`, with a name before the colon")
                key = str(key)
                if key in out:
                    first = key_pos[key]
                    message, hint = _DUPLICATES.get(path, ("duplicate key {key!r} (first given at line {line})",
                                                           "each key may appear once in a mapping; "
                                                           "remove or rename one"))
                    raise SpecError(message.format(key=key, line=first.line), kpos, hint.format(key=key))
                out[key] = self.convert(value_node, path + (key,), bool(node.flow_style))
                key_pos[key] = kpos
            self.active.discard(id(node))
            return Node(out, pos, key_pos)
        if isinstance(node, yaml.SequenceNode):
            self.active.add(id(node))
            items = [self.convert(item, path + ("[]",), bool(node.flow_style)) for item in node.value]
            self.active.discard(id(node))
            return Node(items, pos)
        value = self._scalar(node, pos)
        return Node(value, pos, style=node.style, source=self.text,
                    span=(node.start_mark.index, node.end_mark.index), flow=flow)

    def _scalar(self, node: yaml.ScalarNode, pos: SourcePos):
        error = _number_text_error(node, pos)
        if error is not None:
            raise error
        return self.loader.construct_object(node)


def _tag_error(node: yaml.Node, pos: SourcePos) -> SpecError:
    tag = node.tag
    if tag == "tag:yaml.org,2002:timestamp":
        return SpecError(f"YAML reads {node.value!r} as a date", pos,
                         "write a number, or quote the text if it is meant as text")
    shown = "!!" + tag[len("tag:yaml.org,2002:"):] if tag.startswith("tag:yaml.org,2002:") else tag
    if shown.startswith("!!python/"):
        return SpecError(f"YAML tag {shown!r} is not allowed: specs never create Python objects or run code",
                         pos, "remove the tag; a spec is plain data")
    return SpecError(f"YAML tag {shown!r} is not allowed", pos,
                     "specs are plain data: remove the tag (no !!python/... or custom tags)")


def _yaml_error(exc: yaml.MarkedYAMLError, file: str, text: str) -> SpecError:
    problem = exc.problem or exc.context or "invalid YAML"
    context = exc.context or ""
    mark = exc.problem_mark or exc.context_mark
    at_end = "end of stream" in problem or "<stream end>" in problem
    if at_end and exc.context_mark is not None:
        pos = _mark_pos(file, exc.context_mark)
        unclosed = {"while scanning a quoted scalar": ("this quoted text is never closed", "add the closing quote"),
                    "while parsing a flow sequence": ("this [ list is never closed", "add the closing ]"),
                    "while parsing a flow mapping": ("this { mapping is never closed", "add the closing }")}
        if context in unclosed:
            message, hint = unclosed[context]
            return SpecError(f"YAML syntax error: {message}", pos, hint)
        return SpecError(f"YAML syntax error: {problem} ({context})", pos,
                         "check indentation, colons, brackets and quotes from here on")
    pos = _mark_pos(file, mark) if mark else SourcePos(file, 1, 1)
    if "another document" in problem:
        return SpecError("the file holds more than one YAML document", pos,
                         "one neuron per file: remove the `---` and what follows, or move it to its own file")
    if "'\\t'" in problem or "\t" in problem:
        return SpecError("YAML syntax error: a tab character here", pos,
                         "YAML does not allow tabs here: replace the tab with spaces")
    if "mapping values are not allowed" in problem:
        hint = ("a ': ' inside a value starts a mapping: quote the value (e.g. s: \"a: b\"), "
                "or check the indentation")
    elif "expected <block end>" in problem:
        hint = "check the indentation: the keys of one mapping must start in the same column"
    elif "undefined alias" in problem:
        hint = "define the anchor (&name) before using the alias (*name), or write the value out"
    else:
        hint = "check indentation, colons, brackets and quotes around this place"
    where = f" ({context} at line {exc.context_mark.line + 1})" if context and exc.context_mark else ""
    return SpecError(f"YAML syntax error: {problem}{where}", pos, hint)


class _Loader(yaml.SafeLoader):
    """The safe loader, counting values as it composes them (a long flow list stops early)."""

    def __init__(self, text: str, file: str):
        super().__init__(text)
        self.file = file
        self.composed = 0

    def compose_node(self, parent, index):
        self.composed += 1
        if self.composed > MAX_NODES:
            raise SpecError(f"the spec has more than {MAX_NODES} YAML values", _mark_pos(self.file, self.get_mark()),
                            "a neuron spec has a few dozen values: check that this is the right file")
        return super().compose_node(parent, index)


def _check_tabs(text: str, file: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if stripped.startswith("\t"):
            col = len(line) - len(stripped) + 1
            raise SpecError("tab character in indentation", SourcePos(file, number, col),
                            "YAML indents with spaces only: replace the tab with spaces",
                            source_line=line)


def _decode(data: bytes, file: str, what: str) -> str:
    """UTF-8 ``data`` as text; a SpecError at the first byte that is not."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        before = data[:exc.start]
        line_start = before.rfind(b"\n") + 1
        col = len(before[line_start:].decode("utf-8", "replace")) + 1
        raise SpecError(f"{what} is not UTF-8 (byte {exc.start}: {data[exc.start:exc.end]!r})",
                        SourcePos(file, before.count(b"\n") + 1, col), "save the spec as UTF-8") from None


def spec_text(text: object, file: str = "<string>") -> str:
    """Spec text given in Python: a str, or UTF-8 bytes."""
    if isinstance(text, (bytes, bytearray, memoryview)):
        return _decode(bytes(text), file, "the spec text")
    if not isinstance(text, str):
        raise SpecTypeError(f"the spec text must be a str (or UTF-8 bytes), not {type(text).__name__}",
                            hint="pass the YAML text itself; to read a spec file, use flexsn_dsl.load(path)")
    return text


_FILE_KINDS = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISCHR, "a device"),
               (stat.S_ISBLK, "a device"), (stat.S_ISSOCK, "a socket"))


def read_spec(path: str | os.PathLike) -> str:
    """The text of a spec file, read safely: a regular file only (a FIFO, a device or a folder is
    refused without waiting on it or reading it) and at most MAX_SPEC_BYTES bytes of it."""
    if not isinstance(path, (str, os.PathLike)):
        raise SpecTypeError(f"a spec path must be a str or os.PathLike, not {type(path).__name__}",
                            hint="pass the path of a .yaml file; to load spec text, use flexsn_dsl.loads(text)")
    file = os.fsdecode(path)
    try:
        fd = os.open(file, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))  # opening a FIFO must not wait
    except (OSError, ValueError) as exc:  # ValueError: a NUL character in the path
        raise SpecError(f"cannot read {file}: {getattr(exc, 'strerror', None) or exc}", None,
                        "check the path") from None
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        kind = next((k for test, k in _FILE_KINDS if test(mode)), "a special file")
        raise SpecError(f"{file} is {kind}, not a spec file", None, "give the path of a .yaml spec file")
    with os.fdopen(fd, "rb", buffering=0) as f:
        data = bytearray()
        while len(data) <= MAX_SPEC_BYTES:
            chunk = f.read(MAX_SPEC_BYTES + 1 - len(data))
            if not chunk:
                break
            data += chunk
    if len(data) > MAX_SPEC_BYTES:
        raise SpecError(f"the spec file is more than {MAX_SPEC_BYTES} bytes, the limit", SourcePos(file, 1, 1),
                        "a neuron spec is a few dozen lines: check that this is the right file")
    return _decode(bytes(data), file, file)


def parse_yaml(text: str, file: str = "<string>") -> Node:
    """Parse spec text into a :class:`Node` tree; raise :class:`SpecError` on bad YAML."""
    size = len(text.encode("utf-8", "replace"))
    if size > MAX_SPEC_BYTES:
        raise SpecError(f"the spec is {size} bytes, more than the limit of {MAX_SPEC_BYTES}", SourcePos(file, 1, 1),
                        "a neuron spec is a few dozen lines: check that this is the right file")
    _check_tabs(text, file)
    loader = None
    try:
        loader = _Loader(text, file)  # checks that every character is printable
        root = loader.get_single_node()
        if root is None:
            raise SpecError("the spec is empty", SourcePos(file, 1, 1),
                            "write a mapping with at least `neuron:`, `states:` and `step:`")
        tree = _Converter(file, loader, text).convert(root)
    except yaml.MarkedYAMLError as exc:
        raise _yaml_error(exc, file, text) from None
    except yaml.reader.ReaderError as exc:
        before = text[:exc.position]
        pos = SourcePos(file, before.count("\n") + 1, exc.position - (before.rfind("\n") + 1) + 1)
        raise SpecError(f"the spec contains the control character U+{exc.character:04X}", pos,
                        "remove it; a spec is plain text") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML error: {exc}", SourcePos(file, 1, 1), "check that the file is a YAML mapping") from None
    except (RecursionError, MemoryError):
        pos = _mark_pos(file, loader.get_mark()) if loader else SourcePos(file, 1, 1)
        raise SpecError("YAML values are nested too deeply", pos,
                        "a spec needs only a few levels of nesting: close the brackets or reduce the indentation"
                        ) from None
    finally:
        if loader is not None:
            loader.dispose()
    if tree.kind != "mapping":
        raise SpecError(f"the top level of a spec must be a mapping, not a {tree.kind}", tree.pos,
                        "start the file with `neuron: NAME` and the other keys")
    return tree
