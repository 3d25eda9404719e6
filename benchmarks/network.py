"""Training steps of whole spiking networks: where the neuron's speed shows (or hides) in practice.

Three networks, each built with every neuron variant, timed side by side in one process:

- ``vgg``: 4 conv+BN+neuron blocks on CIFAR-shaped input [T=4, B=64, 3, 32, 32], 10 classes;
- ``shd``: a dense SNN on SHD-shaped input (700 -> 256 -> 256 -> 20, T=100, B=256);
- ``rshd``: a recurrent SNN on the same input (700 -> 256 recurrent LIF -> 20, T=100, B=256).

Variants: ``relu`` (the same network with ReLU: the cost of everything else), ``ours``
(flexsn-dsl LIF, ``neurons/lif.yaml``; ``neurons/rlif.yaml`` in ``rshd``), ``floor`` (GPU, eager, not
``rshd``: the same kernels behind ``flexsn-dsl bench``'s minimal autograd.Function, no checks and no
states kept: what the cheapest Python wrapper of a fused neuron adds), ``sj`` (SpikingJelly
``LIFNode``, multi-step, when installed; in ``rshd`` inside ``LinearRecurrentContainer``), ``loop``
(a hand-written torch loop LIF with the same sigmoid surrogate; ``rshd``: with ``s @ W.T``).
The recurrent layers are those of ``benchmarks/recurrent_bench.py``.
Columns: eager float32, ``torch.compile`` of the network float32, eager autocast bfloat16; on request
(``--columns``) also ``cudagraphs``: ``torch.compile(mode="reduce-overhead")`` float32, whose CUDA graphs
take the per-call host cost of the compiled forward and backward off the step.

One training step = forward, cross-entropy on the time-averaged output, backward, SGD step,
``zero_grad``, reset of the neurons. Every (variant, column) is timed once per round, the
variants alternating (in reverse order every other round), over ``--rounds`` rounds; the table gives
the median over rounds of each round's ``do_bench`` median (ms) with the spread (min-max), host ms per
step (issuing the step, no waiting), GPU ms per step (CUDA kernel time from the profiler), peak MiB,
and the cost over ReLU twice: the difference of the medians, and the median of the per-round differences
(paired: a host whose speed drifts between rounds moves both sides of a pair alike).

Usage: ``python benchmarks/network.py --net vgg shd [--rounds 3] [--json FILE]``;
``--device cpu --quick`` runs tiny shapes on the CPU (a smoke test, no GPU numbers); ``--profile [cprofile]``
prints where each step's host time goes instead of timing (``torch.profiler``'s operators, or cProfile's
Python functions).
"""
from __future__ import annotations

import argparse
import cProfile
import json
import math
import pstats
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl import PerStep
from flexsn_dsl.bench import _timer, minimal_runner
from recurrent_bench import recurrent_layer, unavailable  # (benchmarks/ is on sys.path when run)
from torch_cpu import SigmoidSpike  # the same surrogate as lif.yaml

ROOT = Path(__file__).resolve().parent.parent
VARIANTS = ("relu", "ours", "floor", "sj", "loop")
COLUMNS = ("eager", "compile", "bf16")  # the default columns
COMPILED = {"compile": "default", "cudagraphs": "reduce-overhead"}  # column -> torch.compile mode
SHAPES = {  # net -> (T, B) full size, quick size
    "vgg": ((4, 64), (2, 4)),
    "shd": ((100, 256), (5, 8)),
    "rshd": ((100, 256), (5, 8)),
}


class LoopLIF(nn.Module):
    """LIF of neurons/lif.yaml (tau=2, v_th=1, hard reset to 0) as a Python loop over steps."""

    def forward(self, x):
        v = torch.zeros_like(x[0])
        out = []
        for t in range(x.shape[0]):
            h = v + (x[t] - v) / 2.0
            s = SigmoidSpike.apply(h - 1.0)
            v = h * (1 - s)
            out.append(s)
        return torch.stack(out)

    def reset(self):
        pass


