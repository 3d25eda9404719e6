"""`flexsn_dsl.simulate`, `fi_curve`, the plots and `flexsn-dsl simulate`, against hand-written torch loops."""
from __future__ import annotations

import csv
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main
from flexsn_dsl.errors import MissingDependency
from flexsn_dsl.simulation import fi_curve, parse_sweep, plot_fi, plot_simulation, simulate

ROOT = Path(__file__).resolve().parents[1]
LIF = ROOT / "neurons" / "lif.yaml"
IZH = ROOT / "neurons" / "izhikevich.yaml"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def lif_loop(x: torch.Tensor, tau=2.0, v_th=1.0):
    """SpikingJelly's LIFNode (decay_input, hard reset to 0), written out by hand."""
    v = torch.zeros_like(x[0])
    vs, ss = [], []
    for xt in x:
        h = v + (xt - v) / tau
        s = (h >= v_th).to(x.dtype)
        v = h * (1 - s)
        vs.append(v)
        ss.append(s)
    return torch.stack(vs), torch.stack(ss)


def izhikevich_loop(x: torch.Tensor, a=0.02, b=0.2, c=-0.65, d=0.08, v_th=0.3):
    """Izhikevich (2003), rescaled, forward Euler with dt = 1, as the spec's description states it."""
    v = torch.full_like(x[0], c)
    u = b * v
    vs, us, ss = [], [], []
    for xt in x:
        h = v + 4 * v ** 2 + 5 * v + 1.4 - u + xt
        u = u + a * (b * v - u)
        s = (h >= v_th).to(x.dtype)
        v = torch.where(s > 0, torch.full_like(h, c), h)
        u = u + d * s
        vs.append(v), us.append(u), ss.append(s)
    return torch.stack(vs), torch.stack(us), torch.stack(ss)


def test_simulate_lif_traces_match_a_hand_written_loop():
    # simulate() runs on the CPU: the drive is a CPU tensor (also where the default device is CUDA)
    x = torch.rand(40, 5, generator=torch.Generator().manual_seed(0), dtype=torch.float64, device="cpu") * 2.5
    sim = flexsn_dsl.simulate(LIF, x.numpy(), params={"tau": 3.0})
    v, s = lif_loop(x, tau=3.0)
    assert (sim.steps, sim.neurons, sim.spike_output) == (40, 5, "s")
    torch.testing.assert_close(sim.inputs["x"], x)
    torch.testing.assert_close(sim.states["v"], v, rtol=0, atol=1e-12)
    torch.testing.assert_close(sim.spikes, s)
    assert s.sum() > 0  # the drive makes it fire
    torch.testing.assert_close(sim.spike_count, s.sum(0))
    torch.testing.assert_close(sim.rate, s.sum(0) / 40)


