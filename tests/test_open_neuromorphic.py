"""benchmarks/open_neuromorphic.py (issue 27): the Open Neuromorphic workload (Linear + LIF) runs on the CPU
at tiny shapes, ours equals a hand-written torch loop of the same LIF, and a peer that is missing says so in
its row instead of vanishing."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_quick_run_checks_ours_and_reports_every_variant(tmp_path):
    out = tmp_path / "on.json"
    variants = ["linear", "ours", "ours-recompute", "snntorch", "rockpool-exodus"]
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "open_neuromorphic.py"), "--device", "cpu",
                           "--quick", "--repeats", "1", "--variants", *variants, "--json", str(out)],
                          capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert proc.returncode == 0, proc.stderr
    rows = {r["variant"]: r for r in json.loads(out.read_text())[-1]["rows"]}
    assert list(rows) == variants
    check = rows["ours"]["check"]  # against the torch loop: the same spikes, the weight gradient to rounding
    assert check["spikes_differing"] == 0 and check["weight_grad"] < 1e-5
    for v in ("linear", "ours", "ours-recompute"):
        assert rows[v]["training_ms"] > 0 and rows[v]["forward_ms"] > 0, v
    # snnTorch is a test dependency; EXODUS needs CUDA (or is not installed): its row says why
    assert "skipped" not in rows["snntorch"] and rows["snntorch"]["training_ms"] > 0
    assert rows["rockpool-exodus"]["skipped"] and "rockpool-exodus  skipped: " in proc.stdout
