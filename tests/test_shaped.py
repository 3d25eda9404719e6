"""Parameters with a shape (language v2, section 2): per-channel and per-neuron values,
learnable or fixed, on both backends against a hand-written torch loop in float64;
sizes, params= tensors, broadcast errors, checkpoints, determinism, torch.compile."""
from __future__ import annotations

import io
import math
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl import ShapeError, SpecError  # noqa: E402
from flexsn_dsl.cli import main as cli_main  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["torch", "triton"]
F64 = torch.float64
TIGHT = dict(rtol=1e-10, atol=1e-12)

# tau: learnable, shaped; v_th: fixed, shaped, an expression of the scalar `base`; k: a learnable scalar
SPEC = """
neuron: shaped_lif
parameters:
  tau: {{value: 2.0, learnable: true, shape: {shape}}}
  v_th: {{value: 0.5 + base, shape: {shape}}}
  base: 0.4
  k: {{value: 1.0, learnable: true}}
states: {{v: 0.0}}
step:
  h: v + (k * x - v) / tau
  s: spike(h - v_th)
  v: h * (1 - s)
"""

# (spec shape, sizes, input shape [T, ...], parameter shape): per channel, per neuron, and a parameter
# that varies over two dimensions with one it broadcasts over between them. Each input has more
# neurons per step than one interpreter block (1024) and is not a multiple of it.
CASES = {
    "channel": ("[C, 1, 1]", {"C": 5}, (3, 3, 5, 9, 11), (5, 1, 1)),
    "neuron": ("[N]", {"N": 517}, (4, 3, 517), (517,)),
    "channel_width": ("[C, 1, W]", {"C": 3, "W": 7}, (3, 7, 3, 11, 7), (3, 1, 7)),
    # the tiled backward's general cases: channels of 77 neurons across tiles 64 columns wide;
    # 40 rows in three row tiles of 16, whose partial sums the runtime adds
    "channel_unaligned": ("[C, 1, 1]", {"C": 3}, (2, 16, 3, 7, 11), (3, 1, 1)),
    "neuron_rows": ("[N]", {"N": 7}, (3, 40, 7), (7,)),
}


def reference(x, tau, v_th, k):
    """The spec's step, by hand: torch broadcasting of the parameters against each step."""
    v = torch.zeros_like(x[0])
    out = []
    for t in range(x.shape[0]):
        h = v + (k * x[t] - v) / tau
        s = zr.spike(h - v_th, "sigmoid", alpha=4.0)
        v = h * (1 - s)
        out.append(s)
    return torch.stack(out), v


def _values(shape, seed):
    gen = torch.Generator().manual_seed(seed)  # CPU draws, moved: the same values on a GPU machine
    here = torch.get_default_device()
    tau = (1.5 + 2.5 * torch.rand(shape, generator=gen, dtype=F64, device="cpu")).to(here)
    v_th = (0.6 + 0.6 * torch.rand(shape, generator=gen, dtype=F64, device="cpu")).to(here)
    x = (2.0 * torch.rand(CASE_INPUT[shape], generator=gen, dtype=F64, device="cpu")).to(here) \
        if shape in CASE_INPUT else None
    return tau, v_th, x


CASE_INPUT = {param: inp for _, _, inp, param in CASES.values()}


def _build(case, backend, **kwargs):
    shape, sizes, _, _ = CASES[case]
    return flexsn_dsl.loads(SPEC.format(shape=shape), sizes=sizes, backend=backend, **kwargs)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("case", CASES)
