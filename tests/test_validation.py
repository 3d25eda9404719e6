"""The validated model refuses every bad input with a clear ``file:line:col`` error, and
``flexsn-dsl check`` gives the same verdict as ``load``.

Each table row is a bad spec with the line and column of the offending token and a piece
of the message or hint. Every row is loaded (``load`` from a file) and checked (``flexsn-dsl
check`` in-process): both must refuse it with the same message at the same place.
"""
from __future__ import annotations

import ast
import math
import os
import threading
import tracemalloc

import numpy as np
import pytest
import torch

import flexsn_dsl
from flexsn_dsl import SpecError
from flexsn_dsl.cli import main
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.errors import SpecTypeError
from flexsn_dsl.model import MODULE_ATTRIBUTES
from flexsn_dsl.names import generated_names
from flexsn_dsl.source import MAX_SPEC_BYTES

P = pytest.param

LIF = """\
neuron: n
parameters:
  tau: {tau}
states:
  v: {init}
step:
  v: v + (x - v) / tau
  s: spike(v - 1.0)
"""


def lif(tau: str = "2.0", init: str = "0.0") -> str:
    """A LIF spec with ``tau`` (line 3, column 8) and the initial value of v (line 5, column 6)."""
    return LIF.format(tau=tau, init=init)


def refused(tmp_path, text: str, capsys, **load_kwargs) -> SpecError:
    """Load ``text`` from a file and run ``flexsn-dsl check`` on it: both must refuse it with
    the same message; returns the error ``load`` raised."""
    path = tmp_path / "bad.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as info:
        flexsn_dsl.load(path, backend="torch", **load_kwargs)
    exc = info.value
    args = [f"--param={k}={v}" for k, v in load_kwargs.get("params", {}).items()]
    capsys.readouterr()
    assert main(["check", str(path), *args]) == 1
    err = capsys.readouterr().err
    assert exc.format() in err, err
    assert "internal error" not in err and "Traceback" not in err
    return exc


def assert_at(exc: SpecError, line: int, col: int, fragment: str) -> None:
    assert (exc.line, exc.col) == (line, col), str(exc)
    assert fragment in f"{exc.message} {exc.hint}", str(exc)
    assert exc.hint and exc.file.endswith("bad.yaml")


# ---------------------------------------------------------------------------------------
# YAML 1.1 numbers: never silently octal or base 60
# ---------------------------------------------------------------------------------------
YAML_NUMBERS = [
    P(lif(tau="012"), 3, 8, "octal number 10", id="octal-parameter"),
    P(lif(tau="-012"), 3, 8, "write -12", id="negative-octal"),
    P(lif(tau="+0_17"), 3, 8, "octal number 15", id="octal-underscore"),
    P(lif(tau="00"), 3, 8, "leading zero", id="double-zero"),
    P(lif(tau="08"), 3, 8, "leading zero", id="leading-zero-not-octal"),
    P(lif(tau="{value: 010, learnable: true}"), 3, 16, "write 10 without the leading zero", id="octal-in-mapping"),
    P(lif(init="012"), 5, 6, "octal number 10", id="octal-initial-value"),
    P(lif(tau="1:30"), 3, 8, "base-60 number (90)", id="sexagesimal"),
    P(lif(tau="-1:30"), 3, 8, "(-90)", id="negative-sexagesimal"),
    P(lif(tau="1:30.5"), 3, 8, "(90.5)", id="sexagesimal-float"),
    P(lif(tau="1:00:00"), 3, 8, "(3600)", id="sexagesimal-hours"),
    P(lif(init="2:00"), 5, 6, "(120)", id="sexagesimal-initial-value"),
    P(lif().replace("s: spike(v - 1.0)", "s: spike(v - 1.0)\n  w: 1:30"), 9, 6, "(90)", id="sexagesimal-step"),
    P(lif().replace("  v: v + (x", "  012: 1.0\n  v: v + (x"), 7, 3, "octal number 10", id="octal-key"),
    P(lif(tau="1" * 5000), 3, 8, "5000 characters", id="huge-int"),
    P(lif(tau="-" + "9" * 4301), 3, 8, "4302 characters", id="huge-negative-int"),
    P(lif(init="1" * 401), 5, 6, "far too large for a float64", id="huge-int-initial-value"),
    P(lif(tau="1" + "0" * 309), 3, 8, "too large for a float64", id="int-beyond-float64"),
]