def test_simulate_constant_and_per_step_drives():
    sim = flexsn_dsl.simulate(IZH, 0.1, steps=150, neurons=3)  # a spec file runs on the CPU
    v, u, s = izhikevich_loop(torch.full((150, 3), 0.1, dtype=torch.float64, device="cpu"))
    torch.testing.assert_close(sim.states["v"], v, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sim.states["u"], u, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(sim.spikes, s)
    assert 0 < int(s[:, 0].sum()) < 150
    ramp = np.linspace(0, 0.5, 60)  # [T]: every neuron gets it
    sim = flexsn_dsl.simulate(IZH, ramp, neurons=2)
    v, _, _ = izhikevich_loop(torch.as_tensor(ramp, device="cpu")[:, None].expand(60, 2))
    torch.testing.assert_close(sim.states["v"], v, rtol=1e-12, atol=1e-12)


def test_simulate_several_inputs_by_name_and_a_loaded_module():
    """A loaded module runs where it is (the default device: the GPU on a GPU machine)."""
    m = flexsn_dsl.load(ROOT / "neurons" / "modulated_lif.yaml", backend="torch")
    drive = torch.linspace(0, 2, 30, dtype=torch.float64)
    sim = flexsn_dsl.simulate(m, {"x": drive})
    torch.testing.assert_close(sim.inputs["m"], torch.zeros(30, 1, dtype=torch.float64))  # left out: 0
    ref = flexsn_dsl.load(ROOT / "neurons" / "modulated_lif.yaml", backend="torch", store_state_seqs=True)
    outs = ref(drive[:, None], torch.zeros(30, 1, dtype=torch.float64))
    for name, out in zip(("s1", "s2"), outs):
        torch.testing.assert_close(sim.outputs[name], out)
    torch.testing.assert_close(sim.states["v"], ref.state_seqs["v"])
    assert m.states == {} and m.store_state_seqs is False  # the module is left as it was, reset


@pytest.mark.parametrize("bad, message", [
    ({"y": 1.0}, "has no input 'y'"),
    (np.zeros((3, 2, 2)), "give a number, [T] or [T, N]"),
])
def test_simulate_rejects_bad_drives(bad, message):
    with pytest.raises(ValueError, match=message.replace("[", r"\[").replace("]", r"\]")):
        flexsn_dsl.simulate(LIF, bad)
    with pytest.raises(ValueError, match="has 4 steps but steps=5"):
        flexsn_dsl.simulate(LIF, np.zeros(4), steps=5)


def test_fi_curve_matches_the_rates_of_hand_written_loops():
    currents, rates = fi_curve(IZH, np.linspace(0, 2, 9), steps=100)
    for current, rate in zip(currents.tolist(), rates.tolist()):
        _, _, s = izhikevich_loop(torch.full((100, 1), current, dtype=torch.float64))
        assert rate == pytest.approx(float(s.mean()))
    assert rates[0] == 0 and rates[-1] > rates[4] > 0  # silent at rest; fires faster when driven harder
    with pytest.raises(ValueError, match="not LO:HI:K"):
        parse_sweep("0:2")


def test_plots_are_png_files(tmp_path):
    sim = flexsn_dsl.simulate(IZH, 0.1, steps=50, neurons=12)
    plot_simulation(sim, tmp_path / "traces.png")
    plot_fi("izhikevich", *fi_curve(IZH, [0.0, 1.0], steps=20), tmp_path / "fi.png")
    for name in ("traces.png", "fi.png"):
        data = (tmp_path / name).read_bytes()
        assert data.startswith(PNG_MAGIC) and len(data) > 5000


def test_a_missing_matplotlib_says_how_to_install_it(monkeypatch, tmp_path, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib.figure", None)  # as if not installed
    sim = flexsn_dsl.simulate(LIF, 1.5, steps=5)
    with pytest.raises(MissingDependency, match=r"flexsn-dsl\[plot\]"):
        plot_simulation(sim, tmp_path / "x.png")
    assert main(["simulate", str(LIF), "--plot", str(tmp_path / "x.png")]) == 1
    assert "pip install 'flexsn-dsl[plot]'" in capsys.readouterr().err
    assert not (tmp_path / "x.png").exists()


def test_cli_simulate_fi_curve_writes_the_plot_and_the_rates(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["simulate", str(IZH), "--fi", "0:2:9", "--plot", "fi.png", "--csv", "fi.csv"]) == 0
    stdout = capsys.readouterr().out
    assert (tmp_path / "fi.png").read_bytes().startswith(PNG_MAGIC)
    rows = list(csv.DictReader((tmp_path / "fi.csv").open()))
    _, rates = fi_curve(IZH, np.linspace(0, 2, 9), steps=100)
    assert [float(r["x"]) for r in rows] == pytest.approx(np.linspace(0, 2, 9).tolist())
    assert [float(r["rate"]) for r in rows] == pytest.approx(rates.tolist())
    assert "f-I curve over 100 steps" in stdout


def test_cli_simulate_from_an_array_prints_counts_and_final_states(tmp_path, capsys):
    x = np.random.default_rng(1).uniform(0, 2.5, size=(30, 3))
    np.save(tmp_path / "drive.npy", x)
    code = main(["simulate", str(LIF), "--input", f"x={tmp_path / 'drive.npy'}", "--param", "tau=3",
                 "--csv", str(tmp_path / "t.csv"), "--plot", str(tmp_path / "t.png")])
    out = capsys.readouterr().out
    assert code == 0
    v, s = lif_loop(torch.as_tensor(x), tau=3.0)
    assert f"spikes (s): {int(s.sum())}," in out
    for n in range(3):
        assert f"{n}       {int(s[:, n].sum())}" in out
        assert f"{float(v[-1, n]):.6g}" in out
    rows = list(csv.DictReader((tmp_path / "t.csv").open()))
    assert len(rows) == 30 * 3
    got = np.array([[float(r["v"]) for r in rows if int(r["neuron"]) == n] for n in range(3)]).T
    np.testing.assert_allclose(got, v.cpu().numpy(), rtol=0, atol=1e-12)
    assert (tmp_path / "t.png").read_bytes().startswith(PNG_MAGIC)


@pytest.mark.parametrize("args, message", [
    (["--fi", "0:2"], "not LO:HI:K"),
    (["--input", "nope"], "is not a number or a .npy file"),
    (["--input", "y=1"], "has no input 'y'"),
    (["--input", "missing.npy"], "cannot read missing.npy"),
    (["--fi", "0:1:3", "--input", "1"], "leave out --input"),
])
def test_cli_simulate_errors(args, message, capsys):
    assert main(["simulate", str(LIF), *args]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


ZOO = sorted((ROOT / "neurons").glob("*.yaml"))
SIZES = {"N": 3, "C": 3}  # the sizes zoo specs name in parameter shapes (load() takes more than a spec uses)


@pytest.mark.parametrize("spec", ZOO, ids=lambda p: p.stem)
def test_cli_simulates_every_zoo_spec(spec, capsys):
    """Every zoo spec, `step` or `equations`, shaped or not, simulates from the CLI: the spike count it prints is
    the one the module gives when called directly on the same drive (a step of the shape its parameters fix);
    for a spec that draws random numbers, the one simulate() gives with the same seed."""
    names = flexsn_dsl.load(spec, backend="torch", sizes=SIZES).spec.size_names  # --size: only those it has
    torch.manual_seed(0)  # a recurrent weight starts random: the same draw for the CLI and the module below
    assert main(["simulate", str(spec), "--steps", "40", "--input", "1.5", "--seed", "0",
                 *(f"--size={k}={SIZES[k]}" for k in names)]) == 0
    out = capsys.readouterr().out
    torch.manual_seed(0)  # the module where the CLI's is (the default device), drawing the same weights
    m = flexsn_dsl.load(spec, backend="torch", sizes=SIZES)
    shaped = [tuple(p.shape[-1:]) if n.endswith("_weight") else tuple(p.shape) for n, p in m.named_parameters()
              if p.dim() > 0]
    step = torch.broadcast_shapes(*shaped) if shaped else (1,)
    names = [name for name, _ in m.spec.outputs]
    spike = next((name for name in names if name.startswith("s")), None)  # the zoo names spike outputs s, s1 or spk
    if spike is None:  # a read-out neuron (li): its final states instead
        assert "no spike output" in out, out
        assert all(f"{name} (final)" in out for name in m.spec.states), out
        return
    if m._compiled.model.draws:
        count = int(simulate(spec, 1.5, steps=40, seed=0, sizes=SIZES).outputs[spike].sum())
    else:
        xs = [torch.full((40, *step), 1.5 if i == 0 else 0.0) for i in range(len(m.spec.inputs))]
        outs = m(*xs)
        outs = outs if isinstance(outs, tuple) else (outs,)
        count = int(outs[names.index(spike)].sum())
    assert f"spikes ({spike}): {count}," in out, out
    assert f"40 steps, {int(np.prod(step))} neuron(s)" in out


def test_simulate_a_shaped_spec_one_neuron_per_element():
    """lif_hetero's tau [N] fixes N neurons; each runs with its own tau, as a hand-written loop does."""
    taus = torch.tensor([2.0, 5.0, 20.0], dtype=torch.float64, device="cpu")
    m = flexsn_dsl.load(ROOT / "neurons" / "lif_hetero.yaml", backend="torch", sizes={"N": 3}).to("cpu", torch.float64)
    with torch.no_grad():
        m.tau.copy_(taus)
    x = torch.full((60, 3), 1.3, dtype=torch.float64, device="cpu")
    sim = flexsn_dsl.simulate(m, x)
    dt = float(m.dt)
    v, vs = torch.zeros(3, dtype=torch.float64, device="cpu"), []
    for xt in x:  # tau dv/dt = -v + x, integrated exactly over dt; threshold 1, reset to 0
        v = xt + (v - xt) * torch.exp(-dt / taus)
        v = torch.where(v >= float(m.v_th), torch.zeros_like(v), v)
        vs.append(v)
    torch.testing.assert_close(sim.states["v"], torch.stack(vs), rtol=1e-12, atol=1e-12)
    assert sim.spike_count[0] > sim.spike_count[2]  # the fastest neuron fires most
    with pytest.raises(ValueError, match=r"lif_hetero's parameters fix 3 neurons .* but neurons=5 was asked for"):
        flexsn_dsl.simulate(m, 1.0, neurons=5)