def test_values_and_gradients_match_a_torch_loop(case, backend):
    _, _, inp, pshape = CASES[case]
    tau, v_th, x = _values(pshape, seed=1)
    m = _build(case, backend, params={"tau": tau, "v_th": v_th, "k": 1.3}).double()
    assert m.tau.shape == pshape and isinstance(m.tau, torch.nn.Parameter)
    assert m.v_th.shape == pshape and not m.v_th.requires_grad and "v_th" in dict(m.named_buffers())
    xm, xr = x.clone().requires_grad_(), x.clone().requires_grad_()
    tau_r, k_r = tau.clone().requires_grad_(), m.k.detach().clone().requires_grad_()  # k: rounded to float32
    s_m = m(xm)
    s_r, v_r = reference(xr, tau_r, v_th, k_r)
    torch.testing.assert_close(s_m, s_r, rtol=0, atol=0)
    assert 0 < int(s_m.sum()) < s_m.numel()
    torch.testing.assert_close(m.states["v"], v_r, **TIGHT)
    gen = torch.Generator().manual_seed(2)
    w_s, w_v = (torch.randn(t.shape, generator=gen, dtype=F64, device="cpu").to(t.device) for t in (s_r, v_r))
    ((w_s * s_m).sum() + (w_v * m.states["v"]).sum()).backward()
    g_x, g_tau, g_k = torch.autograd.grad((w_s * s_r).sum() + (w_v * v_r).sum(), [xr, tau_r, k_r])
    torch.testing.assert_close(xm.grad, g_x, **TIGHT)
    assert m.tau.grad.shape == pshape and bool((g_tau != 0).all())
    torch.testing.assert_close(m.tau.grad, g_tau, rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(m.k.grad, g_k, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_step_mode_and_states_from_a_shaped_parameter(backend):
    """step_mode='s' broadcasts against the step itself; a state may start from a shaped parameter."""
    text = SPEC.format(shape="[N]").replace("states: {v: 0.0}", "states: {v: v_th - 1}")
    tau, v_th, x = _values((517,), seed=3)
    x = x[:, :2]
    m = flexsn_dsl.loads(text, params={"tau": tau, "v_th": v_th}, step_mode="s", backend=backend).double()
    got = torch.stack([m(x[t]) for t in range(x.shape[0])])
    v = (v_th - 1).expand(x.shape[1:])
    expected = []
    for t in range(x.shape[0]):
        h = v + (x[t] - v) / tau
        s = (h >= v_th).to(F64)
        v = h * (1 - s)
        expected.append(s)
    torch.testing.assert_close(got, torch.stack(expected), rtol=0, atol=0)
    torch.testing.assert_close(m.states["v"], v, **TIGHT)


EXACT = """
neuron: exact_values
parameters:
  k: {value: 0.1, shape: [N]}
  a: {value: 0.4, learnable: true}
  g: {value: 0.7, learnable: true, shape: [N]}
states: {v: 0.0, z: a}
step:
  v: 0.9 * v + k * x + a + g * z
outputs: [v]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_float64_module_holds_its_specs_values_exactly(backend):
    """Learnable and shaped parameters are made in the default dtype (float32), as nn.Linear's weights; made
    float64 (.double()), those still at their spec's values take them exactly (0.1, not 0.10000000149011612),
    and so does a state that starts from one: the step in float64 equals Python's arithmetic to 1e-15."""
    m = flexsn_dsl.loads(EXACT, sizes={"N": 3}, backend=backend)
    assert m.k.dtype == m.a.dtype == torch.float32
    m.double()
    assert m.k.tolist() == [0.1] * 3 and m.a.item() == 0.4 and m.g.tolist() == [0.7] * 3
    x = [[0.5, -1.25, 2.0], [0.3, 0.0, -0.7]]
    got = m(torch.tensor(x, dtype=F64)[:, None])[:, 0]
    v, expected = [0.0] * 3, []
    for xt in x:
        v = [0.9 * v[i] + 0.1 * xt[i] + 0.4 + 0.7 * 0.4 for i in range(3)]
        expected.append(v)
    torch.testing.assert_close(got, torch.tensor(expected, dtype=F64), rtol=1e-15, atol=0)
    with torch.no_grad():  # a value trained away from the spec's keeps its own
        m.a.add_(2 ** -10)
    assert m.float().double().a.item() == torch.tensor(0.4 + 2 ** -10, dtype=torch.float32).item()


def test_triton_gradients_are_deterministic():
    _, _, inp, pshape = CASES["channel"]
    tau, v_th, x = _values(pshape, seed=4)
    grads = []
    for _ in range(2):
        m = _build("channel", "triton", params={"tau": tau, "v_th": v_th}).double()
        m(x).sum().backward()
        grads.append(m.tau.grad)
    assert torch.equal(grads[0], grads[1])


@pytest.mark.parametrize("backend", BACKENDS)
def test_an_input_that_cannot_broadcast_names_the_parameter(backend):
    m = _build("channel", backend)
    with pytest.raises(ShapeError, match=r"'tau' has shape \[5, 1, 1\].*\[2, 4, 3, 3\]"):
        m(torch.rand(2, 2, 4, 3, 3))
    with pytest.raises(ShapeError, match="'tau'"):
        m(torch.rand(2, 5))  # fewer dimensions than the parameter
    assert m.states == {}  # nothing ran
    assert isinstance(ShapeError("x"), ValueError)


def test_sizes_and_params_tensors():
    text = SPEC.format(shape="[C, 1, 1]")
    with pytest.raises(SpecError, match="size 'C' of parameter 'tau'") as exc:
        flexsn_dsl.loads(text)
    assert exc.value.line == 4 and "sizes=" in exc.value.hint
    with pytest.raises(SpecError, match="size 'C' of parameter 'tau'") as exc:
        flexsn_dsl.loads(text, sizes={"c": 2})
    assert "'c'" in exc.value.hint  # the near miss
    assert flexsn_dsl.loads(text, sizes={"C": 2, "D": 3}).tau.shape == (2, 1, 1)  # one sizes= for a whole network
    with pytest.raises(SpecError, match="positive whole number"):
        flexsn_dsl.loads(text, sizes={"C": 0})
    # a tensor fixes the size; both shaped parameters then have it
    m = flexsn_dsl.loads(text, params={"tau": torch.full((6, 1, 1), 3.0)})
    assert m.tau.shape == m.v_th.shape == (6, 1, 1)
    with pytest.raises(ShapeError, match=r"params\['tau'\] has shape \[6, 1, 1\].*C = 4 \(from sizes=\)"):
        flexsn_dsl.loads(text, sizes={"C": 4}, params={"tau": torch.ones(6, 1, 1)})
    with pytest.raises(ShapeError, match=r"params\['tau'\] has shape \[6\]"):
        flexsn_dsl.loads(text, params={"tau": torch.ones(6)})
    with pytest.raises(ShapeError, match=r"params\['v_th'\].*C = 6 \(from params\['tau'\]\)"):
        flexsn_dsl.loads(text, params={"tau": torch.ones(6, 1, 1), "v_th": torch.ones(5, 1, 1)})
    with pytest.raises(TypeError, match=r"params\['k'\] must be a number, not Tensor"):
        flexsn_dsl.loads(text, sizes={"C": 2}, params={"tau": torch.ones(2, 1, 1), "k": torch.ones(2)})
    with pytest.raises(SpecError, match="'tua'.*not a parameter"):
        flexsn_dsl.loads(text, sizes={"C": 2}, params={"tua": torch.ones(2, 1, 1)})
    # numbers: a shaped value everywhere; a scalar's 0-dim tensor is its value
    m = flexsn_dsl.loads(text, sizes={"C": 2}, params={"tau": 4.0, "k": torch.tensor(0.5), "base": 0.1})
    assert torch.equal(m.tau.detach(), torch.full((2, 1, 1), 4.0)) and float(m.k.detach()) == 0.5
    assert torch.allclose(m.v_th, torch.full((2, 1, 1), 0.6, dtype=m.v_th.dtype))  # 0.5 + base, base overridden


def test_shaped_values_are_numbers_or_expressions_of_scalars():
    text = SPEC.format(shape="[N]")
    m = flexsn_dsl.loads(text, sizes={"N": 3})
    assert torch.allclose(m.v_th, torch.full((3,), 0.9, dtype=m.v_th.dtype))
    with pytest.raises(SpecError, match="shaped parameter 'tau'") as exc:
        flexsn_dsl.loads(text.replace("0.5 + base", "tau + base"), sizes={"N": 3})
    assert exc.value.line == 5
    with pytest.raises(SpecError, match="not a finite real number") as exc:
        flexsn_dsl.loads(text.replace("0.5 + base", "1 / (base - 0.4)"), sizes={"N": 3})
    with pytest.raises(SpecError, match="size"):
        flexsn_dsl.loads(text.replace("[N]", "[0]"))
    with pytest.raises(SpecError, match="size"):
        flexsn_dsl.loads(text.replace("[N]", "[n]"), sizes={"N": 3})
    with pytest.raises(SpecError, match="unknown key 'shap'"):
        flexsn_dsl.loads(text.replace("shape: [N]}", "shap: [N]}", 1), sizes={"N": 3})


@pytest.mark.parametrize("backend", BACKENDS)
def test_checkpoints_round_trip_and_respecialise_constants(backend):
    _, _, inp, pshape = CASES["channel"]
    tau, v_th, x = _values(pshape, seed=5)
    x = x[:, :1]
    m1 = _build("channel", backend, params={"tau": tau, "v_th": v_th, "base": 0.7}).double()
    sd = m1.state_dict()
    assert set(sd) == {"tau", "v_th", "base", "k"}
    assert sd["base"].dtype == F64 and sd["base"].shape == () and float(sd["base"]) == 0.7
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    m2 = _build("channel", backend).double()  # other tau, v_th and base
    m2.load_state_dict(torch.load(buf))
    assert m2._compiled.values["base"] == 0.7  # the baked constant was re-specialised
    with torch.no_grad():
        y1, y2 = m1(x), m2(x)
    assert torch.equal(y1, y2)
    # a constant that reaches the code: changing it by a state dict equals building with it
    text = SPEC.format(shape="[C, 1, 1]").replace("h: v + (k * x - v) / tau", "h: v + (k * x - v) / tau + base")
    built = flexsn_dsl.loads(text, sizes={"C": 5}, backend=backend, params={"base": -0.3}).double()
    loaded = flexsn_dsl.loads(text, sizes={"C": 5}, backend=backend).double()
    loaded.load_state_dict(built.state_dict())
    assert float(loaded.base) == -0.3 and torch.equal(loaded.v_th, built.v_th)  # v_th = 0.5 + base was built
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), built(x), rtol=0, atol=0)
        torch.testing.assert_close(loaded.states["v"], built.states["v"], rtol=0, atol=0)
    # converting the module keeps the constants exact and float64
    assert loaded.half().base.dtype == F64 and float(loaded.base) == -0.3
    with pytest.raises(RuntimeError, match="size mismatch"):
        flexsn_dsl.loads(text, sizes={"C": 4}).load_state_dict(sd)