@pytest.mark.parametrize("text, line, col, fragment", YAML_NUMBERS)
def test_yaml_1_1_numbers_are_refused_with_a_hint(tmp_path, capsys, text, line, col, fragment):
    assert_at(refused(tmp_path, text, capsys), line, col, fragment)


@pytest.mark.parametrize("text, value", [
    ("0x1F", 0x1F), ("0b101", 0b101), ("0o17", 0o17), ("-0o1_7", -0o17), ("12", 12), ("0", 0), ("0.5", 0.5),
    ("1_000", 1000), ("1e-3", 1e-3), ("012.5", 12.5), ("'012'", None), ("'1:30'", None),
])
def test_unambiguous_numbers_read_as_written(text, value):
    """Prefixed integers are read as Python reads them; a quoted 012 is text, which a
    parameter refuses as not a number (never as 10)."""
    spec = lif(tau=text)
    if value is None:
        with pytest.raises(SpecError, match="must be a number, not str"):
            flexsn_dsl.loads(spec, backend="torch")
        return
    spec = spec.replace("(x - v) / tau", "(x - v) * tau")  # tau = 0 is allowed here
    m = flexsn_dsl.loads(spec, backend="torch")
    assert m.spec.parameters["tau"].value == value


# ---------------------------------------------------------------------------------------
# Non-finite values: refused in parameters, initial values, expressions and after folding
# ---------------------------------------------------------------------------------------
FOLD = """\
neuron: n
parameters:
  big: {big}
states:
  v: {init}
step:
  a: big * 10.0
  v: v + x * {use}
  s: spike(v - 1.0)
"""


def fold(big: str = "1.0e300", init: str = "0.0", use: str = "a * 1.0e10") -> str:
    return FOLD.format(big=big, init=init, use=use)


NON_FINITE = [
    P(lif(tau=".inf"), 3, 8, "infinite", id="inf-parameter"),
    P(lif(tau="-.inf"), 3, 8, "infinite", id="minus-inf-parameter"),
    P(lif(tau=".nan"), 3, 8, "NaN", id="nan-parameter"),
    P(lif(tau="1e309"), 3, 8, "infinite or too large", id="overflowing-parameter"),
    P(lif(tau="{value: -2e400, learnable: true}"), 3, 16, "infinite or too large", id="overflowing-learnable"),
    P(lif(init=".inf"), 5, 6, "infinite", id="inf-initial-value"),
    P(lif(init="1.0e308 * 10"), 5, 6, "not a finite real number", id="overflowing-initial-value"),
    P(lif(init="tau * 1.0e308"), 5, 3, "tau = 2 (line 3)", id="initial-value-folds-to-inf"),
    P(lif().replace("v - 1.0", "v - 1.0e308 * 10"), 8, 16, "not a finite real number", id="overflowing-expression"),
    P(lif().replace("(x - v) / tau", "(x - v) * tau * 1.0e308"), 7, 3, "tau = 2 (line 3)",
      id="expression-folds-to-inf"),
    P(fold(), 8, 3, "a = 1e+301 (line 7)", id="folded-step-overflows-later"),
    P(fold(use="a * a"), 8, 3, "a = 1e+301 (line 7)", id="folded-step-squared"),
    P(fold(big="1.0e200", use="exp(a)"), 8, 3, "a = 1e+201 (line 7)", id="folded-exp"),
    P(fold(big="{value: 1.0e300, learnable: true}", use="big * 1.0e10"), 8, 3, "big = 1e+300 (line 3)",
      id="learnable-value-overflows"),
    P(fold(big="0.0", use="1.0 / big"), 8, 3, "big = 0 (line 3)", id="division-by-zero"),
    P(fold(big="-1.0", use="sqrt(big)"), 8, 3, "big = -1 (line 3)", id="complex-root"),
    P(fold(big="1000", use="where(x > 0, exp(big), 0.0)"), 8, 3, "big = 1000 (line 3)", id="inf-in-a-branch"),
    P(lif().replace("step:", "surrogate: {name: sigmoid, alpha: .inf}\nstep:"), 6, 35, "infinite",
      id="inf-surrogate-parameter"),
]