class FloorLIF(nn.Module):
    """neurons/lif.yaml's kernels behind flexsn_dsl.bench.minimal_runner's bare autograd.Function, made once
    per input shape and dtype (eager only: its JIT launches are not traceable)."""

    def __init__(self):
        super().__init__()
        self.lif = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="triton")
        self.applies: dict = {}

    def forward(self, x):
        apply = self.applies.get((x.shape, x.dtype))
        if apply is None:
            apply = self.applies[x.shape, x.dtype] = minimal_runner(self.lif, [x], "function")
        return apply(x.contiguous())[0]


def neuron(variant: str, device: str) -> nn.Module:
    if variant == "relu":
        return nn.ReLU()
    if variant == "ours":
        return flexsn_dsl.load(ROOT / "neurons" / "lif.yaml",
                               backend="triton" if device == "cuda" else "torch")
    if variant == "floor":
        return FloorLIF()
    if variant == "sj":
        from spikingjelly.activation_based import neuron as sjn, surrogate
        return sjn.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), detach_reset=False,
                           step_mode="m")
    if variant == "loop":
        return LoopLIF()
    raise ValueError(variant)


def vgg(variant: str, device: str, quick: bool) -> nn.Module:
    widths = (8, 16, 16, 16) if quick else (64, 128, 256, 256)
    layers, c = [], 3
    for i, w in enumerate(widths):
        layers += [PerStep(nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w)), neuron(variant, device)]
        if i % 2 == 1:
            layers.append(PerStep(nn.MaxPool2d(2)))
        c = w
    layers += [PerStep(nn.Flatten(), nn.Linear(c * 8 * 8, 10))]
    return nn.Sequential(*layers)


def shd(variant: str, device: str, quick: bool) -> nn.Module:
    h = 16 if quick else 256
    return nn.Sequential(nn.Linear(700, h), neuron(variant, device), nn.Linear(h, h), neuron(variant, device),
                         nn.Linear(h, 20))


def rshd(variant: str, device: str, quick: bool) -> nn.Module:
    h = 16 if quick else 256
    if variant == "relu":
        rec = nn.ReLU()
    else:  # ours: the fused recurrent kernel on a GPU, the torch backend on the CPU
        ours = "ours" if device == "cuda" else "ours-torch"
        rec = recurrent_layer({"ours": ours, "sj": "sj", "loop": "loop"}[variant], h, device)
    return nn.Sequential(nn.Linear(700, h), rec, nn.Linear(h, 20))


def data(net: str, T: int, B: int, device: str):
    g = torch.Generator(device="cpu").manual_seed(0)
    shape = (T, B, 3, 32, 32) if net == "vgg" else (T, B, 700)
    x = torch.rand(shape, generator=g).to(device)
    y = torch.randint(0, 10 if net == "vgg" else 20, (B,), generator=g).to(device)
    return x, y


def reset_all(model: nn.Module) -> None:
    for m in model.modules():
        if m is not model and hasattr(m, "reset"):
            m.reset()


def make_step(net: str, variant: str, column: str, device: str, quick: bool):
    """One training step of a fresh network (seeded), and the model it trains."""
    torch.manual_seed(0)
    model = {"vgg": vgg, "shd": shd, "rshd": rshd}[net](variant, device, quick).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    forward = torch.compile(model, mode=COMPILED[column]) if column in COMPILED else model
    autocast = column == "bf16"
    T, B = SHAPES[net][1 if quick else 0]
    x, y = data(net, T, B, device)

    def step():
        if column == "cudagraphs":
            torch.compiler.cudagraph_mark_step_begin()  # the previous step's graph outputs may be overwritten
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=autocast):
            loss = nn.functional.cross_entropy(forward(x).float().mean(0), y)
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
        reset_all(model)
        return loss

    return step


