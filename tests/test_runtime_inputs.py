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
                ("FLEXSN_DSL_AUTOTUNE", "2")]


@pytest.mark.parametrize("name,value", BAD_SETTINGS)
def test_a_bad_launch_setting_fails_the_triton_backend_only(name, value, monkeypatch):
    from flexsn_dsl.triton_runtime import launch_settings
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


@pytest.mark.parametrize("stages,autotune,expected", [("", "", (False, 0)), ("0", "0", (False, 0)),
                                                      (" 3 ", "1", (True, 3)), ("16", "", (False, 16))])
def test_good_launch_settings_are_read_at_launch(stages, autotune, expected, monkeypatch):
    from flexsn_dsl.triton_runtime import launch_settings
    monkeypatch.setenv("FLEXSN_DSL_STAGES", stages)
    monkeypatch.setenv("FLEXSN_DSL_AUTOTUNE", autotune)
    assert tuple(launch_settings()) == expected
    x = torch.rand(4, 6)
    torch.testing.assert_close(flexsn_dsl.load(LIF, backend="triton")(x), flexsn_dsl.load(LIF, backend="torch")(x))


def test_a_bad_launch_setting_does_not_break_importing_or_the_torch_backend(tmp_path):
    """In a fresh process: importing every module, and the torch backend, ignore the settings."""
    code = ("import torch, flexsn_dsl, flexsn_dsl.triton_runtime, flexsn_dsl.cli\n"
            f"m = flexsn_dsl.load({str(LIF)!r}, backend='torch')\n"
            "print(m(torch.full((2, 3), 1.5)).tolist())\n")
    env = dict(os.environ, FLEXSN_DSL_STAGES="abc", FLEXSN_DSL_AUTOTUNE="on", FLEXSN_DSL_CACHE=str(tmp_path))
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == str([[0.0] * 3, [1.0] * 3])  # h: 0.75, then 1.125 >= v_th