def test_torch_compile_fullgraph_on_both_backends(fresh_dynamo):
    _, _, inp, pshape = CASES["neuron"]
    tau, v_th, x = _values(pshape, seed=6)
    x = x[:2, :2]
    results = []
    for backend in BACKENDS:
        m = _build("neuron", backend, params={"tau": tau, "v_th": v_th}).double()
        for module in (m, torch.compile(m, fullgraph=True)):
            m.reset()
            m.tau.grad = None
            xi = x.clone().requires_grad_()
            y = module(xi)
            (y * torch.arange(y.numel(), dtype=F64).reshape(y.shape)).sum().backward()
            results.append((y.detach(), xi.grad, m.tau.grad.clone()))
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_partial_gradients_of_the_benchmark_shapes_are_no_larger_than_needed(monkeypatch):
    """On an H200 (132 SMs): a per-neuron tau's partial sums are its gradient (every row in one tile),
    and a per-channel parameter has one partial sum per program (as a scalar one has)."""
    from flexsn_dsl import triton_plan
    from flexsn_dsl.triton_autograd import _shaped_gradient, shaped_period, shaped_view
    monkeypatch.setattr(triton_plan, "_sm_count", lambda: 132)
    kernels = object.__new__(triton_plan.Kernels)
    kernels.interpret = False
    tau, inner, size = shaped_view(torch.ones(65536), (16, 65536))
    tiling = kernels.tiling(16 * 65536, shaped_period([inner, size]))
    assert (tiling.tile_rows, tiling.tile_cols) == (16, 64) and tiling.partial_shape(inner) == (1, 65536, 1)
    partial = torch.arange(65536.0).reshape(tiling.partial_shape(inner))
    assert _shaped_gradient(partial, size).data_ptr() == partial.data_ptr()  # no reduction, no copy
    w, inner, size = shaped_view(torch.ones(128, 1, 1), (32, 128, 32, 32))
    n = 32 * 128 * 32 * 32
    tiling = kernels.tiling(n, shaped_period([inner, size]))
    assert tiling.partial_shape(inner) == (1, 128, 32) and tiling.programs == 128 * 32 == kernels.blocks(n)


