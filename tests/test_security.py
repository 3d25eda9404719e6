"""Untrusted input never becomes code: spec file names, plugin/pass output and the cache directory.

Each attack writes a marker folder when its payload runs; the tests load, run and build with
the hostile input and check that the marker never appears, next to unit tests of the only
path text has into generated source (:mod:`flexsn_dsl.literals`).
"""
from __future__ import annotations

import ast
import hashlib
import inspect
import math
import os
import runpy
import shutil
import stat
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import compiler
from flexsn_dsl.cli import main
from flexsn_dsl.compiler import cache_dir, compile_spec, read_cached
from flexsn_dsl.literals import identifier, literal, number, value
from flexsn_dsl.plugins import clear_cache

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


def _threshold(index: int) -> float:
    return 0.5 + index % 97 / 200


def _spec(index: int) -> str:
    """A distinct spec per case (a distinct cache key): no module is already imported for it."""
    return SPEC.format(name=f"guarded{index}", threshold=_threshold(index))


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
    threshold = _threshold(index)
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


# -- the cache directory ----------------------------------------------------------
def _planted_body(compiled) -> str:
    """A module that would run the payload and otherwise pass for the real kernels."""
    return f"{PAYLOAD}\n{compiled.triton_source}"


def _valid_file(compiled, body: str) -> bytes:
    data = body.encode()
    return f"# flexsn-dsl cache key={compiled.key} sha256={hashlib.sha256(data).hexdigest()}\n".encode() + data


