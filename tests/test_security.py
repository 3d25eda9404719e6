"""Untrusted input never becomes code: spec file names, plugin/pass output and the cache directory.

Each attack writes a marker folder when its payload runs; the tests load, run and build with
the hostile input and check that the marker never appears, next to unit tests of the only
path text has into generated source (:mod:`flexsn_dsl.literals`).
"""
from __future__ import annotations

import ast
import math
import runpy
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.literals import identifier, literal, number, value

MARKER = "PWNED"
PAYLOAD = f"__import__('os').mkdir({MARKER!r})"
# A file name that breaks out of a comment line in every way a line can end (or look like it ends).
HOSTILE_NAMES = {
    "newline": f"a\n{PAYLOAD}\n#.yaml",
    "carriage-return": f"a\r{PAYLOAD}\r#.yaml",
    "crlf": f"a\r\n{PAYLOAD}\r\n#.yaml",
    "line-separator": f"a\u2028{PAYLOAD}\u2029#.yaml",
    "quotes-and-hash": f"#'''\"\"\"\n{PAYLOAD} #\n.yaml",
    "form-feed": f"a\x0c\x0b\n{PAYLOAD}\n.yaml",
    "next-line": f"a\x85{PAYLOAD}\x1c#.yaml",
}
SPEC = """neuron: {name}
inputs: [x]
parameters:
  tau: 2.0
  v_th: {threshold}
states:
  v: 0.0
step:
  h: v + (x - v) / tau
  s: spike(h - v_th)
  v: h * (1 - s)
outputs: [s]
"""


def _spec(index: int) -> str:
    """A distinct spec per case (a distinct cache key): no module is already imported for it."""
    return SPEC.format(name=f"guarded{index}", threshold=0.5 + index / 64)


def _reference(x: torch.Tensor, threshold: float) -> torch.Tensor:
    v, spikes = torch.zeros_like(x[0]), []
    for x_t in x:
        v = v + (x_t - v) / 2.0
        s = (v >= threshold).to(x.dtype)
        v = v * (1 - s)
        spikes.append(s)
    return torch.stack(spikes)


@pytest.fixture
def jail(tmp_path, monkeypatch):
    """Run in an empty folder with a private cache; fail if the payload ever ran."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("FLEXSN_DSL_CACHE", str(tmp_path / "cache"))
    yield tmp_path
    assert not (tmp_path / MARKER).exists(), "a hostile file name ran as code"


def _check_generated(compiled, hostile: str) -> None:
    for source in (compiled.torch_source, compiled.triton_source):
        assert hostile not in source and PAYLOAD not in source
        assert not any(ch in source for ch in "\r\x0b\x0c\x1c\x85\u2028\u2029")
        ast.parse(source)


# -- literals -------------------------------------------------------------------
@pytest.mark.parametrize("name", ["v", "_", "v__next", "A1_b", "x" * 300])
def test_identifier_accepts_plain_names(name):
    assert identifier(name) == name


@pytest.mark.parametrize("name", ["", "1v", "h q", "a-b", "a.b", "a\nb", "a;b", "é", "v\u2028", "a\x00", "class",
                                  "None", "True", "lambda", 3, None, b"v", ["v"]])
def test_identifier_refuses_anything_else(name):
    with pytest.raises(ValueError, match="not an identifier"):
        identifier(name)


def test_identifier_keyword_only_as_a_prefix():
    assert identifier("class", keyword_ok=True) == "class"
    with pytest.raises(ValueError):
        identifier("cl ass", keyword_ok=True)


@pytest.mark.parametrize("x", [0, -3, 10 ** 40, 0.1, -0.0, 1e-300, 5e-324, 1.7976931348623157e308, 2 / 3, -1e22])
def test_number_reads_back_exactly(x):
    text = number(x)
    back = ast.literal_eval(text)
    assert back == x and type(back) is type(x) and math.copysign(1, back) == math.copysign(1, x)


@pytest.mark.parametrize("x", [True, False, math.inf, -math.inf, math.nan, "1", None, 1j, [1.0]])
def test_number_refuses_non_numbers_and_non_finite(x):
    with pytest.raises(ValueError):
        number(x)


@pytest.mark.parametrize("text", ["", "plain", "a\nb", "'\"\"\"'''", "\\", "x\r\x00\x0b\x0c\x1c\x85\u2028\u2029y",
                                  "#", "\U0001f600", "\x1b[31mred"])
def test_literal_is_one_line_that_reads_back(text):
    source = literal(text)
    assert len(source.splitlines()) == 1 and ast.literal_eval(source) == text
    assert ast.literal_eval(f"# {source}\n{source}") == text  # safe after a comment too
    with pytest.raises(ValueError):
        literal(b"bytes")


def test_value_prints_nested_data_that_reads_back():
    data = {"neuron": "n", "names": ("x", "y\n"), "one": ("z",), "empty": (), "pairs": (("saved", 0),),
            "constants": {"tau": 2.5}, "list": [1, -2.0]}
    assert ast.literal_eval(value(data)) == data
    for bad in ({"x": math.inf}, (None,), {"x": object()}):
        with pytest.raises(ValueError):
            value(bad)


# -- file names -----------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("case", sorted(HOSTILE_NAMES))
def test_hostile_file_name_never_runs(jail, case, backend):
    index = sorted(HOSTILE_NAMES).index(case) + (0 if backend == "torch" else 32)
    hostile, text = HOSTILE_NAMES[case], _spec(index)
    threshold = 0.5 + index / 64
    x = torch.rand(6, 5, dtype=torch.float64) * 2
    path = jail / hostile
    path.write_text(text)
    from_file = flexsn_dsl.load(path, backend=backend).double()
    from_text = flexsn_dsl.loads(text, filename=hostile + "\x00", backend=backend).double()
    for neuron in (from_file, from_text):
        torch.testing.assert_close(neuron(x), _reference(x, threshold))
    _check_generated(compile_spec(path), hostile)
    _check_generated(compile_spec(hostile + "\x00", text=text), hostile)
    # the same text under a harmless name uses the same (clean) cache file
    harmless = jail / "harmless.yaml"
    harmless.write_text(text)
    torch.testing.assert_close(flexsn_dsl.load(harmless, backend=backend).double()(x), _reference(x, threshold))


def test_build_with_hostile_file_names_writes_no_code_from_them(jail, capsys):
    folder = jail / "specs"
    folder.mkdir()
    for index, (case, hostile) in enumerate(sorted(HOSTILE_NAMES.items())):
        (folder / hostile).write_text(_spec(100 + index))
    assert main(["build", "-o", str(jail / "build"), str(folder)]) == 0, capsys.readouterr().err
    built = sorted((jail / "build").glob("*.py"))
    assert len(built) == 2 * len(HOSTILE_NAMES)
    for path in built:
        source = path.read_text()
        assert PAYLOAD not in source and "\r" not in source and "\u2028" not in source
        runpy.run_path(str(path))  # importing every built module runs nothing from a file name
