"""The examples run, print what they promise and learn: small settings here (the full digits run,
20 epochs, reaches 97.6 % test accuracy; see the README)."""
from __future__ import annotations

import contextlib
import importlib.util
import io
import re
from pathlib import Path

import pytest
import torch

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def run_example(name: str, argv: list[str]) -> tuple[float, str]:
    spec = importlib.util.spec_from_file_location(f"example_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    threads = torch.get_num_threads()
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), torch.device("cpu"):
            accuracy = module.main(argv)
    finally:
        torch.set_num_threads(threads)
    return accuracy, out.getvalue()


def test_digits_learns_well_above_chance():
    pytest.importorskip("sklearn")  # in the dev extra
    accuracy, out = run_example("digits", ["--epochs", "4", "--hidden", "128", "--backend", "torch"])
    losses = [float(v) for v in re.findall(r"^epoch +\d+: loss ([\d.]+)", out, re.M)]
    assert len(losses) == 4 and losses[-1] < losses[0] / 2, out
    printed = float(re.search(r"^test accuracy: ([\d.]+)$", out, re.M).group(1))
    assert printed == pytest.approx(accuracy, abs=1e-4)
    assert accuracy > 0.8, out  # 10 classes: chance is 0.1


def test_cifar_conv_quick_learns_the_synthetic_classes():
    accuracy, out = run_example("cifar_conv", ["--quick", "--images", "384", "--backend", "torch"])
    assert out.startswith("SYNTHETIC CIFAR-shaped data (not CIFAR-10)")
    losses = [float(v) for v in re.findall(r"^epoch \d: loss ([\d.]+)", out, re.M)]
    assert len(losses) == 3 and losses[-1] < losses[0], out
    assert accuracy > 0.4, out  # chance is 0.1


def test_delays_timing_is_solved_with_delays_only():
    """Classes that differ only in the timing between channels: chance without delays, learned with them."""
    accuracies, out = run_example("delays_timing", ["--epochs", "3"])
    assert accuracies["without delays"] < 0.35 and accuracies["with learned delays"] > 0.9, out
    assert f"with learned delays: test accuracy {accuracies['with learned delays']:.3f}" in out