@pytest.mark.parametrize("text, line, col, fragment", NON_FINITE)
def test_non_finite_values_are_refused_where_they_are_written(tmp_path, capsys, text, line, col, fragment):
    assert_at(refused(tmp_path, text, capsys), line, col, fragment)


def test_a_large_but_finite_chain_still_loads():
    """The near miss of the folding rows: every constant fits a float64, so both backends run it
    and agree with a hand computation."""
    spec = fold(big="1.0e300", use="a * 1.0e-300")  # a = 1e301; v = v + x * 10
    x = torch.tensor([[0.05, 0.2]], dtype=torch.float64)
    for backend in ("torch", "triton"):
        m = flexsn_dsl.loads(spec, backend=backend).double()
        s = m(x)
        assert torch.equal(s, (x * 10.0 - 1.0 >= 0).to(s.dtype)), backend
        assert torch.allclose(m.states["v"], x[0] * 10.0)


@pytest.mark.parametrize("value, fragment", [
    (math.inf, "params['tau'] = inf is not a finite number"),
    (-math.inf, "params['tau'] = -inf is not a finite number"),
    (math.nan, "params['tau'] = nan is not a finite number"),
    (np.float64("inf"), "params['tau'] = inf is not a finite number"),
    (torch.tensor(float("nan")), "params['tau'] = nan is not a finite number"),
    (1e-320, "(params=)"),  # finite, but x / tau overflows
    (0.0, "tau = 0 (params=)"),
])
def test_non_finite_params_are_refused_naming_the_parameter(tmp_path, capsys, value, fragment):
    path = tmp_path / "bad.yaml"
    exc = refused(tmp_path, lif(), capsys, params={"tau": value})
    assert fragment in exc.message, str(exc)
    assert not isinstance(exc, TypeError) and exc.hint
    assert exc.line in (3, 7) and str(exc).startswith(f"{path}:{exc.line}:")


@pytest.mark.parametrize("value", [P(10 ** 400, id="1e400"), P(-(10 ** 5000), id="-1e5000")])
def test_params_of_ints_beyond_float64_are_refused(value):
    with pytest.raises(SpecError) as info:
        flexsn_dsl.loads(lif(), params={"tau": value}, backend="torch", filename="t.yaml")
    assert info.value.message == "params['tau'] is too large for a float64" and info.value.hint
    assert (info.value.line, info.value.col) == (3, 3) and not isinstance(info.value, TypeError)


@pytest.mark.parametrize("params, fragment", [
    ({"tau": True}, "must be a number, not bool True"),
    ({"tau": np.bool_(False)}, "must be a number, not bool"),
    ({"tau": torch.tensor(True)}, "must be a number, not bool True"),
    ({"tau": "2.0"}, "must be a number, not str '2.0'"),
    ({"tau": None}, "must be a number, not NoneType"),
    ({"tau": 1j}, "must be a number, not complex"),
    ({"tau": [2.0]}, "must be a number, not list"),
    ({"tau": torch.tensor([2.0, 3.0])}, "must be a number, not Tensor"),
    ([("tau", 2.0)], "params= must be a dict"),
    ([2.0], "params= must be a dict"),
    ("tau=2", "params= must be a dict"),
    (2.0, "params= must be a dict"),
])
def test_params_of_the_wrong_type_raise_a_type_error(params, fragment):
    with pytest.raises(TypeError) as info:
        flexsn_dsl.loads(lif(), params=params, backend="torch")
    assert isinstance(info.value, SpecError)  # one class for callers that catch every refusal
    assert fragment in info.value.message and info.value.hint, str(info.value)


