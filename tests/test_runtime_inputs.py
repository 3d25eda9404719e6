"""What the runtime does with inputs a careless user gives it, on both backends: a bad launch
setting in the environment, integer and bool inputs, a new input shape while states are
carried, and inputs or parameters the step does not use."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flexsn_dsl

ROOT = Path(__file__).resolve().parents[1]
LIF = ROOT / "neurons" / "lif.yaml"


# --------------------------------------------------------------------------
# launch settings from the environment
# --------------------------------------------------------------------------
BAD_SETTINGS = [("FLEXSN_DSL_STAGES", "abc"), ("FLEXSN_DSL_STAGES", "-1"), ("FLEXSN_DSL_STAGES", "1.5"),
                ("FLEXSN_DSL_STAGES", "99"), ("FLEXSN_DSL_STAGES", "٣"), ("FLEXSN_DSL_AUTOTUNE", "yes"),
                ("FLEXSN_DSL_AUTOTUNE", "2"), ("FLEXSN_DSL_RECURRENT_PRECISION", "fp32"),
                ("FLEXSN_DSL_RECURRENT_PRECISION", "IEEE"), ("FLEXSN_DSL_BLOCK", "100"), ("FLEXSN_DSL_WARPS", "32"),
                ("FLEXSN_DSL_TIME_TILE", "1000"), ("FLEXSN_DSL_TIME_PARALLEL", "yes"), ("FLEXSN_DSL_TIME_PARALLEL", "2"),
                ("FLEXSN_DSL_SCAN_CHUNK", "-4"), ("FLEXSN_DSL_SCAN_CHUNK", "8.5")]


@pytest.mark.parametrize("name,value", BAD_SETTINGS)
def test_a_bad_launch_setting_fails_the_triton_backend_only(name, value, monkeypatch):
    from flexsn_dsl.triton_settings import launch_settings
    x = torch.rand(3, 5)
    expected = flexsn_dsl.load(LIF, backend="torch")(x)
    monkeypatch.setenv(name, value)
    for backend in ("torch", "auto") if not x.is_cuda else ("torch",):
        torch.testing.assert_close(flexsn_dsl.load(LIF, backend=backend)(x), expected)
    m = flexsn_dsl.load(LIF, backend="triton")
    for T in (3, 0):  # also when no kernel runs
        m.reset()
        with pytest.raises(ValueError, match=f"^{name}={value!r} is not .*: set it to"):
            m(torch.rand(T, 5))
    with pytest.raises(ValueError, match=name):
        launch_settings()
    monkeypatch.delenv(name)
    torch.testing.assert_close(m(x), expected)


@pytest.mark.parametrize("stages,autotune,precision,parallel,expected", [
    ("", "", "", "", (False, 0, "tf32x3", 0, 0, 0, True, 0)), ("0", "0", "ieee", "0", (False, 0, "ieee", 0, 0, 0, False, 0)),
    (" 3 ", "1", " tf32 ", " 1 ", (True, 3, "tf32", 0, 0, 0, True, 0)),
    ("16", "", "tf32x3", "", (False, 16, "tf32x3", 0, 0, 0, True, 0))])
def test_good_launch_settings_are_read_at_launch(stages, autotune, precision, parallel, expected, monkeypatch):
    from flexsn_dsl.triton_settings import launch_settings
    monkeypatch.setenv("FLEXSN_DSL_STAGES", stages)
    monkeypatch.setenv("FLEXSN_DSL_AUTOTUNE", autotune)
    monkeypatch.setenv("FLEXSN_DSL_RECURRENT_PRECISION", precision)
    monkeypatch.setenv("FLEXSN_DSL_TIME_PARALLEL", parallel)
    assert tuple(launch_settings()) == expected
    x = torch.rand(4, 6)
    torch.testing.assert_close(flexsn_dsl.load(LIF, backend="triton")(x), flexsn_dsl.load(LIF, backend="torch")(x))


def test_launch_settings_follow_os_environ_even_when_it_is_replaced(monkeypatch):
    """The settings are read from os.environ at each call: set, changed and deleted through it, and from a
    plain mapping put in its place."""
    from flexsn_dsl.triton_settings import launch_settings
    for name in ("FLEXSN_DSL_STAGES", "FLEXSN_DSL_AUTOTUNE", "FLEXSN_DSL_RECURRENT_PRECISION", "FLEXSN_DSL_BLOCK",
                 "FLEXSN_DSL_WARPS", "FLEXSN_DSL_TIME_TILE", "FLEXSN_DSL_TIME_PARALLEL", "FLEXSN_DSL_SCAN_CHUNK"):
        monkeypatch.delenv(name, raising=False)
    assert tuple(launch_settings()) == (False, 0, "tf32x3", 0, 0, 0, True, 0)
    os.environ["FLEXSN_DSL_STAGES"] = "5"
    try:
        assert tuple(launch_settings()) == (False, 5, "tf32x3", 0, 0, 0, True, 0)
        os.environ["FLEXSN_DSL_STAGES"] = "x5"
        with pytest.raises(ValueError, match="^FLEXSN_DSL_STAGES='x5' is not"):
            launch_settings()
    finally:
        del os.environ["FLEXSN_DSL_STAGES"]
    assert tuple(launch_settings()) == (False, 0, "tf32x3", 0, 0, 0, True, 0)
    monkeypatch.setattr(os, "environ", {"FLEXSN_DSL_AUTOTUNE": "1", "FLEXSN_DSL_STAGES": "7",
                                        "FLEXSN_DSL_RECURRENT_PRECISION": "ieee", "FLEXSN_DSL_BLOCK": "64",
                                        "FLEXSN_DSL_WARPS": "2", "FLEXSN_DSL_TIME_TILE": "8",
                                        "FLEXSN_DSL_TIME_PARALLEL": "0", "FLEXSN_DSL_SCAN_CHUNK": "96"})
    assert tuple(launch_settings()) == (True, 7, "ieee", 64, 2, 8, False, 96)


def test_a_bad_launch_setting_does_not_break_importing_or_the_torch_backend(tmp_path):
    """In a fresh process: importing every module, and the torch backend, ignore the settings."""
    code = ("import torch, flexsn_dsl, flexsn_dsl.triton_runtime, flexsn_dsl.cli\n"
            f"m = flexsn_dsl.load({str(LIF)!r}, backend='torch')\n"
            "print(m(torch.full((2, 3), 1.5)).tolist())\n")
    env = dict(os.environ, FLEXSN_DSL_STAGES="abc", FLEXSN_DSL_AUTOTUNE="on", FLEXSN_DSL_RECURRENT_PRECISION="fp64",
               FLEXSN_DSL_TIME_PARALLEL="no", FLEXSN_DSL_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([[0.0] * 3, [1.0] * 3])  # h: 0.75, then 1.125 >= v_th


# --------------------------------------------------------------------------
# integer and bool inputs
# --------------------------------------------------------------------------
ACCUMULATOR = """
neuron: acc
inputs: [x]
states: {v: 0}
step:
  h: v + 0.3 * x
  s: spike(h - 1)
  v: h - s
