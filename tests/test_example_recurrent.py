"""examples/shd_recurrent.py: the recurrent SNN learns the synthetic SHD-shaped task, and the
Triton backend trains it exactly as the torch backend does."""
from __future__ import annotations

import sys
from pathlib import Path

import pytest

from flexsn_dsl.triton_runtime import interpreting

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import shd_recurrent  # noqa: E402


def test_quick_training_learns():
    first, last, acc = shd_recurrent.train(shd_recurrent.parse(["--quick", "--backend", "torch", "--device", "cpu"]))
    assert last < 0.5 * first and acc > 0.5  # held-out accuracy; chance: loss ln(4) = 1.39, accuracy 0.25


@pytest.mark.parametrize("device", ["cpu" if interpreting() else "cuda"])  # where the Triton backend runs here
def test_triton_trains_like_torch(device):
    args = ["--quick", "--steps", "3", "--device", device]
    torch_run = shd_recurrent.train(shd_recurrent.parse([*args, "--backend", "torch"]))
    triton_run = shd_recurrent.train(shd_recurrent.parse([*args, "--backend", "triton"]))
    assert triton_run == pytest.approx(torch_run, rel=1e-4, abs=1e-5)
