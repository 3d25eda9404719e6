"""What the package's objects print: Monitor, Simulation and every module it returns say what they hold."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import Monitor, PerStep

ROOT = Path(__file__).resolve().parents[1]
LIF = ROOT / "neurons" / "lif.yaml"


def test_monitor_and_modules():
    net = torch.nn.Sequential(PerStep(torch.nn.Linear(3, 4)), flexsn_dsl.load(LIF, backend="torch"))
    text = repr(net)
    assert "PerStep(\n    time folded into the batch: [T, B, ...] -> [T*B, ...]\n    (layer): Linear" in text
    assert "neuron='lif', step_mode='m', backend='torch', surrogate='sigmoid'\n    tau=2, v_th=1, v_reset=0" in text
    mon = Monitor(net)
    assert repr(mon) == "Monitor(Sequential, not recording, layers=['1'], steps={})"
    with mon:
        net(torch.rand(5, 2, 3))
        net(torch.rand(2, 2, 3))
        assert repr(mon) == "Monitor(Sequential, recording, layers=['1'], steps={'1': 7})"


def test_simulation():
    sim = flexsn_dsl.simulate(LIF, 1.5, steps=10, neurons=2)
    spikes = int(sim.spikes.sum())
    assert spikes > 0
    assert repr(sim) == (f"Simulation('lif', 10 steps x 2 neurons, inputs ['x'], states ['v'], outputs ['s'], "
                         f"s: {spikes} spikes)")


def test_nir_network(tmp_path):
    nir = pytest.importorskip("nir")
    from flexsn_dsl.nir.read import DelayLine, Scale, Threshold
    net = torch.nn.Sequential(torch.nn.Linear(10, 4), flexsn_dsl.load(LIF, backend="torch"))
    nir.write(tmp_path / "net.nir", flexsn_dsl.to_nir(net, torch.rand(8, 2, 10), dt=1e-3))
    back = flexsn_dsl.from_nir(tmp_path / "net.nir", dt=1e-3, method="euler", backend="torch")
    assert repr(back).startswith("NIRNetwork(\n  inputs=['input'], outputs=['output'], edges=3, cycles=0, names=")
    assert "tau=0.002, r=1, v_leak=0, v_threshold=1, v_reset=0, dt=0.001" in repr(back)
    assert repr(Scale(torch.tensor([1.0, 3.0]))) == "Scale(scale: [2] in [1, 3])"
    assert repr(Threshold(torch.ones(3))) == "Threshold(threshold: [3] all 1)"
    assert repr(DelayLine(torch.tensor([2.0]))) == "DelayLine(delay: [1] all 2)"
