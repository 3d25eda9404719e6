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
    runs = []
    for backend in ("torch", "triton"):
        args = shd_recurrent.parse(["--quick", "--device", device, "--backend", backend])
        args.steps = 3  # (--quick sets 40 steps over a --steps given with it)
        runs.append(shd_recurrent.train(args))
    torch_run, triton_run = runs
    assert triton_run == pytest.approx(torch_run, rel=1e-4, abs=1e-5)
