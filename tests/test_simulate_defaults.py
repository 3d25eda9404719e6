"""A spec's `simulate:` defaults (drive, steps, sizes), what `flexsn-dsl simulate` says when no neuron
spiked, and the validation of the key."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main
from flexsn_dsl.simulation import fi_curve

ROOT = Path(__file__).resolve().parents[1]
NEURONS = ROOT / "neurons"
LIF_CT = NEURONS / "lif_ct.yaml"


def lif_ct_spikes(drive: float, steps: int, tau: float = 2.0, dt: float = 1.0) -> int:
    """lif_ct integrated exactly by hand: v <- I + (v - I) exp(-dt / tau); a spike at v >= 1 resets v to 0."""
    v, count = 0.0, 0
    for _ in range(steps):
        v = drive + (v - drive) * math.exp(-dt / tau)
        if v >= 1.0:
            v, count = 0.0, count + 1
    return count


def test_the_spec_defaults_drive_the_simulation():
    """lif_ct says `simulate: {drive: 1.5}`; HH (a neuron in mV and ms) `{drive: 10.0, steps: 1000}`."""
    sim = flexsn_dsl.simulate(LIF_CT)
    assert sim.steps == 100 and torch.all(sim.inputs["I"] == 1.5)
    assert int(sim.spike_count[0]) == lif_ct_spikes(1.5, 100) > 0
    hh = flexsn_dsl.simulate(NEURONS / "hh.yaml")
    assert hh.steps == 1000 and torch.all(hh.inputs["I"] == 10.0) and int(hh.spike_count[0]) > 0
    given = flexsn_dsl.simulate(LIF_CT, 0.5, steps=7)  # what the call gives wins
    assert given.steps == 7 and torch.all(given.inputs["I"] == 0.5)
    hetero = flexsn_dsl.simulate(NEURONS / "lif_hetero.yaml")  # `sizes: {N: 4}`
    assert hetero.neurons == 4 and flexsn_dsl.simulate(NEURONS / "lif_hetero.yaml", sizes={"N": 2}).neurons == 2


def test_fi_curve_runs_the_spec_steps():
    """HH's f-I curve over its 1000 steps rises (over the old default of 100 steps it was one spike at most)."""
    _, rates = fi_curve(NEURONS / "hh.yaml", [0.0, 10.0, 50.0])
    assert rates[0] == 0 and 0 < rates[1] < rates[2]


def test_cli_prints_a_hint_when_nothing_spikes(capsys):
    """The hint names the first doubling of the drive that spikes (by the hand-written loop: I = 1 never
    reaches the threshold, I = 2 does), and the option to change."""
    assert lif_ct_spikes(0.5, 100) == lif_ct_spikes(1.0, 100) == 0 < lif_ct_spikes(2.0, 100)
    assert main(["simulate", str(LIF_CT), "--input", "0.5"]) == 0
    last = capsys.readouterr().out.splitlines()[-1]
    assert last == "hint: no spike at I = 0.5 over 100 steps: I = 2 spikes (--input I=2), or give more steps (--steps T)"
    assert main(["simulate", str(LIF_CT), "--input", "-1"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("hint: no spike at I = -1 over 100 steps, nor at up to "
                                                               "4096 times that: give another drive (--input I=VALUE)")
    assert main(["simulate", str(LIF_CT), "--fi", "0:1:3"]) == 0
    assert capsys.readouterr().out.splitlines()[-1].startswith("hint: no spike at any of these inputs over 100 steps")
    assert main(["simulate", str(LIF_CT)]) == 0
    assert "hint" not in capsys.readouterr().out


SPEC = "neuron: n\nparameters: {tau: {value: 2.0, shape: [N]}}\nstates: {v: 0.0}\nstep:\n  s: spike(v + x - tau)\n"


@pytest.mark.parametrize("line, fragment", [
    ("simulate: 3", "`simulate` must be a mapping"),
    ("simulate: {driv: 2.0}", "unknown key 'driv' in `simulate` | hint: did you mean 'drive'"),
    ("simulate: {drive: y}", "the drive of 'x' in `simulate` must be a number"),
    ("simulate: {drive: {y: 1.0}}", "`simulate` drives 'y', which is not an input"),
    ("simulate: {steps: 0}", "`steps` in `simulate` must be a whole number from 1 to"),
    ("simulate: {steps: 2.5}", "`steps` in `simulate` must be a whole number"),
    ("simulate: {sizes: {C: 3}}", "`simulate` gives the size 'C', which no parameter shape names | hint: the sizes "
                                  "are: N"),
])
def test_bad_simulate_defaults(line, fragment):
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(SPEC + line + "\n", filename="bad.yaml", backend="torch", sizes={"N": 2})
    exc = info.value
    assert fragment in f"{exc.message} | hint: {exc.hint}" and (exc.file, exc.line) == ("bad.yaml", 6), str(exc)
    flexsn_dsl.loads(SPEC + "simulate: {drive: {x: 2.0}, steps: 5, sizes: {N: 3}}\n", backend="torch",
                     sizes={"N": 2})
