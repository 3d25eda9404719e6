"""Stage 1: spec text -> a tree of YAML nodes that remember where they came from.

YAML is composed with PyYAML's *safe* loader and never constructed into
arbitrary Python objects: tags such as ``!!python/object`` are rejected,
duplicate keys (which PyYAML silently merges) are errors, and alias expansion
is bounded.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml

from .errors import SourcePos, SpecError

MAX_SPEC_BYTES = 1_000_000
MAX_NODES = 20_000


@dataclass
class Node:
    """A YAML value: ``value`` is a dict[str, Node], a list[Node] or a scalar."""

    value: Any
    pos: SourcePos
    key_pos: dict[str, SourcePos] = field(default_factory=dict)
    style: str | None = None  # scalar style: None (plain), "'", '"', "|", ">"

    @property
    def kind(self) -> str:
        if isinstance(self.value, dict):
            return "mapping"
        if isinstance(self.value, list):
            return "list"
        return "scalar"

    def text_pos(self, offset: int) -> SourcePos:
        """Position of character ``offset`` of a single-line scalar's text."""
        quote = 1 if self.style in ("'", '"') else 0
        if self.style in ("|", ">"):
            return self.pos
        return SourcePos(self.pos.file, self.pos.line, self.pos.col + quote + offset)


def _mark_pos(file: str, mark: Any) -> SourcePos:
    return SourcePos(file, mark.line + 1, mark.column + 1)


_SAFE_TAGS = {
    "tag:yaml.org,2002:str", "tag:yaml.org,2002:int", "tag:yaml.org,2002:float",
    "tag:yaml.org,2002:bool", "tag:yaml.org,2002:null",
    "tag:yaml.org,2002:map", "tag:yaml.org,2002:seq",
}


class _Converter:
    def __init__(self, file: str, loader: yaml.SafeLoader):
        self.file = file
        self.loader = loader
        self.count = 0

    def convert(self, node: yaml.Node) -> Node:
        self.count += 1
        pos = _mark_pos(self.file, node.start_mark)
        if self.count > MAX_NODES:
            raise SpecError(f"the spec has more than {MAX_NODES} YAML values (alias bomb?)", pos,
                            "write the spec out plainly; aliases that expand hugely are refused")
        if node.tag not in _SAFE_TAGS:
            raise SpecError(f"YAML tag {node.tag!r} is not allowed", pos,
                            "specs are plain data: remove the tag (no !!python/... or custom tags)")
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Node] = {}
            key_pos: dict[str, SourcePos] = {}
            for key_node, value_node in node.value:
                kpos = _mark_pos(self.file, key_node.start_mark)
                if not isinstance(key_node, yaml.ScalarNode) or key_node.tag not in _SAFE_TAGS:
                    raise SpecError("mapping keys must be plain names", kpos)
                key = self.loader.construct_object(key_node)
                if key is None or isinstance(key, (list, dict)):
                    raise SpecError("mapping keys must be plain names", kpos)
                key = str(key)
                if key in out:
                    first = key_pos[key]
                    raise SpecError(f"duplicate key {key!r} (first given at line {first.line})", kpos,
                                    "each key may appear once in a mapping; remove or rename one")
                out[key] = self.convert(value_node)
                key_pos[key] = kpos
            return Node(out, pos, key_pos)
        if isinstance(node, yaml.SequenceNode):
            return Node([self.convert(item) for item in node.value], pos)
        value = self.loader.construct_object(node)
        return Node(value, pos, style=node.style)


def _check_tabs(text: str, file: str) -> None:
    for number, line in enumerate(text.splitlines(), 1):
        stripped = line.lstrip(" ")
        if stripped.startswith("\t"):
            col = len(line) - len(stripped) + 1
            raise SpecError("tab character in indentation", SourcePos(file, number, col),
                            "YAML indents with spaces only: replace the tab with spaces",
                            source_line=line)


def parse_yaml(text: str, file: str = "<string>") -> Node:
    """Parse spec text into a :class:`Node` tree; raise :class:`SpecError` on bad YAML."""
    if len(text.encode("utf-8", "replace")) > MAX_SPEC_BYTES:
        raise SpecError(f"spec is larger than {MAX_SPEC_BYTES} bytes", SourcePos(file, 1, 1))
    _check_tabs(text, file)
    loader = yaml.SafeLoader(text)
    try:
        root = loader.get_single_node()
        if root is None:
            raise SpecError("the spec is empty", SourcePos(file, 1, 1),
                            "write a mapping with at least `neuron:`, `states:` and `step:`")
        tree = _Converter(file, loader).convert(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        pos = _mark_pos(file, mark) if mark else SourcePos(file, 1, 1)
        problem = exc.problem or exc.context or "invalid YAML"
        raise SpecError(f"YAML syntax error: {problem}", pos,
                        "check indentation, colons and quotes around this place") from None
    except yaml.YAMLError as exc:
        raise SpecError(f"YAML error: {exc}", SourcePos(file, 1, 1)) from None
    except RecursionError:
        raise SpecError("YAML nesting is too deep", SourcePos(file, 1, 1)) from None
    finally:
        loader.dispose()
    if tree.kind != "mapping":
        raise SpecError(f"the top level of a spec must be a mapping, not a {tree.kind}", tree.pos,
                        "start the file with `neuron: NAME` and the other keys")
    return tree