def test_generated_kernels_read_shaped_parameters_by_index():
    from flexsn_dsl.compiler import compile_spec
    compiled = compile_spec(text=SPEC.format(shape="[C, 1, 1]"))
    info = compiled.info
    assert info.param_names == ("tau", "k") and info.fixed_names == ("v_th",)
    assert info.shaped_names == ("tau", "v_th") and info.scalar_params == ("k",)
    assert info.constants == {"base": 0.4}
    source = compiled.triton_source
    assert "tau = tl.load(tau__param + (_offs // tau__inner) % tau__size)" in source
    assert "tl.atomic" not in source and "tau__grad" in source and "v_th__grad" not in source


def test_cli_sizes(capsys, tmp_path):
    spec = tmp_path / "s.yaml"
    spec.write_text(SPEC.format(shape="[C, 1, 1]"))
    assert cli_main(["show", str(spec), "--size", "C=64"]) == 0
    assert "parameter tau = 2.0, shape [64, 1, 1] (learnable)" in capsys.readouterr().out
    assert cli_main(["check", str(spec), "--size", "C=64"]) == 0
    assert cli_main(["check", str(spec), "--size", "C=0"]) == 1
    assert "positive whole number" in capsys.readouterr().err
    assert cli_main(["check", str(spec), "--size", "C=x"]) == 1
    assert "NAME=WHOLE_NUMBER" in capsys.readouterr().err
    assert cli_main(["build", str(spec), "--size", "C=3", "-o", str(tmp_path / "out")]) == 0
    assert (tmp_path / "out" / "shaped_lif.py").exists()
    out = tmp_path / "bench.json"
    assert cli_main(["bench", str(spec), "--size", "C=3", "--shape", "2", "3", "4", "5", "-T", "2",
                     "--peers", "torch", "--mode", "training", "--json", str(out)]) == 0
    assert math.prod((2, 3, 4, 5)) == __import__("json").loads(out.read_text())[-1]["results"][0]["neurons"]


@pytest.mark.parametrize("command", [["check"], ["build", "-o", "OUT"], ["show"], ["simulate", "--steps", "2"],
                                     ["nir", "export", "--shape", "3", "-o", "OUT/x.nir"],
                                     ["bench", "-T", "2", "-n", "4", "--peers", "torch"]])
def test_cli_refuses_a_size_the_spec_does_not_have(command, capsys, tmp_path):
    """`--size M=3` for a spec with only N is one line naming the known sizes, in every verb that takes --size;
    a size that only some of several specs have is fine."""
    argv = [a.replace("OUT", str(tmp_path)) for a in command]
    where = 2 if command[0] == "nir" else 1
    hetero = str(ROOT / "neurons" / "lif_hetero.yaml")
    assert cli_main([*argv[:where], hetero, *argv[where:], "--size", "N=3", "--size", "M=3"]) == 1
    err = capsys.readouterr().err
    assert err.splitlines()[-1] == "error: --size M=3: lif_hetero has no size 'M' (its sizes: N)", err
    assert "Traceback" not in err and "internal error" not in err
    if command[0] in ("check", "build"):
        assert cli_main([*argv[:1], hetero, str(ROOT / "neurons" / "lif.yaml"), *argv[1:], "--size", "N=3"]) == 0
