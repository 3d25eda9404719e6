"""Untrusted input, round two (issue 30, classes 3, 4 and 6): values that replace a spec's own
(params=, --param, load_state_dict) pass the spec's checks; the torch backend computes 16-bit inputs
in float32 as the Triton kernels do; T = 0 behaves alike on both backends; bad option values and
outputs that would overwrite an input are one-line errors before any work."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main

ROOT = Path(__file__).resolve().parents[1]
LIF_CT = ROOT / "neurons" / "lif_ct.yaml"
LIF_REF = ROOT / "neurons" / "lif_refractory.yaml"


@pytest.mark.parametrize("spec, params, message", [
    (LIF_CT, {"dt": -1}, "`dt` must be a positive constant, not -1 (dt = -1 as given)"),
    (LIF_CT, {"dt": 0}, "`dt` must be a positive constant, not 0 (dt = 0 as given)"),
    (LIF_CT, {"dt": 1e-320}, "is below the smallest normal float64"),
    (LIF_CT, {"dt": float("inf")}, "params['dt'] = inf is not a finite number"),
    (LIF_REF, {"t_ref": -5}, "the refractory period is -5, not a number >= 0 (t_ref = -5 as given)"),
    (LIF_REF, {"dt": 1e-300}, "more than the 16777216 a step counter holds (dt = 1e-300 as given)"),
])
def test_params_pass_the_specs_checks(spec, params, message, capsys, tmp_path):
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.load(spec, params=params, backend="torch")
    assert message in str(info.value) and info.value.line is not None
    name, value = next(iter(params.items()))
    for command in (["simulate", str(spec), "--steps", "3"], ["build", str(spec), "-o", str(tmp_path / "build")]):
        assert main([*command, "--param", f"{name}={value!r}"]) == 1
        err = capsys.readouterr().err
        assert message in err and "internal error" not in err and "Traceback" not in err
    assert not list((tmp_path / "build").glob("*.py"))  # nothing was generated


def test_spec_values_get_the_same_checks():
    text = LIF_REF.read_text().replace("  dt: 1.0", "  dt: 1.0e-300")
    assert "1.0e-300" in text
    with pytest.raises(flexsn_dsl.SpecError, match="more than the 16777216 a step counter holds"):
        flexsn_dsl.loads(text, backend="torch")


@pytest.mark.parametrize("bad", [0.0, -2.0, 1e-320])
def test_load_state_dict_refuses_a_bad_value_and_changes_nothing(bad):
    m = flexsn_dsl.load(LIF_CT, backend="torch")
    x = torch.rand(6, 2, device="cpu") * 3
    before = m(x.to(torch.get_default_device()))
    m.reset()
    state = m.state_dict()
    state["dt"] = torch.tensor(bad, dtype=torch.float64)
    state["tau"] = torch.tensor(7.0, dtype=torch.float64)  # a good value beside the bad one is not taken either
    with pytest.raises(flexsn_dsl.SpecError, match=r"^.*load_state_dict: `dt`"):
        m.load_state_dict(state)
    assert float(m.dt) == 1.0 and float(m.tau) == 2.0
    assert torch.equal(m(x.to(torch.get_default_device())), before)  # the module works as before
    state["dt"] = torch.tensor(0.5, dtype=torch.float64)
    m.load_state_dict(state)  # a good value is taken
    assert float(m.dt) == 0.5 and m._compiled.values["dt"] == 0.5


def _counting_loop(x: torch.Tensor, n: int) -> torch.Tensor:
    """lif_refractory's spikes for a strong constant drive, in float64: a spike every n steps
    (it fires at once when active, and refractory lasts n steps)."""
    spikes = torch.zeros_like(x, dtype=torch.float64, device="cpu")
    spikes[::n] = 1
    return spikes


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_bf16_refractory_counter_counts_past_256_steps(backend):
    m = flexsn_dsl.load(LIF_REF, backend=backend, params={"t_ref": 300.0})
    x = torch.full((700, 2), 5.0, dtype=torch.bfloat16)  # on the default device (the GPU on a GPU machine)
    s, _ = m(x)
    assert s.dtype == torch.bfloat16 and m.states["refractory"].dtype == torch.bfloat16
    torch.testing.assert_close(s.double().cpu(), _counting_loop(x, 300), rtol=0, atol=0)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_float16_inputs_near_the_top_of_their_range_stay_finite(backend):
    m = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend=backend)
    x = torch.full((5, 2), 6.0e4, dtype=torch.float16)
    s = m(x)
    ref = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="torch")(x.float())
    assert torch.isfinite(m.states["v"]).all() and torch.equal(s.float().cpu(), ref.cpu())
    assert s.sum() > 0


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_zero_steps_alike_on_both_backends(backend):
    m = flexsn_dsl.load(ROOT / "neurons" / "lif_refractory.yaml", backend=backend, store_state_seqs=True)
    x = torch.zeros(0, 3, requires_grad=True)
    s, v = m(x)
    assert s.shape == v.shape == (0, 3) and s.dtype == torch.float32
    assert s.requires_grad and s.grad_fn is not None  # in the graph, as any output
    assert {k: tuple(t.shape) for k, t in m.states.items()} == {"v": (3,), "refractory": (3,)}
    assert all(t.requires_grad for t in m.states.values())
    (g,) = torch.autograd.grad(s.sum() + m.states["v"].sum(), x)
    assert g.shape == (0, 3)
    assert torch.equal(m.states["v"].detach().cpu(), torch.zeros(3, device="cpu"))  # as they were: the initial ones


@pytest.mark.parametrize("argv, message", [
    (["simulate", "neurons/lif.yaml", "--steps", "-5"], "--steps -5: give a whole number of at least 1"),
    (["simulate", "neurons/lif.yaml", "--neurons", "-1"], "--neurons -1: give a whole number of at least 1"),
    (["simulate", "neurons/lif.yaml", "--neurons", "0"], "--neurons 0: give a whole number of at least 1"),
    (["nir", "import", "missing.nir", "--dt", "1", "--steps", "-1"], "--steps -1: give a whole number of at least 0"),
    (["simulate", "neurons/lif.yaml", "--csv", "neurons/lif.yaml"],
     "--csv 'neurons/lif.yaml' is 'neurons/lif.yaml', which this command reads: give another file"),
    (["simulate", "neurons/lif.yaml", "--plot", "./neurons/../neurons/lif.yaml"], "which this command reads"),
    (["nir", "export", "neurons/lif.yaml", "-o", "neurons/lif.yaml", "--shape", "4"],
     "-o/--out 'neurons/lif.yaml' is 'neurons/lif.yaml', which this command reads"),
    (["bench", "neurons/lif.yaml", "--json", "neurons/lif.yaml"], "--json 'neurons/lif.yaml' is"),
    (["bench", "neurons/lif.yaml", "--shape", "0"], "--shape 0: give a whole number of at least 1"),
])
def test_bad_option_values_are_one_line_errors_before_any_work(argv, message, capsys, monkeypatch, tmp_path):
    (tmp_path / "neurons").mkdir()
    spec = tmp_path / "neurons" / "lif.yaml"  # a copy: a command that did overwrite its input harms nothing
    spec.write_bytes((ROOT / "neurons" / "lif.yaml").read_bytes())
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1 and message in err, err
    assert err.startswith(f"flexsn-dsl {argv[0]}: error: ")
    assert spec.read_bytes() == (ROOT / "neurons" / "lif.yaml").read_bytes()


@pytest.mark.parametrize("kwargs", [{"steps": 0}, {"steps": -5}, {"neurons": 0}, {"neurons": -1}, {"steps": 2.5}])
def test_simulate_refuses_counts_below_one(kwargs):
    with pytest.raises(ValueError, match=r"give a whole number of at least 1"):
        flexsn_dsl.simulate(ROOT / "neurons" / "lif.yaml", 1.0, **kwargs)


@pytest.mark.parametrize("value", ["nan", "inf", "-inf"])
def test_a_drive_must_be_finite(value, tmp_path, capsys):
    import numpy as np
    np.save(tmp_path / "drive.npy", np.array([1.0, float(value), 0.5]))
    for drive in (value, f"x={tmp_path / 'drive.npy'}"):
        assert main(["simulate", str(ROOT / "neurons" / "lif.yaml"), f"--input={drive}"]) == 1
        err = capsys.readouterr().err
        assert "holds a value that is not a finite real number" in err and "internal error" not in err


def test_a_learnable_parameter_is_restored_too_when_a_load_is_refused():
    m = flexsn_dsl.load(ROOT / "neurons" / "lif_hetero_ct.yaml", backend="torch", sizes={"N": 3})
    before = {k: v.clone() for k, v in m.state_dict().items()}
    state = m.state_dict()
    state["tau"] = state["tau"] + 7.0
    state["dt"] = torch.tensor(-1.0, dtype=torch.float64)
    with pytest.raises(flexsn_dsl.SpecError, match="load_state_dict: `dt` must be a positive constant"):
        m.load_state_dict(state)
    assert all(torch.equal(m.state_dict()[k], v) for k, v in before.items())


@pytest.mark.parametrize("argv, message", [
    (["simulate", "neurons/lif.yaml", "--fi", "nan:1:3"], "is not LO:HI:K"),
    (["simulate", "neurons/lif.yaml", "--fi", "0:1:1000000000"], "is not LO:HI:K"),
    (["simulate", "neurons/lif_hetero.yaml", "--size", "N=4", "--fi", "0:2:5"],
     "drives 5 neurons but 4 are simulated (neurons=, or the number the spec's shaped parameters fix)"),
])
def test_simulate_sweeps_are_bounded_and_explained(argv, message, capsys, monkeypatch):
    monkeypatch.chdir(ROOT)
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert message in err and "internal error" not in err, err


def test_an_empty_drive_is_refused(tmp_path, capsys):
    import numpy as np
    np.save(tmp_path / "empty.npy", np.zeros((0, 2)))
    assert main(["simulate", str(ROOT / "neurons" / "lif.yaml"), "--input", f"x={tmp_path / 'empty.npy'}"]) == 1
    assert "input 'x' has no steps: give at least one" in capsys.readouterr().err


def test_nir_import_refuses_a_bad_dt_as_an_option(capsys):
    for dt in ("0", "nan", "inf", "1e-320"):
        assert main(["nir", "import", "model.nir", f"--dt={dt}"]) == 2
        err = capsys.readouterr().err
        assert err.startswith("flexsn-dsl nir: error: --dt ") and "give the step length" in err, err