outputs: [s, h]
"""


def reference_accumulator(x: torch.Tensor, dtype: torch.dtype):
    """The spec above as a hand-written torch loop over x: [T, ...]."""
    v = torch.zeros(x.shape[1:], dtype=dtype)
    ss, hs = [], []
    for t in range(x.shape[0]):
        h = v + 0.3 * x[t].to(dtype)
        s = (h - 1 >= 0).to(dtype)
        v = h - s
        ss.append(s)
        hs.append(h)
    return torch.stack(ss), torch.stack(hs), v


INT_DTYPES = [torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64]


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_and_bool_inputs_compute_in_the_default_float_dtype(backend, dtype):
    x = torch.ones(5, 2, 3, dtype=dtype)
    x[:, 1] = 0  # half the neurons get no input
    if dtype != torch.bool:
        x[:, 0, 2] = 2
    want_s, want_h, want_v = reference_accumulator(x, torch.float32)
    assert want_s[:, 0].any() and not want_s[:, 1].any()  # a fraction must be carried to spike at all

    whole = flexsn_dsl.loads(ACCUMULATOR, backend=backend)
    s, h = whole(x)
    assert s.dtype == h.dtype == whole.states["v"].dtype == torch.float32
    for got, want in ((s, want_s), (h, want_h), (whole.states["v"], want_v)):
        torch.testing.assert_close(got, want)

    for mode, chunks in (("m", [x[t:t + 1] for t in range(5)]), ("s", list(x))):
        steps = flexsn_dsl.loads(ACCUMULATOR, backend=backend, step_mode=mode)
        outs = [steps(chunk) for chunk in chunks]
        got_s = torch.cat([o[0].reshape(1, 2, 3) for o in outs])
        got_h = torch.cat([o[1].reshape(1, 2, 3) for o in outs])
        assert steps.states["v"].dtype == torch.float32
        torch.testing.assert_close(got_s, want_s)  # five calls of one step = one call of five
        torch.testing.assert_close(got_h, want_h)
        torch.testing.assert_close(steps.states["v"], want_v)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_integer_inputs_follow_the_default_dtype_and_promote_with_float_inputs(backend):
    spec = ACCUMULATOR.replace("[x]", "[x, y]").replace("0.3 * x", "0.3 * x + y")
    x = torch.tensor([[1, 3], [2, 0], [1, 1]], dtype=torch.int32)
    y = torch.tensor([[0.25, 0.0], [0.0, 0.125], [0.5, 0.0]], dtype=torch.float64)
    want_s, want_h, _ = reference_accumulator(x.double() + y / 0.3, torch.float64)
    s, h = flexsn_dsl.loads(spec, backend=backend)(x, y)  # as torch: int32 with float64 is float64
    assert s.dtype == h.dtype == torch.float64
    torch.testing.assert_close(h, want_h)
    torch.testing.assert_close(s, want_s)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.float64)
    try:
        m = flexsn_dsl.loads(ACCUMULATOR, backend=backend)
        s, h = m(x)
    finally:
        torch.set_default_dtype(default)
    assert s.dtype == h.dtype == m.states["v"].dtype == torch.float64
    torch.testing.assert_close(h, reference_accumulator(x, torch.float64)[1])
    with pytest.raises(TypeError, match="real numbers"):
        flexsn_dsl.loads(ACCUMULATOR, backend=backend)(torch.ones(2, 2, dtype=torch.complex64))


# --------------------------------------------------------------------------
# a new input shape while states are carried
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("mode", ["m", "s"])
def test_a_new_input_shape_with_carried_states_asks_for_reset(backend, mode):
    lead = (3,) if mode == "m" else ()
    m = flexsn_dsl.load(LIF, backend=backend, step_mode=mode)
    x = torch.rand(*lead, 4, 5) * 2
    m(x)
    carried = m.states["v"].clone()
    for shape in ((2, 5), (4, 6), (20,), (4, 5, 1), (2, 2, 5)):  # batch, features, rank
        with pytest.raises(ValueError, match=r"call reset\(\) before a new batch or input shape") as info:
            m(torch.rand(*lead, *shape))
        assert f"{shape}" in str(info.value) and "(4, 5)" in str(info.value)
        torch.testing.assert_close(m.states["v"], carried)  # the failed call changed nothing
    if mode == "m":
        m(torch.rand(7, 4, 5))  # another sequence length is the same neurons, carried on
    m.reset()
    y = torch.rand(*lead, 2, 5) * 2
    torch.testing.assert_close(m(y), flexsn_dsl.load(LIF, backend=backend, step_mode=mode)(y))


# --------------------------------------------------------------------------
# inputs and parameters the step does not use
# --------------------------------------------------------------------------
UNUSED = """
neuron: unused
inputs: [x, y, z, c]
parameters:
  k: {value: 0.5, learnable: true}
  d: {value: 0.25, learnable: true}
  w: {value: 0.7, learnable: true}
  i0: {value: 0.1, learnable: true}