@pytest.mark.parametrize("value", [3, np.float32(3.0), np.int64(3), torch.tensor(3.0), np.array(3.0)])
def test_params_of_any_real_number_type_are_used_as_floats(value):
    """Each value gives the same module as the float 3.0: the same decay (v = x / 3 after one step)."""
    m = flexsn_dsl.loads(lif(), params={"tau": value}, backend="torch").double()
    x = torch.tensor([[0.3, 0.9]], dtype=torch.float64)
    m(x)
    assert m._compiled.values["tau"] == 3.0 and type(m._compiled.values["tau"]) is float
    assert torch.allclose(m.states["v"], x[0] / 3.0)


def test_spec_type_error_is_both_classes():
    assert issubclass(SpecTypeError, SpecError) and issubclass(SpecTypeError, TypeError)


# ---------------------------------------------------------------------------------------
# Names: no clash with generated code, the module's attributes or Python modules; bounded length
# ---------------------------------------------------------------------------------------
SIMPLE = """\
neuron: {neuron}
inputs: [{input}]
parameters:
  {param}: {{value: 0.5, learnable: {learnable}}}
states:
  {state}: 0.0
step:
  {temp}: {state} + {input} * {param}
  {state}: {temp}
  s: spike({state} - 1.0)
outputs: [{outputs}]
"""


def simple(neuron="n", input="x", param="w", learnable="false", state="v", temp="h", outputs="s") -> str:
    """Names at: neuron 1:9, input 2:10, parameter 4:3, state 6:3, temp 8:3, first output 11:11."""
    return SIMPLE.format(neuron=neuron, input=input, param=param, learnable=learnable, state=state, temp=temp,
                         outputs=outputs)


NAMES = [
    P(simple(temp="n_forward_core"), 8, 3, "generated Triton function", id="step-forward-core"),
    P(simple(temp="n_backward_core"), 8, 3, "generated Triton function", id="step-backward-core"),
    P(simple(state="n_inference_kernel"), 6, 3, "generated Triton function", id="state-kernel"),
    P(simple(input="n_forward_final_state_kernel"), 2, 10, "generated Triton function", id="input-kernel"),
    P(simple(param="n_backward_kernel"), 4, 3, "generated Triton function", id="parameter-kernel"),
    P(simple(neuron="lif", temp="lif_forward_core"), 8, 3, "generated Triton function", id="other-neuron-name"),
    P(simple(param="states", learnable="true"), 4, 3, "attribute `states`", id="learnable-states"),
    P(simple(param="state_seqs", learnable="true"), 4, 3, "attribute `state_seqs`", id="learnable-state-seqs"),
    P(simple(param="training", learnable="true"), 4, 3, "rename the parameter", id="learnable-training"),
    P(simple(param="forward", learnable="true"), 4, 3, "attribute `forward`", id="learnable-forward"),
    P(simple(param="reset", learnable="true"), 4, 3, "attribute `reset`", id="learnable-reset"),
    P(simple(param="to", learnable="true"), 4, 3, "attribute `to`", id="learnable-to"),
    P(simple(param="spec", learnable="true"), 4, 3, "attribute `spec`", id="learnable-spec"),
    # every parameter is registered on the module (constants as buffers, for state_dict)
    P(simple(param="states"), 4, 3, "attribute `states`", id="constant-parameter-named-states"),
    P(simple(outputs="w"), 11, 11, "is a parameter", id="output-constant-parameter"),
    P(simple(outputs="s, w", learnable="true"), 11, 14, "is a parameter", id="output-learnable-parameter"),
    P(simple(neuron="a" * 65), 1, 9, "65 characters long, more than the limit of 64", id="neuron-name-65"),
    P(simple(neuron="a" * 300), 1, 9, "300 characters", id="neuron-name-300"),
    P(simple(temp="t" * 129), 8, 3, "more than the limit of 128", id="step-name-129"),
    P(simple(state="v" * 1000), 6, 3, "more than the limit of 128", id="state-name-1000"),
    P(simple(neuron="torch"), 1, 9, "name of a Python module", id="neuron-torch"),
    P(simple(neuron="triton"), 1, 9, "shadow the module 'triton'", id="neuron-triton"),
    P(simple(neuron="numpy"), 1, 9, "name of a Python module", id="neuron-numpy"),
    P(simple(neuron="flexsn_dsl"), 1, 9, "name of a Python module", id="neuron-flexsn-dsl"),
    P(simple(neuron="math"), 1, 9, "name of a Python module", id="neuron-math"),
    P(simple(neuron="os"), 1, 9, "name of a Python module", id="neuron-os"),
    P(simple(neuron="Torch"), 1, 9, "name of a Python module", id="neuron-torch-capitalised"),
    P(simple(neuron="sitecustomize"), 1, 9, "name of a Python module", id="neuron-sitecustomize"),
    P(simple(neuron="builtins"), 1, 9, "name of a Python module", id="neuron-builtins"),
]