def host_ms_per_step(step, device: str, calls: int = 10) -> float:
    """Median host time of issuing one step (the GPU is synchronised before, not after)."""
    times = []
    for _ in range(calls):
        if device == "cuda":
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        step()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def gpu_ms_per_step(step, steps: int = 5) -> float:
    """CUDA kernel time per step, summed from the profiler."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
    total_us = sum(e.device_time_total for e in prof.key_averages() if e.device_time_total and e.key and
                   not e.is_user_annotation)
    return total_us / 1e3 / steps


def profile_step(step, device: str, how: str = "torch", steps: int = 10, rows: int = 25) -> None:
    """Where the host time of a step goes, by self time: ``torch.profiler``'s table of operators, or with
    ``how="cprofile"`` cProfile's table of Python functions."""
    for _ in range(3):
        step()
    sync = torch.cuda.synchronize if device == "cuda" else (lambda: None)
    sync()
    if how == "cprofile":
        profiler = cProfile.Profile()
        profiler.enable()
        for _ in range(steps):
            step()
        sync()
        profiler.disable()
        stats = pstats.Stats(profiler).sort_stats("tottime")
        print(f"total {stats.total_tt / steps * 1e3:.3f} ms/step (profiled)")
        stats.print_stats(rows)
        return
    from torch.profiler import ProfilerActivity, profile
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=activities) as prof:
        for _ in range(steps):
            step()
        sync()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows, max_name_column_width=70))


def measure(step, device: str) -> dict:
    for _ in range(3):
        step()  # warm-up (compilation, autotuning, cudnn choice)
    timer = _timer(torch.device(device), repeats=3, warmup_ms=25)
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = timer(step)
        return {"ms": ms, "host_ms": host_ms_per_step(step, device), "gpu_ms": gpu_ms_per_step(step),
                "peak_mib": torch.cuda.max_memory_allocated() / 2**20}
    return {"ms": timer(step), "host_ms": None, "gpu_ms": None, "peak_mib": None}


def skip_reason(net: str, variant: str, column: str, device: str, compile_peers: bool) -> str | None:
    """Why (net, variant, column) is not run here, or None."""
    if variant == "floor" and (column in COMPILED or net == "rshd" or device != "cuda"):
        return "the floor runs eager, on a GPU, in the feed-forward nets"
    if column in COMPILED and variant in ("sj", "loop") and not compile_peers:
        return "compiling the peers takes minutes (--compile-peers runs them)"
    return unavailable(variant)


def run(nets, variants, columns, rounds: int, device: str, quick: bool, compile_peers: bool = False,
        out=sys.stdout) -> list[dict]:
    rows: dict[tuple, dict] = {}
    steps: dict[tuple, object] = {}
    for net in nets:
        # a fresh dynamo per net: Sequential.forward compiled for the previous net's input shape would make
        # dynamo recompile this net's steps with dynamic shapes ("automatic dynamic")
        torch._dynamo.reset()
        for variant in variants:
            for column in columns:
                key = (net, variant, column)
                rows[key] = {"net": net, "variant": variant, "column": column, "rounds": []}
                why = skip_reason(net, variant, column, device, compile_peers)
                if why:
                    rows[key]["skipped"] = why
                    continue
                try:
                    steps[key] = make_step(net, variant, column, device, quick)
                except Exception as exc:  # a peer that cannot build: say so in the row
                    rows[key]["skipped"] = f"{type(exc).__name__}: {exc}"
        for r in range(rounds):
            # the order flips every round, so that no variant or column always follows the same one
            order = 1 if r % 2 == 0 else -1
            for column in columns[::order]:
                for variant in variants[::order]:
                    key = (net, variant, column)
                    if key not in steps:
                        continue
                    try:
                        rows[key]["rounds"].append(measure(steps[key], device))
                    except Exception as exc:
                        rows[key]["skipped"] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:200]}"
                        del steps[key]
            print(f"{net}: round {r + 1}/{rounds} done", file=sys.stderr, flush=True)
    result = []
    for key, row in rows.items():
        ms = [m["ms"] for m in row["rounds"]]
        if ms:
            row["ms"] = statistics.median(ms)
            row["ms_min"], row["ms_max"] = min(ms), max(ms)
            for k in ("host_ms", "gpu_ms", "peak_mib"):
                vals = [m[k] for m in row["rounds"] if m[k] is not None]
                row[k] = statistics.median(vals) if vals else None
        result.append(row)
    relu = {(r["net"], r["column"]): r for r in result if r["variant"] == "relu" and "ms" in r}
    for row in result:
        b = relu.get((row["net"], row["column"]))
        if "ms" in row and b is not None:
            row["minus_relu_ms"], row["paired_minus_relu_ms"] = row["ms"] - b["ms"], paired_minus_relu(row, b)
    print_table(result, out)
    return result