def _plant(case: str, path: Path, compiled) -> None:
    body = _planted_body(compiled)
    if case == "old-style-header":  # the key anywhere in the text was enough before
        path.write_text(f"# Cache key: {compiled.key}\n{body}")
    elif case == "wrong-digest":
        path.write_bytes(_valid_file(compiled, compiled.triton_source).split(b"\n", 1)[0] + b"\n" + body.encode())
    elif case in ("group-writable", "world-writable"):
        path.write_bytes(_valid_file(compiled, body))
        path.chmod(0o660 if case == "group-writable" else 0o606)
    elif case == "symlink":
        target = path.parent.parent / "elsewhere.py"
        target.write_bytes(_valid_file(compiled, body))
        target.chmod(0o600)
        path.symlink_to(target)
    elif case == "fifo":
        os.mkfifo(path, 0o600)
    elif case == "truncated":
        data = _valid_file(compiled, compiled.triton_source)
        path.write_bytes(data[:len(data) // 2])
    elif case == "not-utf8":
        path.write_bytes(_valid_file(compiled, "x = 1\n").replace(b"x = 1", b"x = \xff"))
    else:
        raise AssertionError(case)


PLANTED = ("old-style-header", "wrong-digest", "group-writable", "world-writable", "symlink", "fifo", "truncated",
           "not-utf8")


@pytest.mark.parametrize("case", PLANTED)
def test_planted_cache_file_is_refused_and_regenerated(jail, case):
    index = 200 + PLANTED.index(case)
    compiled = compile_spec(text=_spec(index))
    cache = jail / "cache"
    cache.mkdir(mode=0o700)
    path = cache / f"{compiled.module_name}.py"
    _plant(case, path, compiled)
    x = torch.rand(5, 4, dtype=torch.float64) * 2
    neuron = flexsn_dsl.loads(_spec(index), backend="triton").double()
    torch.testing.assert_close(neuron(x), _reference(x, _threshold(index)))
    assert not path.is_symlink() and stat.S_ISREG(path.lstat().st_mode)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert read_cached(path, compiled.key) == compiled.triton_source  # replaced by a verified file


def test_verified_cache_file_is_used_as_written(jail):
    compiled = compile_spec(text=_spec(220))
    path = compiled.write()
    assert path.parent == jail / "cache" and stat.S_IMODE((jail / "cache").stat().st_mode) == 0o700
    assert read_cached(path, compiled.key) == compiled.triton_source
    assert read_cached(path, "0" * 64) is None  # another key
    assert path.read_text().splitlines()[0].startswith(f"# flexsn-dsl cache key={compiled.key} sha256=")


@pytest.mark.parametrize("mode", [0o770, 0o777, 0o1777, 0o722])
def test_cache_folder_others_can_write_is_not_used(jail, mode):
    index = 230 + [0o770, 0o777, 0o1777, 0o722].index(mode)
    compiled = compile_spec(text=_spec(index))
    cache = jail / "cache"
    cache.mkdir()
    cache.chmod(mode)
    planted = cache / f"{compiled.module_name}.py"
    planted.write_bytes(_valid_file(compiled, _planted_body(compiled)))  # a valid file of a shared folder
    planted.chmod(0o600)
    x = torch.rand(3, 4, dtype=torch.float64) * 2
    with pytest.warns(UserWarning, match="writable by group or others"):
        spikes = flexsn_dsl.loads(_spec(index), backend="triton").double()(x)  # the kernels load at a first call
    torch.testing.assert_close(spikes, _reference(x, _threshold(index)))
    assert planted.read_bytes() == _valid_file(compiled, _planted_body(compiled))  # untouched, never run


UNUSABLE = {"a-file": "is not a folder", "under-a-file": "cannot be created", "unwritable": "is not writable",
            "another-owner": "is owned by another user"}


@pytest.mark.parametrize("case", sorted(UNUSABLE))
def test_unusable_cache_path_falls_back_to_a_private_folder(jail, monkeypatch, case):
    index = 240 + sorted(UNUSABLE).index(case)
    (jail / "file").write_text("not a folder")
    if case == "a-file":
        monkeypatch.setenv("FLEXSN_DSL_CACHE", str(jail / "file"))
    elif case == "under-a-file":
        monkeypatch.setenv("FLEXSN_DSL_CACHE", str(jail / "file" / "sub"))
    elif case == "unwritable":  # what a read-only folder looks like to a user who is not root
        monkeypatch.setattr(compiler.os, "access", lambda path, mode: False)
    else:  # every file now belongs to someone else: the folder is refused, and so is every cache file
        uid = os.getuid()
        monkeypatch.setattr(compiler.os, "getuid", lambda: uid + 1)
    x = torch.rand(3, 4, dtype=torch.float64) * 2
    with pytest.warns(UserWarning, match=UNUSABLE[case]) as record:
        spikes = flexsn_dsl.loads(_spec(index), backend="triton").double()(x)
    torch.testing.assert_close(spikes, _reference(x, _threshold(index)))
    assert len([w for w in record if "cache folder" in str(w.message)]) == 1
    folder = cache_dir()
    assert folder != jail / "file" and stat.S_IMODE(folder.stat().st_mode) == 0o700
    compiled = compile_spec(text=_spec(index))
    cached = read_cached(folder / f"{compiled.module_name}.py", compiled.key)
    assert cached == (None if case == "another-owner" else compiled.triton_source)  # a file of another user: refused
    assert (jail / "file").read_text() == "not a folder"


def test_kernels_run_from_the_verified_bytes(jail):
    """Replacing the cache file after it was verified changes nothing: the module is never re-read;
    tracebacks and inspect still see the source (triton.jit needs it)."""
    compiled = compile_spec(text=_spec(250))
    module = compiled.triton_module()
    path = cache_dir() / f"{compiled.module_name}.py"
    path.write_text(f"{PAYLOAD}\n")
    assert "def guarded250_forward_core(" in inspect.getsource(module.guarded250_forward_core.fn)
    x = torch.rand(3, 4, dtype=torch.float64) * 2
    neuron = flexsn_dsl.loads(_spec(250), backend="triton").double()
    torch.testing.assert_close(neuron(x), _reference(x, _threshold(250)))


# -- stale kernels -----------------------------------------------------------------
TUNABLE = """
import os
import flexsn_dsl

@flexsn_dsl.hookimpl
def flexsn_dsl_register_surrogates(registry):
    registry.register("tunable", gradient="alpha * exp(-alpha * Abs(x))",
                      params={"alpha": float(os.environ["TUNABLE_ALPHA"])})
"""
ONE_STEP = """neuron: {name}
inputs: [x]
surrogate: tunable
states: {{v: 0.0}}
step:
  h: v + x
  s: spike(h - 1.0)
  v: h * (1 - s)
outputs: [s]
"""


def _input_grad(neuron, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    neuron(x).sum().backward()
    return x.grad


@pytest.mark.parametrize("edit", ["environment", "source"])
def test_plugin_surrogate_default_change_gives_a_new_kernel(jail, monkeypatch, edit):
    """A plugin changing a surrogate's default alpha (with its source unchanged, or edited) gets a new
    Triton kernel: both backends follow the new alpha (dS/dx = alpha exp(-alpha |x - 1|) at T = 1)."""
    plugin = jail / "tunable.py"
    plugin.write_text(TUNABLE)
    spec = ONE_STEP.format(name=f"stale_{edit}")
    x = torch.linspace(-1, 3, 9, dtype=torch.float64).reshape(1, 9)
    keys = set()
    for alpha in (1.0, 3.0):
        monkeypatch.setenv("TUNABLE_ALPHA", str(alpha))
        if edit == "source":
            plugin.write_text(TUNABLE + f"# alpha {alpha}\n")
        clear_cache()
        keys.add(compile_spec(text=spec, plugins=[plugin]).key)
        expected = alpha * torch.exp(-alpha * (x - 1).abs())
        for backend in ("torch", "triton"):
            neuron = flexsn_dsl.loads(spec, plugins=[plugin], backend=backend).double()
            torch.testing.assert_close(_input_grad(neuron, x), expected)
    assert len(keys) == 2
    clear_cache()


@pytest.mark.parametrize("module", ["expressions.py", "model/equations.py", "nir/kinds.py", "plugins.py", "runtime.py", "literals.py"])
def test_package_source_change_gives_a_new_key(tmp_path, monkeypatch, module):
    package = Path(compiler.__file__).parent
    copy = tmp_path / "flexsn_dsl"
    shutil.copytree(package, copy, ignore=shutil.ignore_patterns("__pycache__"))
    assert compiler.generator_fingerprint(copy) == compiler.generator_fingerprint()
    with open(copy / module, "a") as f:
        f.write("# edited\n")
    changed = compiler.generator_fingerprint(copy)
    assert changed != compiler.generator_fingerprint()
    compiled = compile_spec(text=_spec(260))
    before = compiler.Compiled(compiled.model, dict(compiled.values)).key
    monkeypatch.setattr(compiler, "GENERATOR_VERSION", f"{flexsn_dsl.__version__}+{changed}")
    assert compiler.Compiled(compiled.model, dict(compiled.values)).key != before


SCALING_PASS = """
import json
import flexsn_dsl
from pathlib import Path

def scale_input(ir):
    factor = json.loads(Path(__file__).with_name("factor.json").read_text())
    return ir.replace_exprs(lambda e: e.xreplace({ir.inputs[0]: factor * ir.inputs[0]}))

def tag(source, module_name):
    return source + "# tag " + Path(__file__).with_name("factor.json").read_text() + "\\n"

@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry):
    registry.register("scale_input", stage="ir", function=scale_input)
    registry.register("tag", stage="source", function=tag)
"""


def test_ir_pass_reading_other_code_gives_a_new_key(jail):
    """What an IR pass returns is part of the key, whatever the pass reads (here a data file)."""
    plugin = jail / "scaling.py"
    plugin.write_text(SCALING_PASS)
    spec = _spec(270)
    x = torch.rand(6, 4, dtype=torch.float64)
    keys = set()
    for factor in (1.0, 3.0):
        (jail / "factor.json").write_text(str(factor))
        clear_cache()
        keys.add(compile_spec(text=spec, plugins=[plugin], passes=["scale_input"]).key)
        neuron = flexsn_dsl.loads(spec, plugins=[plugin], passes=["scale_input"], backend="triton").double()
        torch.testing.assert_close(neuron(x), _reference(factor * x, _threshold(270)))
    assert len(keys) == 2
    clear_cache()


def test_source_pass_output_is_regenerated_not_read_from_the_cache(jail):
    """With a source pass, a cache file holding the right key is still not trusted."""
    plugin = jail / "scaling.py"
    plugin.write_text(SCALING_PASS)
    (jail / "factor.json").write_text("2.0")
    clear_cache()
    compiled = compile_spec(text=_spec(280), plugins=[plugin], passes=["tag"])
    cache = jail / "cache"
    cache.mkdir(mode=0o700)
    path = cache / f"{compiled.module_name}.py"
    path.write_bytes(_valid_file(compiled, _planted_body(compiled)))
    path.chmod(0o600)
    module = compiled.triton_module()
    assert module.INFO.neuron == "guarded280"
    assert path.read_text().endswith("# tag 2.0\n") and PAYLOAD not in path.read_text()
    clear_cache()


# -- what passes return --------------------------------------------------------------
BAD_OUTPUT_PASSES = f"""
import dataclasses
import sympy
import flexsn_dsl

def first_assigned(ir, name):
    return dataclasses.replace(ir, assignments=((sympy.Symbol(name, real=True), ir.inputs[0]), *ir.assignments))

def named_h_q(ir):
    return first_assigned(ir, "h q")

def named_payload(ir):
    return first_assigned(ir, "h = {PAYLOAD}")

def named_tl(ir):
    return first_assigned(ir, "tl")

def named_like_a_kernel(ir):
    return first_assigned(ir, ir.name + "_forward_core")

def no_outputs(ir):
    return dataclasses.replace(ir, outputs=())

def renamed_output(ir):
    return dataclasses.replace(ir, output_names=("spikes",))

def exits(ir):
    raise SystemExit(3)

class Escape(BaseException):
    pass

def escapes(ir):
    raise Escape("not an Exception")

def drops_everything(source, module_name):
    return "x = 1\\n"

def drops_backward(source, module_name):
    return source.replace("_backward_kernel(", "_other_kernel(")

def payload_only(source, module_name):
    return "{PAYLOAD}\\n"

@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry):
    for f in (named_h_q, named_payload, named_tl, named_like_a_kernel, no_outputs, renamed_output, exits, escapes):
        registry.register(f.__name__, stage="ir", function=f)
    for f in (drops_everything, drops_backward, payload_only):
        registry.register(f.__name__, stage="source", function=f)
"""
BAD_OUTPUTS = {
    "named_h_q": "returned an invalid IR: assignment target: 'h q' is not an identifier",
    "named_payload": "returned an invalid IR: assignment target: ",
    "named_tl": "returned an invalid IR: assignment target: 'tl' is reserved",
    "named_like_a_kernel": "_forward_core' is reserved",
    "no_outputs": "returned an invalid IR: 0 outputs for 1 output names",
    "renamed_output": "returned an invalid IR: output_names changed from ('s',) to ('spikes',)",
    "exits": "(stage ir) raised SystemExit: 3",
    "escapes": "(stage ir) raised Escape: not an Exception",
    "drops_everything": "(stage source) returned a module without INFO, ",
    "drops_backward": "(stage source) returned a module without guarded",
    "payload_only": "(stage source) returned a module without INFO",
}


@pytest.mark.parametrize("name", sorted(BAD_OUTPUTS))
def test_bad_pass_output_is_a_plugin_error_naming_the_pass(jail, name):
    plugin = jail / "bad_outputs.py"
    plugin.write_text(BAD_OUTPUT_PASSES)
    clear_cache()
    index = 300 + sorted(BAD_OUTPUTS).index(name)
    source_pass = name in ("drops_everything", "drops_backward", "payload_only")
    for backend in ("triton",) if source_pass else ("torch", "triton"):  # source passes rewrite Triton modules
        with pytest.raises(flexsn_dsl.PluginError) as info:
            flexsn_dsl.loads(_spec(index), plugins=[plugin], passes=[name], backend=backend)(torch.ones(2, 3))
        message = info.value.message
        assert message.startswith(f"plugin {plugin}: code-generation pass {name!r}"), message
        assert BAD_OUTPUTS[name] in message, message
    clear_cache()