@pytest.mark.parametrize("text, line, col, fragment", NAMES)
def test_names_that_would_clash_are_refused(tmp_path, capsys, text, line, col, fragment):
    assert_at(refused(tmp_path, text, capsys), line, col, fragment)


@pytest.mark.parametrize("text", [
    P(simple(temp="n_forward_cores", state="n_forward", param="m_backward_core"), id="near-generated-names"),
    P(simple(neuron="a" * 64, temp="t" * 128), id="longest-names"),
    P(simple(neuron="torch_neuron", outputs="s, h, x"), id="module-name-prefix"),
])
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_names_next_to_the_refused_ones_build_and_run(text, backend):
    """The near misses of the rows above load on both backends and compute the hand-written step
    (h = v + 0.5 x; v = h; s = spike(v - 1))."""
    m = flexsn_dsl.loads(text, backend=backend).double()
    x = torch.tensor([[0.4, 1.0, 2.5], [1.0, 1.5, 0.1]], dtype=torch.float64)
    out = m(x)
    s = out[0] if isinstance(out, tuple) else out
    v = torch.zeros(3, dtype=torch.float64)
    for t in range(2):
        v = v + 0.5 * x[t]
        assert torch.equal(s[t], (v >= 1.0).to(s.dtype))
        if isinstance(out, tuple):  # outputs s, h, x
            assert torch.allclose(out[1][t], v) and torch.equal(out[2][t], x[t])


HELPERS = {"_heaviside", "_heaviside_ge", "_tile_load", "_tile_rows"}


