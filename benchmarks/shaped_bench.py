"""Shaped parameters at the speed of scalars: training time and peak memory of a spec with a
per-channel or per-neuron learnable parameter against the same spec with that parameter scalar.

Targets (issue 11, on the H200): per-channel PLIF (neurons/plif_channel.yaml), T=8, input
[8, 32, 128, 32, 32], within 1.10x the graph time of the scalar version and <= 1.2x its memory
floor; per-neuron LIF (neurons/lif_hetero.yaml), T=64, [64, 16, 65536], within 1.10x; peak
training memory no more than the scalar version's plus the parameter and its gradient.

    python benchmarks/shaped_bench.py                 # the GPU targets
    python benchmarks/shaped_bench.py --quick         # small shapes: runs anywhere (CPU: interpreter)

The scalar twin is the same spec text with the parameter scalar (its initial value, no ``shape``). Both run the Triton
backend; before timing, the shaped module with every element equal to the scalar is checked
against the scalar one (outputs, input gradients, and the parameter gradient summed).

Timing: every variant of every case is first run eagerly (compiled, launched, its memory
allocated), then timed with ``do_bench`` and its peak memory taken, and only then captured:
one training call per CUDA graph after warm-up calls on a side stream that waits for the
default stream (``flexsn_dsl.bench.graph_replay_ms``), replayed between CUDA events. Every
module is reset before each capture: the states a module carries from its last call keep that
call's autograd graph alive, and with it the AccumulateGrad node of the input both variants share,
made on the default stream; a captured backward that reaches it fails ("operation failed due to a
previous error during capture"). A variant that still cannot be captured is timed eagerly, and
the reason is printed.
"""
from __future__ import annotations

import argparse
import json
import math
import re
import sys
from pathlib import Path

import torch

import flexsn_dsl
from flexsn_dsl.bench import _peak, _timer, copy_bandwidth, floor_bytes, graph_replay_ms

ROOT = Path(__file__).resolve().parents[1]
# (spec, shaped parameter, sizes, input shape [T, ...]) for the targets and for --quick
CASES = [("plif_channel", "w", {"C": 128}, (8, 32, 128, 32, 32)),
         ("lif_hetero", "tau", {"N": 65536}, (64, 16, 65536))]
WARMUP_CALLS = 3  # eager calls of every variant before any timing or capture
QUICK = [("plif_channel", "w", {"C": 6}, (4, 2, 6, 5, 7)),
         ("lif_hetero", "tau", {"N": 33}, (6, 3, 33))]


def _modules(spec: str, param: str, sizes: dict, device):
    text = (ROOT / "neurons" / f"{spec}.yaml").read_text()
    shaped = flexsn_dsl.loads(text, sizes=sizes, backend="triton", filename=f"{spec}.yaml").to(device)
    value = shaped._compiled.values[param]  # the initial value of every element
    scalar_text, count = re.subn(rf"\n  {param}: \{{.*\}}\n", f"\n  {param}: {{value: {value!r}, learnable: true}}\n",
                                 text)
    assert count == 1, f"cannot find parameter {param!r} in {spec}.yaml"
    scalar = flexsn_dsl.loads(scalar_text, backend="triton", filename=f"{spec}_scalar.yaml").to(device)
    return shaped, scalar


def _training(module, x):
    params = [p for p in module.parameters() if p.requires_grad]
    g = torch.randn_like(x)

    def run():
        module.reset()
        y = module(x)
        return torch.autograd.grad(y, [x, *params], g)
    return run


def _check(shaped, scalar, x, param: str) -> float:
    """Largest difference between the shaped module (all elements equal) and the scalar one."""
    torch.manual_seed(0)
    a = _training(shaped, x)()
    torch.manual_seed(0)
    b = _training(scalar, x)()
    diffs = [(a[0] - b[0]).abs().max().item(), abs(a[1].sum().item() - b[1].item()) / max(abs(b[1].item()), 1e-30)]
    return max(diffs)