states:
  v: i0
step:
  h: v * w + x + detach(z * d) + where(c > 0, 0.1, 0)
  s: spike(h - 1)
  v: h - s
outputs: [s, h]
"""


@pytest.mark.parametrize("T,compiled", [(1, False), (4, False), (4, True)])
def test_unused_inputs_and_parameters_get_no_gradient_on_either_backend(T, compiled, fresh_dynamo):
    """y and k are unused, z and d used only under detach, c only in a condition: None gradients;
    x, w and the parameter of the initial state i0: real gradients, equal on both backends
    (eager, and the Triton backend under torch.compile)."""
    xs = [torch.rand(T, 6, requires_grad=True) for _ in range(4)]
    grads = {}
    for backend in ("torch", "triton"):
        m = flexsn_dsl.loads(UNUSED, backend=backend)
        run = torch.compile(m, fullgraph=True) if compiled and backend == "triton" else m
        for x in xs:
            x.grad = None
        s, h = run(*xs)
        (h * torch.linspace(-1, 1, h.numel()).reshape(h.shape)).sum().backward()
        grads[backend] = [x.grad for x in xs] + [getattr(m, p).grad for p in ("k", "d", "w", "i0")]
    names = ["x", "y", "z", "c", "k", "d", "w", "i0"]
    for name, a, b in zip(names, grads["torch"], grads["triton"]):
        if name in ("y", "z", "c", "k", "d"):
            assert a is None and b is None, name
        else:
            assert a is not None and b is not None, name
            torch.testing.assert_close(b, a, msg=name)
    info = flexsn_dsl.loads(UNUSED, backend="triton").info
    assert sorted(info.zero_grads) == ["c", "d", "i0", "k", "y", "z"]  # i0: through the initial state only


def test_unused_inputs_get_no_gradient_under_torch_autograd_grad():
    """autograd.grad with allow_unused=True: None on both backends; without it, both refuse."""
    x, y = torch.rand(3, 4, requires_grad=True), torch.rand(3, 4, requires_grad=True)
    spec = "neuron: n\ninputs: [x, y]\nstates: {v: 0}\nstep:\n  h: v + x\n  s: spike(h - 1)\n  v: h - detach(s)\n" \
           "outputs: [h]\n"
    for backend in ("torch", "triton"):
        h = flexsn_dsl.loads(spec, backend=backend)(x, y)
        gx, gy = torch.autograd.grad(h.sum(), [x, y], allow_unused=True)
        assert gy is None and torch.equal(gx, torch.ones_like(x) * torch.arange(3, 0, -1.0)[:, None]), backend
        h = flexsn_dsl.loads(spec, backend=backend)(x, y)
        with pytest.raises(RuntimeError, match="not have been used in the graph"):
            torch.autograd.grad(h.sum(), [x, y])