def test_generated_names_are_the_generated_modules_functions():
    """names.generated_names lists exactly the top-level functions the Triton module defines
    from the neuron's name (plus the shared helpers _heaviside, _tile_load and _tile_rows, the printer's
    _heaviside_ge (a spike's comparison, flexsn_dsl.chain), and the scans'
    combines of a time-parallel spec such as this one, without a reset)."""
    compiled = compile_spec(text=simple(neuron="lif"))
    tree = ast.parse(compiled.triton_source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert functions == generated_names("lif", recurrent=False) | {*HELPERS, "_compose", "_compose_adjoint"}
    recurrent = compile_spec(text=simple(neuron="lif", input="x", param="w").replace("x * w", "(x + r) * w")
                             + "recurrent: {r: {from: s}}\n")
    assert recurrent.model.recurrent
    tree = ast.parse(recurrent.triton_source)
    functions = {node.name for node in tree.body if isinstance(node, ast.FunctionDef)}
    assert functions == generated_names("lif", scan=False) | HELPERS


def test_module_attributes_cover_the_real_module():
    """MODULE_ATTRIBUTES holds every public attribute of a FlexSN instance and of nn.Module,
    so a learnable parameter can never take one (a new attribute fails this test)."""
    m = flexsn_dsl.loads(simple(), backend="torch")
    real = {n for n in {*dir(m), *dir(torch.nn.Module)} if not n.startswith("_")} - set(m.spec.parameters)
    assert real <= MODULE_ATTRIBUTES, sorted(real - MODULE_ATTRIBUTES)


# ---------------------------------------------------------------------------------------
# Reading: one reader for load, check and show; regular files only, at most the size limit
# ---------------------------------------------------------------------------------------
GOOD = "neuron: n\nstates: {v: 0.0}\nstep:\n  s: spike(v + x - 1.0)\n"


def _bad_path(tmp_path, kind: str) -> str:
    path = tmp_path / f"{kind}.yaml"
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        return "/dev/zero"
    elif kind == "folder":
        path.mkdir()
        (path / "inner.yaml").write_text(GOOD)  # a folder of specs is still not a spec file for load
    elif kind == "oversized":
        path.write_text(GOOD + "#" * (MAX_SPEC_BYTES - len(GOOD) + 1))  # one byte over
    elif kind == "huge-sparse":
        with open(path, "wb") as f:
            f.truncate(200 * MAX_SPEC_BYTES)  # 200 MB that take no disk space
    elif kind == "binary":
        path.write_bytes(b"neuron: n\nstates: {v: \xff\xfe}\n")
    return str(path)


READ_ERRORS = [
    P("fifo", "is a FIFO (named pipe), not a spec file", None, id="fifo"),
    P("device", "/dev/zero is a device, not a spec file", None, id="dev-zero"),
    P("oversized", "more than 1000000 bytes", (1, 1), id="one-byte-over"),
    P("huge-sparse", "more than 1000000 bytes", (1, 1), id="200-MB"),
    P("binary", "is not UTF-8 (byte 22: b'\\xff')", (2, 13), id="not-utf8"),
]


def _unblock_after(path: str, seconds: float):
    """A guard for a reader that waits on a FIFO: opens it for writing after ``seconds`` (so a hung
    read returns) and reports whether it had to."""
    state = {"had_to": False}
    done = threading.Event()

    def guard():
        if not done.wait(seconds) and os.path.exists(path) and not os.path.isfile(path) and path != "/dev/zero":
            state["had_to"] = True
            with open(path, "wb"):
                pass

    thread = threading.Thread(target=guard, daemon=True)
    thread.start()
    return done, state


@pytest.mark.parametrize("kind, fragment, position", READ_ERRORS)
def test_load_check_and_show_refuse_what_is_not_a_spec_file(tmp_path, capsys, kind, fragment, position):
    path = _bad_path(tmp_path, kind)
    done, guard = _unblock_after(path, 30)
    tracemalloc.start()
    try:
        with pytest.raises(SpecError) as info:
            flexsn_dsl.load(path, backend="torch")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    exc = info.value
    assert fragment in exc.message and exc.hint, str(exc)
    assert (exc.pos is None if position is None else (exc.file, exc.line, exc.col) == (path, *position)), str(exc)
    assert peak < 20 * 1_000_000, f"reading took {peak} bytes"  # at most the limit (+1 byte) is read
    for command in ("check", "show"):
        capsys.readouterr()
        assert main([command, path]) == 1
        err = capsys.readouterr().err
        assert exc.format() in err, err
    done.set()
    assert not guard["had_to"], "a reader waited on the FIFO"


def test_a_folder_is_not_loaded_but_checked_as_a_folder_of_specs(tmp_path, capsys):
    path = _bad_path(tmp_path, "folder")
    with pytest.raises(SpecError, match="is a folder, not a spec file") as info:
        flexsn_dsl.load(path)
    assert info.value.hint
    assert main(["show", path]) == 1
    assert "is a folder, not a spec file" in capsys.readouterr().err
    assert main(["check", path]) == 0  # check takes folders: the spec inside is checked
    assert "ok  " in capsys.readouterr().out


@pytest.mark.parametrize("path", [P("missing.yaml", id="missing"), P("bad\0name.yaml", id="nul-in-path")])
def test_a_path_that_cannot_be_opened(tmp_path, path):
    with pytest.raises(SpecError, match="cannot read") as info:
        flexsn_dsl.load(f"{tmp_path}/{path}")
    assert info.value.hint == "check the path"


def test_a_spec_of_exactly_the_size_limit_loads(tmp_path):
    path = tmp_path / "padded.yaml"
    path.write_text(GOOD + "#" * (MAX_SPEC_BYTES - len(GOOD) - 1) + "\n")
    assert path.stat().st_size == MAX_SPEC_BYTES
    m = flexsn_dsl.load(path, backend="torch")
    x = torch.tensor([[0.5, 1.5]], dtype=torch.float64)
    assert torch.equal(m.double()(x), (x - 1.0 >= 0).double())
    assert main(["check", str(path)]) == 0


@pytest.mark.parametrize("text, shown", [(None, "NoneType"), (123, "int"), (1.5, "float"), ([GOOD], "list"),
                                         ({"neuron": "n"}, "dict")])
def test_loads_refuses_what_is_not_text(text, shown):
    with pytest.raises(TypeError) as info:
        flexsn_dsl.loads(text, backend="torch")
    assert isinstance(info.value, SpecError)
    assert info.value.message == f"the spec text must be a str (or UTF-8 bytes), not {shown}"
    assert "flexsn_dsl.load(path)" in info.value.hint


def test_loads_refuses_a_path_object_pointing_to_load(tmp_path):
    path = tmp_path / "good.yaml"
    path.write_text(GOOD)
    with pytest.raises(TypeError, match="not PosixPath|not WindowsPath") as info:
        flexsn_dsl.loads(path, backend="torch")
    assert "flexsn_dsl.load(path)" in info.value.hint


@pytest.mark.parametrize("convert", [bytes, bytearray, memoryview])
def test_loads_takes_utf8_bytes_as_the_text(convert):
    """Bytes give the same model as the str; a step that also runs (spike(v + x - 1))."""
    text = GOOD.replace("neuron: n", "neuron: n\ndescription: \u00e9t\u00e9 \u2014 \u03c4")
    m = flexsn_dsl.loads(convert(text.encode("utf-8")), backend="torch")
    assert m.spec.text == text and m.spec.description == "\u00e9t\u00e9 \u2014 \u03c4"
    x = torch.tensor([[0.5, 1.5]], dtype=torch.float64)
    assert torch.equal(m.double()(x), (x - 1.0 >= 0).double())


@pytest.mark.parametrize("data, line, col", [
    (b"neuron: n\nstates: {v: \xff}\n", 2, 13),
    (b"\xfeneuron: n\n", 1, 1),
    ("neuron: n\ndescription: \u00e9\u00e9".encode() + b"\xc3(\n", 2, 16),  # a truncated 2-byte character
])
def test_loads_points_at_the_first_byte_that_is_not_utf8(data, line, col):
    with pytest.raises(SpecError) as info:
        flexsn_dsl.loads(data, backend="torch", filename="bytes.yaml")
    assert not isinstance(info.value, TypeError)
    assert (info.value.file, info.value.line, info.value.col) == ("bytes.yaml", line, col), str(info.value)
    assert info.value.message.startswith("the spec text is not UTF-8 (byte ") and info.value.hint


@pytest.mark.parametrize("path, shown", [(None, "NoneType"), (123, "int"), (b"spec.yaml", "bytes")])
def test_load_refuses_what_is_not_a_path(path, shown):
    with pytest.raises(TypeError) as info:
        flexsn_dsl.load(path, backend="torch")
    assert isinstance(info.value, SpecError)
    assert info.value.message == f"a spec path must be a str or os.PathLike, not {shown}"
    assert "flexsn_dsl.loads(text)" in info.value.hint