def _partial_bytes(module, param: str, x: torch.Tensor) -> int:
    """Bytes of the partial sums that the Triton backward allocates for ``param``'s gradient on input ``x``
    (float32: the compute dtype of float32 inputs)."""
    from flexsn_dsl.triton_autograd import shaped_period, shaped_view
    from flexsn_dsl.triton_plan import _kernels
    step = x.shape[1:]
    layout = [v for name in module.spec.shaped for v in shaped_view(getattr(module, name), step)[1:]]
    inner = shaped_view(getattr(module, param), step)[1]
    kernels = _kernels(module._compiled, x.device.type)
    return math.prod(kernels.tiling(math.prod(step), shaped_period(layout)).partial_shape(inner)) * 4


def _graph_ms(label: str, run) -> float | None:
    """The CUDA-graph time of one training call, or None with the reason printed (eager times then)."""
    try:
        return graph_replay_ms(run)
    except Exception as exc:  # noqa: BLE001 - any capture failure: report it and fall back to do_bench
        print(f"{label}: no CUDA-graph time, do_bench (eager) instead: {type(exc).__name__}: "
              f"{(str(exc).strip().splitlines() or [''])[0]}", flush=True)
        torch.cuda.synchronize()
        return None


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small shapes (a smoke run; CPU works)")
    parser.add_argument("--json", metavar="FILE", help="write the rows to this JSON file")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    timer = _timer(device)
    bandwidth = copy_bandwidth(device)
    cases = []
    for spec, param, sizes, shape in (QUICK if args.quick else CASES):
        shaped, scalar = _modules(spec, param, sizes, device)
        x = (torch.rand(shape, device=device) * (2.0 if spec == "plif_channel" else 8.0)).requires_grad_()
        runs = {"scalar": _training(scalar, x), "shaped": _training(shaped, x)}
        for run in runs.values():  # every variant compiled, launched and allocated before any timing or capture
            for _ in range(WARMUP_CALLS):
                run()
        cases.append((spec, param, shape, shaped, scalar, x, runs))
    if device.type == "cuda":
        torch.cuda.synchronize()
    rows = []
    for spec, param, shape, shaped, scalar, x, runs in cases:
        T, n = shape[0], math.prod(shape[1:])
        floor_ms = floor_bytes(scalar.info, T, n, x.element_size(), "training") / bandwidth * 1e3
        diff = _check(shaped, scalar, x, param)
        results = {label: dict(ms=timer(run), peak_mib=_peak(device, run)) for label, run in runs.items()}
        for label, run in runs.items():  # captures last: a failed one cannot spoil the eager numbers
            shaped.reset()  # (no graph of an earlier call kept alive: see the module docstring)
            scalar.reset()
            results[label]["graph_ms"] = _graph_ms(f"{spec} {label}", run) if device.type == "cuda" else None
        p = getattr(shaped, param)
        allowed_mib = 2 * p.numel() * p.element_size() / 2 ** 20  # the parameter and its gradient
        kind = "graph" if all(v["graph_ms"] for v in results.values()) else "eager"  # both timed alike
        best = {k: v[f"{'graph_' if kind == 'graph' else ''}ms"] for k, v in results.items()}
        row = dict(spec=spec, shape=list(shape), param=param, param_shape=list(p.shape), floor_ms=floor_ms,
                   check_max_diff=diff, **{f"{k}_{m}": v for k, r in results.items() for m, v in r.items()},
                   timing=kind, time_ratio=best["shaped"] / best["scalar"], floor_ratio=best["shaped"] / floor_ms,
                   extra_peak_mib=(results["shaped"]["peak_mib"] - results["scalar"]["peak_mib"])
                   if device.type == "cuda" else None, allowed_extra_mib=allowed_mib,
                   grad_partial_bytes=_partial_bytes(shaped, param, x))
        rows.append(row)
        peak = "" if row["extra_peak_mib"] is None else \
            f", peak +{row['extra_peak_mib']:.2f} MiB (parameter + gradient {allowed_mib:.2f} MiB)"
        print(f"{spec:13s} {str(list(shape)):24s} training ({kind}) scalar {best['scalar']:9.4f} ms  shaped "
              f"{best['shaped']:9.4f} ms  ratio {row['time_ratio']:.3f}  floor {floor_ms:.4f} ms "
              f"({row['floor_ratio']:.2f}x){peak}  gradient partial sums {row['grad_partial_bytes']} B "
              f"(parameter {p.numel() * p.element_size()} B)  check {diff:.1e}", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"device": torch.cuda.get_device_name() if device.type == "cuda"
                                               else "cpu", "rows": rows}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
