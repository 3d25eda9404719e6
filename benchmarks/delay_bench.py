"""Learnable delays at the SHD setting of the DCLS/mlGeNN comparison: a training step of 700 -> 256 -> 256 -> 20
(DelayLinear, LIF per layer; T = 1127, B = 256) at each longest delay, beside DCLS's ``Dcls1d`` in the same
process (``pip install dcls``; skipped when it is not installed), on random spikes of SHD's shapes.

Prints per longest delay and implementation: the training step's time (forward, backward, Adam; median of
``--repeat`` after a warm-up, each implementation from an empty allocator cache), one SHD epoch's worth (8,156
samples) at that rate, and the peak GPU memory of a step. At initialisation the hidden layers of this network are
silent on these inputs (measured on the CPU, batch 2: the layers' input densities 0.010, 0, 0), so their event
kernels have no events; ``--gain G`` multiplies DelayLinear's initial weights by G to give them activity (16: about
0.015 and 0.035; 24: 0.055 and 0.20). The script prints each layer's input density. ``--event-density D`` sets the
input density up to which DelayLinear takes its event kernels, both ``flexsn_dsl.delay_kernels.EVENT_FORWARD`` and
``EVENT_TAPS`` (0 forces the dense ones, 1 the event ones): run it at both ends to see what the event kernels give
in the network; ``--kernels`` times the kernels alone, dense against event, at input densities from 0.2 % to 20 %
(layer shapes 700 -> 256 and 256 -> 256): where they cross are ``EVENT_FORWARD`` (at the longest delay given, scaled
as its comment says) and ``EVENT_TAPS``; ``--blocks`` times the first layer's event forward alone at each longest
delay in blocks of several shapes: the measurement behind ``EVENT_OUTPUTS`` x ``EVENT_STEPS``; ``--listing`` the
listing of its input's events in tiles of several shapes: the measurement behind ``LIST_STEPS`` x ``LIST_WARPS``;
``--layers`` each delay layer alone (700 -> 256 and 256 -> 256, forward and backward) against ``Dcls1d``, at any
``-T`` (the delay-learning papers on SHD bin it to 100 to 250 steps, with longest delays of 25 to 250).
``--cuda-graph`` captures the training step (with ``--layers``, each layer's call) as one CUDA graph and times its
replays, in both implementations (inside a capture DelayLinear takes the kernels its warm-up steps chose);
``--compile [BACKEND]`` times the step of each network compiled with ``torch.compile(fullgraph=True)`` (inductor
unless a backend is named; DelayLinear is one operator of the graph, choosing its kernels when it runs).
``--profile`` prints instead where one flexsn-dsl step's GPU time goes (torch.profiler, the kernels with the most
time) and where the GPU waits (the time between its kernels, the longest gaps with the kernels around them and what
the host did there), and ``--memory`` what is live at its peak of GPU memory, by the line that allocated it (the
CUDA allocator's history). ``--quick`` runs CPU-sized shapes with the torch backends (checks the script only).

    python benchmarks/delay_bench.py [--max-delays 64 256 512] [-T 1127] [-B 256] [--density 0.01]
                                     [--event-density D] [--profile] [--memory] [--kernels] [--blocks]
                                     [--listing] [--layers] [--cuda-graph] [--compile [BACKEND]]
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import statistics
import sys
import time
from pathlib import Path
from typing import Iterable, Iterator

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl import delay_kernels
from flexsn_dsl.bench import graph_replay_ms

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import shd_delays  # noqa: E402

LIF = shd_delays.LIF
SHD_TRAIN = shd_delays.TRAIN_SAMPLES
SIZES = (700, 256, 256, 20)


def DelayNet(max_delay: int, backend: str, gain: float = 1.0) -> nn.Module:
    """DelayLinear + LIF per layer (examples/shd_delays.py's network), its initial weights times ``gain``."""
    net = shd_delays.DelayNet(SIZES, max_delay, backend)
    with torch.no_grad():
        for layer in net.layers:
            layer.weight.mul_(gain)
    return net


def input_densities(net: nn.Module, x: torch.Tensor) -> list[float]:
    """The fraction of nonzero entries in each DelayLinear layer's input, in one forward of ``x``."""
    seen = []
    hooks = [layer.register_forward_hook(lambda _, inputs, __: seen.append((inputs[0] != 0).float().mean().item()))
             for layer in net.layers]
    with torch.no_grad():
        net(x)
    for hook in hooks:
        hook.remove()
    return seen


def dcls_size(max_delay: int) -> int:
    """``Dcls1d``'s kernel length for a longest delay (SNN-delays rounds it to an odd size)."""
    return max_delay + 1 if max_delay % 2 == 0 else max_delay


def dcls_input(x: torch.Tensor, size: int) -> torch.Tensor:
    """``x [T, B, C]`` as ``Dcls1d`` reads it: ``[B, C, T + size - 1]``, padded on the left by the kernel's length."""
    return nn.functional.pad(x.permute(1, 2, 0), (size - 1, 0))


def dcls_layer(inputs: int, outputs: int, size: int) -> nn.Module:
    """A ``Dcls1d`` of DCLS-Delays' synapses: one Gaussian-interpolated tap per synapse in a kernel of ``size``."""
    from DCLS.construct.modules import Dcls1d  # noqa: PLC0415 (optional peer)
    return Dcls1d(inputs, outputs, kernel_count=1, groups=1, dilated_kernel_size=size, bias=True, version="gauss")


class DclsNet(nn.Module):
    """The same network with DCLS-Delays' synapses (``Dcls1d``, one Gaussian-interpolated tap per synapse, the
    input padded on the left by the kernel's length, as in Thvnvtos/SNN-delays)."""

    def __init__(self, max_delay: int, backend: str):
        super().__init__()
        self.size = dcls_size(max_delay)
        self.layers = nn.ModuleList(dcls_layer(a, b, self.size) for a, b in zip(SIZES, SIZES[1:]))
        self.neurons = nn.ModuleList(flexsn_dsl.load(LIF, backend=backend) for _ in self.layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for layer, neuron in zip(self.layers, self.neurons):  # (statements apart, as DelayNet's)
            x = layer(dcls_input(x, self.size)).permute(2, 0, 1).contiguous()
            x = neuron(x)
            neuron.reset()
        return x.sum(0)


def training_step(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, capturable: bool = False,
                  compiler: str | None = None):
    """One training step of ``net`` (forward, cross-entropy, backward, Adam) as a function of nothing
    (``capturable``: Adam's, for a CUDA graph; ``compiler``: ``net`` compiled as one graph with that torch.compile
    backend)."""
    optimiser = torch.optim.Adam(net.parameters(), lr=1e-3, capturable=capturable)
    model = torch.compile(net, fullgraph=True, backend=compiler) if compiler else net

    def step() -> None:
        loss = nn.functional.cross_entropy(model(x), labels)
        optimiser.zero_grad(set_to_none=True)
        loss.backward()
        optimiser.step()
    return step


def step_time(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, repeat: int, graph: bool = False,
              compiler: str | None = None) -> tuple[float, float]:
    """(median seconds, peak GPU bytes) of a training step; ``graph``: the step captured as one CUDA graph and
    replayed (``flexsn_dsl.bench.graph_replay_ms``, ``repeat`` rounds of 5 replays; the graph's pool counted in
    the peak); ``compiler``: the network compiled (:func:`training_step`), its first step, which compiles, not
    timed."""
    if graph:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        ms = graph_replay_ms(training_step(net, x, labels, capturable=True), replays=5, rounds=repeat)
        return ms / 1e3, torch.cuda.max_memory_allocated()
    step = training_step(net, x, labels, compiler=compiler)
    step()
    if x.is_cuda:
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        step()
        if x.is_cuda:
            torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() if x.is_cuda else 0.0


def profile(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, rows: int = 15, warmup: int = 3) -> None:
    """Where a training step's device time goes: the kernels with the most, after ``warmup`` steps (Adam makes its
    state in the first, so the second may still allocate where later steps reuse the allocator's cache)."""
    step = training_step(net, x, labels)
    for _ in range(warmup):
        step()
    activities = [torch.profiler.ProfilerActivity.CPU] + ([torch.profiler.ProfilerActivity.CUDA] if x.is_cuda else [])
    with torch.profiler.profile(activities=activities) as prof, collections_profiled():
        step()
        if x.is_cuda:
            torch.cuda.synchronize()
    key = "self_device_time_total" if x.is_cuda else "self_cpu_time_total"
    print(prof.key_averages().table(sort_by=key, row_limit=rows, max_name_column_width=60))
    if x.is_cuda:
        spans = [(e.time_range.start, e.time_range.end, e.name, e.device_type) for e in prof.events()]
        print(idle_gaps([span[:3] for span in spans if span[3] == torch.autograd.DeviceType.CUDA],
                        [span[:3] for span in spans if span[3] == torch.autograd.DeviceType.CPU]))


@contextlib.contextmanager
def collections_profiled():
    """Python's garbage collections inside the block, each a profiler span named ``gc gen<N>`` (N: the oldest
    generation collected), so that a step's profile shows a collection that holds up the host."""
    running = []

    def note(phase: str, info: dict) -> None:
        if phase == "start":
            running.append(torch.profiler.record_function(f"gc gen{info['generation']}"))
            running[-1].__enter__()
        elif running:
            running.pop().__exit__(None, None, None)
    gc.callbacks.append(note)
    try:
        yield
    finally:
        gc.callbacks.remove(note)


def idle_gaps(spans: list[tuple[float, float, str]], host: list[tuple[float, float, str]] = (), rows: int = 8,
              least: float = 10.0) -> str:
    """Where the GPU waits within a step: from its kernels' ``(start, end, name)`` (microseconds), the time between the
    first start and the last end, the time some kernel runs, and the ``rows`` longest gaps of at least ``least``
    microseconds between them, each with when it starts (from the first kernel), the kernels around it, and from the
    ``host`` spans (same form, any thread): the CUDA runtime's and driver's calls (``cuda*``, ``cu*``: a Triton
    launch is ``cuLaunchKernelEx``) and Python's garbage collections (``gc gen<N>``) of ``least`` or more that
    overlap it, where a ``cudaMalloc``, a synchronisation or a collection says why the GPU waited; and the two
    innermost other spans that hold the whole gap (an autograd node, an operator), which say what the host was
    doing."""
    if not spans:
        return "no device events recorded"
    spans = sorted(spans)
    gaps, busy, end, before = [], 0.0, spans[0][0], spans[0][2]
    for start, stop, name in spans:
        if start - end >= least:
            gaps.append((start - end, before, name, end, start))
        busy += max(0.0, stop - max(start, end))
        if stop > end:
            end, before = stop, name
    span = end - spans[0][0]
    lines = [f"device busy {busy / 1e3:.2f} ms of {span / 1e3:.2f} ms from the first kernel to the last; idle "
             f"{(span - busy) / 1e3:.2f} ms, {sum(g[0] for g in gaps) / 1e3:.2f} ms of it in {len(gaps)} gaps of "
             f"{least:g} us or more; the longest:"]
    calls, others = [], []
    for h in host:
        (calls if h[2].startswith(("cu", "gc gen")) else others).append(h)
    for gap, before, after, first, last in sorted(gaps, reverse=True)[:rows]:
        inside = sorted((stop - start, name) for start, stop, name in calls
                        if stop - start >= least and min(stop, last) > max(start, first))
        holding = sorted((stop - start, name) for start, stop, name in others if start <= first and stop >= last)
        lines.append(f"  {gap:8.1f} us at {(first - spans[0][0]) / 1e3:.2f} ms  after {before[:50]}  before "
                     f"{after[:50]}; host: " + (", ".join(f"{name} {took:.0f} us" for took, name in inside[::-1][:3])
                                                or "nothing recorded")
                     + ("; in " + " < ".join(name[:70] for _, name in holding[:2]) if holding else ""))
    return "\n".join(lines)


def peak_blocks(events: list[dict], where: tuple[str, ...] = ("flexsn_dsl", "examples")
                ) -> tuple[int, list[tuple[str, int, int]]]:
    """The peak of the bytes allocated along ``events`` (a CUDA memory snapshot's trace: ``alloc`` and
    ``free_completed`` actions with ``addr``, ``size`` and ``frames``), above what was live before them, and the
    blocks live at that peak grouped by the first of their frames in a file whose path holds one of ``where``:
    ``(peak, [(frame, bytes, blocks), ...])``, the most bytes first."""
    def replay(until: int) -> tuple[dict, int, int]:
        live, now, peak, at = {}, 0, 0, -1
        for n, e in enumerate(events[:until]):
            if e["action"] == "alloc":
                live[e["addr"]] = e
                now += e["size"]
                if now > peak:
                    peak, at = now, n
            elif e["action"] == "free_completed" and e["addr"] in live:
                now -= live.pop(e["addr"])["size"]
        return live, peak, at
    _, peak, at = replay(len(events))
    groups: dict[str, list[int]] = {}
    for e in replay(at + 1)[0].values():
        frame = next((f"{Path(f['filename']).name}:{f['line']} {f['name']}" for f in e.get("frames", [])
                      if any(w in f["filename"] for w in where)), "elsewhere")
        group = groups.setdefault(frame, [0, 0])
        group[0] += e["size"]
        group[1] += 1
    return peak, sorted(((f, n, k) for f, (n, k) in groups.items()), key=lambda g: -g[1])


def memory(net: nn.Module, x: torch.Tensor, labels: torch.Tensor, rows: int = 12) -> None:
    """What is live at a training step's peak of GPU memory, by where it was allocated (the allocator's history
    of one step after a warm-up)."""
    step = training_step(net, x, labels)
    step()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    torch.cuda.memory._record_memory_history(max_entries=1_000_000)
    step()
    torch.cuda.synchronize()
    events = torch.cuda.memory._snapshot()["device_traces"][torch.cuda.current_device()]
    torch.cuda.memory._record_memory_history(enabled=None)
    peak, groups = peak_blocks(events)
    print(f"live before the step {before / 1e9:.2f} GB, peak {(before + peak) / 1e9:.2f} GB; at the peak:")
    for frame, size, blocks in groups[:rows]:
        print(f"  {size / 1e9:6.3f} GB in {blocks:3d} blocks  {frame}")


def bencher(device: str):
    """``triton.testing.do_bench`` (milliseconds, the median after a warm-up), or on the CPU (--quick: the
    interpreter) one timed call."""
    if device != "cpu":
        from triton.testing import do_bench  # noqa: PLC0415
        return do_bench

    def once(fn) -> float:
        start = time.perf_counter()
        fn()
        return (time.perf_counter() - start) * 1e3
    return once


def kernel_times(T: int, B: int, max_delay: int, device: str, quick: bool = False) -> None:
    """The delay kernels alone, dense against event (medians of ``triton.testing.do_bench``), per input density:
    the forward and the taps' gradient (the two with an event kernel) of one DelayLinear layer of each shape
    (``quick``: two densities, layers 24 -> 8 and 8 -> 8)."""
    do_bench = bencher(device)
    densities = (0.05, 0.2) if quick else (0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2)
    shapes = ((24, 8), (8, 8)) if quick else ((SIZES[0], SIZES[1]), (SIZES[1], SIZES[2]))
    print("| layer | input density | forward dense (ms) | forward events (ms) | taps dense (ms) | taps events (ms) |")
    print("|---|---|---|---|---|---|")
    g = torch.Generator(device).manual_seed(0)
    for inputs, outputs in shapes:
        a, c = (torch.rand(outputs, inputs, generator=g, device=device) for _ in range(2))
        k = torch.randint(max_delay, (outputs, inputs), generator=g, device=device, dtype=torch.int32)
        grad = torch.randn(T, B, outputs, generator=g, device=device)
        for density in densities:
            xs = (torch.rand(T, B, inputs, generator=g, device=device) < density).float()
            by_step, by_input = delay_kernels.list_events(xs, delay_kernels.count_events(xs), True, True)
            ms = [do_bench(lambda listed=listed: delay_kernels.linear_forward(xs, a, c, k, None, T, 0, max_delay + 1,
                                                                            listed))
                  for listed in (None, by_step)]
            ms += [do_bench(lambda source=source: delay_kernels.linear_grad_taps(grad, source, k, 0, max_delay + 1))
                   for source in (xs, by_input)]
            print(f"| {inputs} -> {outputs} | {density} | " + " | ".join(f"{m:.2f}" for m in ms) + " |", flush=True)


def kernel_constants(names: tuple[str, ...], values: Iterable[tuple]) -> Iterator[tuple]:
    """Sets the ``delay_kernels`` constants ``names`` to each tuple of ``values`` in turn, yielding it, and restores
    them when the loop ends or leaves."""
    saved = [getattr(delay_kernels, name) for name in names]
    try:
        for value in values:
            for name, v in zip(names, value):
                setattr(delay_kernels, name, v)
            yield value
    finally:
        for name, v in zip(names, saved):
            setattr(delay_kernels, name, v)


BLOCKS = ((128, 16), (128, 32), (64, 32), (32, 32), (32, 64), (32, 128), (64, 64))  # (outputs, steps) for --blocks


def forward_blocks(T: int, B: int, max_delays: list[int], device: str, quick: bool = False) -> None:
    """The event forward of the first layer (700 -> 256) alone (medians of ``triton.testing.do_bench``) in blocks
    of each shape of ``BLOCKS``, per input density and longest delay (``quick``: 24 -> 8, two shapes, one run)."""
    do_bench = bencher(device)
    inputs, outputs = (24, 8) if quick else SIZES[:2]
    shapes = BLOCKS[-2:] if quick else BLOCKS
    print("| input density | longest delay | " + " | ".join(f"{j} x {t} (ms)" for j, t in shapes) + " |")
    print("|---|---|" + "---|" * len(shapes))
    g = torch.Generator(device).manual_seed(0)
    for density in (0.01, 0.02):
        xs = (torch.rand(T, B, inputs, generator=g, device=device) < density).float()
        events, _ = delay_kernels.list_events(xs, delay_kernels.count_events(xs), True, False)
        for max_delay in max_delays:
            a, c = (torch.rand(outputs, inputs, generator=g, device=device) for _ in range(2))
            k = torch.randint(max_delay + 1, (outputs, inputs), generator=g, device=device, dtype=torch.int32)
            ms = [do_bench(lambda: delay_kernels.linear_forward(xs, a, c, k, None, T, 0, max_delay + 1, events))
                  for _ in kernel_constants(("EVENT_OUTPUTS", "EVENT_STEPS"), shapes)]
            print(f"| {density} | {max_delay} | " + " | ".join(f"{m:.2f}" for m in ms) + " |", flush=True)


def layer_times(T: int, B: int, max_delays: list[int], density: float, device: str, quick: bool = False,
                graph: bool = False) -> None:
    """Each delay layer alone, DelayLinear against ``Dcls1d`` (if installed): one forward and backward (medians of
    ``triton.testing.do_bench``) of the layers 700 -> 256 (input spikes, no input gradient) and 256 -> 256 (input
    spikes with their gradient, as a hidden layer's) at each longest delay, against a random output gradient; the
    gradients add up over the timed calls, in both (``quick``: 24 -> 8 and 8 -> 8, the torch backend). ``graph``:
    each captured as a CUDA graph and replayed (``graph_replay_ms``)."""
    do_bench = graph_replay_ms if graph else bencher(device)
    try:
        import DCLS  # noqa: F401, PLC0415 (optional peer)
        have_dcls = True
    except ImportError:
        have_dcls = False
    shapes = ((24, 8, False), (8, 8, True)) if quick else ((SIZES[0], SIZES[1], False), (SIZES[1], SIZES[2], True))
    print("| layer | longest delay | DelayLinear forward + backward (ms) | Dcls1d forward + backward (ms) | speed-up |")
    print("|---|---|---|---|---|")
    g = torch.Generator("cpu").manual_seed(0)
    for inputs, outputs, input_grad in shapes:
        x = (torch.rand(T, B, inputs, generator=g, device="cpu") < density).float().to(device)
        x.requires_grad_(input_grad)
        grad = torch.randn(T, B, outputs, generator=g, device="cpu").to(device)
        for max_delay in max_delays:
            torch.manual_seed(0)
            ours = flexsn_dsl.DelayLinear(inputs, outputs, max_delay, backend="torch" if quick else "auto").to(device)
            times = [do_bench(lambda: ours(x).backward(grad))]
            if have_dcls:
                size = dcls_size(max_delay)
                theirs = dcls_layer(inputs, outputs, size).to(device)
                gt = grad.permute(1, 2, 0)
                times.append(do_bench(lambda: theirs(dcls_input(x, size)).backward(gt)))
            theirs_text = f"{times[1]:.3f} | {times[1] / times[0]:.1f}x" if len(times) > 1 else "not installed | "
            print(f"| {inputs} -> {outputs} | {max_delay} | {times[0]:.3f} | {theirs_text} |", flush=True)


LISTING = ((1, 1), (1, 2), (1, 4), (2, 1), (4, 1), (8, 1), (16, 1), (16, 2), (16, 4), (32, 4))  # (steps, warps)


def listing_shapes(T: int, B: int, max_delay: int, density: float, device: str, quick: bool = False) -> None:
    """``list_events`` of the first layer's input (``max_delay`` steps of history first) in tiles of each shape of
    ``LISTING`` (steps x warps: ``LIST_STEPS``, ``LIST_WARPS``), both lists and each alone (medians of
    ``triton.testing.do_bench``), and whether the lists equal those of the package's shape; ``quick``: 24 inputs,
    one shape, one run."""
    do_bench = bencher(device)
    inputs, shapes = (24, [(2, 1)]) if quick else (SIZES[0], LISTING)
    g = torch.Generator(device).manual_seed(0)
    xs = (torch.rand(T + max_delay, B, inputs, generator=g, device=device) < density).float()
    counts = delay_kernels.count_events(xs)
    want = delay_kernels.list_events(xs, counts, True, True)
    print(f"input {tuple(xs.shape)}, {counts.count} events; counting them: "
          f"{do_bench(lambda: delay_kernels.count_events(xs)):.3f} ms")
    print("| tile (steps x warps) | both lists (ms) | by-step list alone | by-input list alone | the same lists |")
    print("|---|---|---|---|---|")
    for steps, warps in kernel_constants(("LIST_STEPS", "LIST_WARPS"), shapes):
        got = delay_kernels.list_events(xs, counts, True, True)
        same = all(torch.equal(u, v) for lists in zip(got, want) for u, v in zip(*(k[:4] for k in lists)))
        ms = [do_bench(lambda asked=asked: delay_kernels.list_events(xs, counts, *asked))
              for asked in ((True, True), (True, False), (False, True))]
        print(f"| {steps} x {warps} | " + " | ".join(f"{m:.3f}" for m in ms) + f" | {'yes' if same else 'NO'} |",
              flush=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-delays", type=int, nargs="+", default=[64, 256, 512])
    parser.add_argument("-T", type=int, default=1127)
    parser.add_argument("-B", type=int, default=256)
    parser.add_argument("--density", type=float, default=0.01, help="input spikes per step and channel")
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--gain", type=float, default=1.0, help="DelayLinear's initial weights times this")
    parser.add_argument("--event-density", type=float, default=None,
                        help="DelayLinear's event kernels up to this input density (0: dense only, 1: events only)")
    parser.add_argument("--profile", action="store_true", help="where a flexsn-dsl step's time goes, per delay")
    parser.add_argument("--kernels", action="store_true",
                        help="the kernels alone, dense against event, per input density (at the first longest delay)")
    parser.add_argument("--blocks", action="store_true",
                        help="the event forward of the first layer alone in blocks of several shapes")
    parser.add_argument("--layers", action="store_true",
                        help="each delay layer alone (forward and backward), DelayLinear against Dcls1d")
    parser.add_argument("--listing", action="store_true",
                        help="the first layer's events listed in tiles of several shapes (at the first longest delay)")
    parser.add_argument("--memory", action="store_true",
                        help="what is live at a step's peak of GPU memory, by where it was allocated (CUDA only)")
    parser.add_argument("--cuda-graph", action="store_true",
                        help="the training step (or with --layers each layer's call) captured as one CUDA graph and "
                             "replayed, in both implementations (CUDA only)")
    parser.add_argument("--compile", nargs="?", const="inductor", metavar="BACKEND",
                        help="each network compiled with torch.compile(fullgraph=True), with this backend "
                             "(default inductor), in both implementations")
    parser.add_argument("--quick", action="store_true", help="CPU-sized: T=20, B=4, delay 8")
    args = parser.parse_args(argv)
    if args.quick:
        args.T, args.B, args.max_delays, args.repeat = 20, 4, [8], 1
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.cuda_graph and device != "cuda":
        parser.error("--cuda-graph captures CUDA graphs: it needs a GPU")
    if args.cuda_graph and args.compile:
        parser.error("--cuda-graph and --compile time two ways of running a step: give one")
    if args.event_density is not None:
        delay_kernels.EVENT_FORWARD = delay_kernels.EVENT_TAPS = args.event_density
    g = torch.Generator().manual_seed(0)
    x = (torch.rand(args.T, args.B, SIZES[0], generator=g, device="cpu") < args.density).float().to(device)
    labels = torch.randint(SIZES[-1], (args.B,), generator=g, device="cpu").to(device)
    print(f"{torch.cuda.get_device_name() if device == 'cuda' else 'cpu'}: T={args.T}, B={args.B}, "
          f"{' -> '.join(map(str, SIZES))} LIF, input density {args.density}, event kernels up to density "
          f"{delay_kernels.EVENT_FORWARD} (forward, times the cost of its events per event added) and "
          f"{delay_kernels.EVENT_TAPS} (tap gradients)")
    if args.kernels:
        return kernel_times(args.T, args.B, args.max_delays[0], device, args.quick)
    if args.layers:
        return layer_times(args.T, args.B, args.max_delays, args.density, device, args.quick, args.cuda_graph)
    if args.blocks:
        return forward_blocks(args.T, args.B, args.max_delays, device, args.quick)
    if args.listing:
        return listing_shapes(args.T, args.B, args.max_delays[0], args.density, device, args.quick)
    if args.memory:
        if device != "cuda":
            parser.error("--memory reads the CUDA allocator's history: it needs a GPU")
        for max_delay in args.max_delays:
            print(f"longest delay {max_delay}:")
            memory(DelayNet(max_delay, "auto", args.gain).to(device), x, labels)
        return
    if args.profile:
        for max_delay in args.max_delays:
            print(f"longest delay {max_delay}:")
            profile(DelayNet(max_delay, "auto", args.gain).to(device), x, labels, warmup=1 if args.quick else 3)
        return
    torch.manual_seed(0)
    densities = input_densities(DelayNet(args.max_delays[0], "auto", args.gain).to(device), x)
    print(f"gain {args.gain}: the DelayLinear layers' input densities {', '.join(f'{d:.4f}' for d in densities)}")
    print("| longest delay | implementation | step (ms) | epoch of 8,156 (s) | peak memory (GB) |")
    print("|---|---|---|---|---|")
    for max_delay in args.max_delays:
        kinds = {"flexsn-dsl DelayLinear": lambda d, backend: DelayNet(d, backend, args.gain)}
        try:
            import DCLS  # noqa: F401, PLC0415
            kinds["dcls Dcls1d"] = DclsNet
        except ImportError:
            print(f"| {max_delay} | dcls Dcls1d | not installed (pip install dcls) | | |")
        for name, cls in kinds.items():
            gc.collect()  # (each from an empty allocator: what the run before left cached is not this one's)
            if device == "cuda":
                torch.cuda.empty_cache()
            torch.manual_seed(0)
            try:
                seconds, peak = step_time(cls(max_delay, "auto").to(device), x, labels, args.repeat, args.cuda_graph,
                                          args.compile)
            except RuntimeError as error:  # (a step that fails, a capture or out of memory: said in the table)
                print(f"| {max_delay} | {name} | failed: {str(error).splitlines()[0][:120]} | | |", flush=True)
                continue
            epoch = seconds * SHD_TRAIN / args.B
            print(f"| {max_delay} | {name} | {seconds * 1e3:.1f} | {epoch:.1f} | {peak / 1e9:.2f} |", flush=True)


if __name__ == "__main__":
    main()
