"""The speed items of continuous-time neurons (issue 10), measured with flexsn_dsl.bench.

1. Exact `lif_ct` against the hand-discretised v1 `lif`, training, T=8, 4M neurons: the ratio of
   their CUDA-graph times (target <= 1.05: the same bytes, folded constants).
2. `hh` (Hodgkin-Huxley, 4 states, exponential Euler), training, T=64, 1M neurons: the ratio of its
   time to its memory floor (target <= 1.3).
3. `hh` first call (load, sympy derivation, generation, compilation, one inference and one training
   call) in a fresh process with empty caches (target <= 10 s on the H200).
4. `flexsn-dsl check` of every continuous-time zoo spec, in a fresh process each (target <= 2 s on the CPU).

Usage: python benchmarks/ct_bench.py [--quick] [--json FILE]
``--quick`` runs everything small on the CPU (4096 neurons, T=4), to check that the script works.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from flexsn_dsl.bench import Result, _first_call, add_arguments, run_bench

ROOT = Path(__file__).resolve().parents[1]
NEURONS = ROOT / "neurons"
CT_SPECS = ("lif_ct", "cuba_lif_ct", "lif_refractory", "adex_ct", "izhikevich_ct", "hh")


def _bench(specs: list[str], T: int, n: int, device: str) -> list[Result]:
    parser = argparse.ArgumentParser()
    add_arguments(parser)  # bench's own defaults for every option not given here
    args = parser.parse_args([*(str(NEURONS / f"{s}.yaml") for s in specs), "-T", str(T), "-n", str(n),
                              "--mode", "training", "--device", device, "--peers"])
    args.plugin = []  # a global option of the CLI
    return [r for r in run_bench(args) if r.impl == "flexsn-dsl"]


def _best(r: Result) -> float:
    return r.graph_ms or r.ms


def _check_seconds(spec: str) -> float:
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, FLEXSN_DSL_CACHE=cache)
        start = time.perf_counter()
        subprocess.run([sys.executable, "-m", "flexsn_dsl", "check", str(NEURONS / f"{spec}.yaml")], env=env,
                       check=True, capture_output=True)
        return time.perf_counter() - start


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes on the CPU (checks that it runs)")
    parser.add_argument("--json", metavar="FILE", help="write the summary to this JSON file")
    args = parser.parse_args()
    cuda = torch.cuda.is_available() and not args.quick
    device = "cuda" if cuda else "cpu"
    T_lif, n_lif, T_hh, n_hh = (8, 4 << 20, 64, 1 << 20) if cuda else (4, 4096, 4, 4096)
    summary: dict[str, object] = {"device": torch.cuda.get_device_name() if cuda else "cpu", "quick": args.quick}

    lif, lif_ct = _bench(["lif", "lif_ct"], T_lif, n_lif, device)
    summary["lif_ct_over_lif"] = _best(lif_ct) / _best(lif)
    summary["lif_ms"], summary["lif_ct_ms"] = _best(lif), _best(lif_ct)
    (hh,) = _bench(["hh"], T_hh, n_hh, device)
    summary["hh_ms"], summary["hh_floor_ms"], summary["hh_over_floor"] = _best(hh), hh.floor_ms, hh.ratio
    with tempfile.TemporaryDirectory() as cache:
        summary["hh_first_call_s"] = _first_call(str(NEURONS / "hh.yaml"), {}, [], T_hh, (n_hh,), "float32", device, cache, {})
    summary["check_s"] = {spec: _check_seconds(spec) for spec in CT_SPECS}

    print(f"\nlif_ct / lif, training T={T_lif} N={n_lif}: {summary['lif_ct_over_lif']:.3f}x (target <= 1.05)")
    print(f"hh training T={T_hh} N={n_hh}: {summary['hh_ms']:.4f} ms, floor {summary['hh_floor_ms']:.4f} ms, "
          f"{summary['hh_over_floor']:.2f}x (target <= 1.3)")
    print(f"hh first call: {summary['hh_first_call_s']:.2f} s (target <= 10 s on the H200)")
    for spec, seconds in summary["check_s"].items():
        print(f"flexsn-dsl check neurons/{spec}.yaml: {seconds:.2f} s (target <= 2 s on the CPU)")
    if args.json:
        Path(args.json).write_text(json.dumps(summary, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