def _fmt(v, digits=2) -> str:
    return "—" if v is None or (isinstance(v, float) and math.isnan(v)) else f"{v:.{digits}f}"


def paired_minus_relu(row: dict, relu: dict) -> float | None:
    """Median over rounds of (this variant's ms - ReLU's ms) in the same round: the host's drift between
    rounds, which moves both, cancels."""
    pairs = [m["ms"] - b["ms"] for m, b in zip(row["rounds"], relu["rounds"])]
    return statistics.median(pairs) if pairs and len(row["rounds"]) == len(relu["rounds"]) else None


def print_table(rows: list[dict], out) -> None:
    print("| net | variant | column | ms (median of rounds) | spread | host ms | GPU ms | peak MiB | "
          "minus relu ms | paired minus relu ms |", file=out)
    print("|---|---|---|---|---|---|---|---|---|---|", file=out)
    for r in rows:
        if "ms" not in r:
            print(f"| {r['net']} | {r['variant']} | {r['column']} | skipped: {r.get('skipped', '')} |"
                  " | | | | | |", file=out)
            continue
        print(f"| {r['net']} | {r['variant']} | {r['column']} | {_fmt(r['ms'])} | "
              f"{_fmt(r['ms_min'])}–{_fmt(r['ms_max'])} | {_fmt(r['host_ms'])} | {_fmt(r['gpu_ms'])} | "
              f"{_fmt(r['peak_mib'], 0)} | {_fmt(r.get('minus_relu_ms'))} | {_fmt(r.get('paired_minus_relu_ms'))} |", file=out)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--net", nargs="+", choices=tuple(SHAPES), default=list(SHAPES))
    p.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    p.add_argument("--columns", nargs="+", choices=(*COLUMNS, "cudagraphs"), default=list(COLUMNS))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--quick", action="store_true", help="tiny shapes (smoke test)")
    p.add_argument("--compile-peers", action="store_true", help="also torch.compile the SpikingJelly and loop networks")
    p.add_argument("--json", type=Path, help="write the rows as JSON")
    p.add_argument("--profile", nargs="?", const="torch", choices=("torch", "cprofile"),
                   help="instead of timing, print where the host time of each (net, variant, column) step goes: "
                        "torch.profiler's operators (the default) or cProfile's Python functions")
    a = p.parse_args(argv)
    if a.rounds < 1:
        p.error("--rounds must be at least 1")
    if a.profile:
        for net in a.net:
            for variant in a.variants:
                for column in a.columns:
                    why = skip_reason(net, variant, column, a.device, a.compile_peers)
                    print(f"== {net} {variant} {column}" + (f": skipped, {why}" if why else ""))
                    if not why:
                        profile_step(make_step(net, variant, column, a.device, a.quick), a.device, a.profile)
        return 0
    rows = run(a.net, a.variants, a.columns, a.rounds, a.device, a.quick, a.compile_peers)
    if a.json:
        meta = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if a.device == "cuda" else "cpu",
                "date": time.strftime("%Y-%m-%d")}
        a.json.write_text(json.dumps({"meta": meta, "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
