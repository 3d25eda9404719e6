"""``flexsn-dsl bench``: our kernels against a bare launch, torch loops, torch.compile and SpikingJelly.

Every case is timed in one process: ``triton.testing.do_bench`` medians after
warm-up on CUDA, and medians of CUDA-graph replays (:func:`graph_replay_ms`)
(perf_counter medians on the CPU, where "ours" runs in Triton's interpreter and
the numbers only show that the command works). The memory
floor is the bytes a call must move (:func:`floor_bytes`) over the copy
bandwidth measured in the same run.
"""
from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

from .console import (UsageError, add_spec_options, at_least, check_size_names, parse_params, parse_sizes,
                      refuse_overwriting_inputs)

DTYPES = ("float32", "bfloat16", "float16", "float64")
MODES = ("inference", "training")
PEERS = ("minimal", "torch", "compile", "spikingjelly")
COMPILE_MAX_T = 16  # torch.compile unrolls the time loop and FlexSN traces it: compile time grows with T
# --long: few neurons over many steps (issue 27), as (T, one step's shape, modes); batch-1 streaming in inference
LONG = ((100, (65536,), MODES), (500, (65536,), MODES), (500, (8192,), MODES), (1000, (8192,), MODES),
        (4096, (4096,), MODES), (10000, (4096,), ("inference",)), (1000, (1, 256), ("inference",)))


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("specs", nargs="+", metavar="SPEC", help="spec files")
    parser.add_argument("-T", "--steps", type=int, nargs="+", default=None, help="sequence lengths (default 8)")
    parser.add_argument("-n", "--neurons", type=int, nargs="+", default=None,
                        help="neurons per step (default: 4194304 on CUDA, 4096 on CPU)")
    parser.add_argument("--long", action="store_true",
                        help="instead of -T and -n, the long sequences with few neurons: " +
                             ", ".join(f"{math.prod(shape)} x T={T}" + ("" if len(modes) == 2 else f" ({modes[0]})")
                                       for T, shape, modes in LONG) + " (the last: batch-1 streaming)")
    parser.add_argument("--dtype", nargs="+", default=["float32"], choices=DTYPES)
    parser.add_argument("--mode", nargs="+", default=list(MODES), choices=MODES)
    parser.add_argument("--peers", nargs="*", default=list(PEERS), choices=PEERS,
                        help="what to compare with (default: all available): minimal (a bare autograd.Function "
                             "launching the same kernels with no checks: the host floor), torch (the generated torch "
                             "step in a loop), compile (that loop under torch.compile), spikingjelly (LIF specs)")
    parser.add_argument("--compile-max-T", type=int, default=COMPILE_MAX_T, metavar="T",
                        help="skip the peers whose compilation grows with T (torch.compile unrolls the time loop, "
                             f"SpikingJelly's FlexSN traces it: minutes at T=64) above this T (default {COMPILE_MAX_T})")
    parser.add_argument("--first-call", action="store_true",
                        help="also time the first call (kernel generation + compilation) in a fresh process, "
                             "and the first call with warm caches")
    parser.add_argument("--rounds", type=int, default=1,
                        help="time every implementation of a case this many times, in turn, and report the median "
                             "(the spread in the JSON): a host whose speed drifts then affects all alike (default 1)")
    parser.add_argument("--recompute", action="store_true",
                        help="also train with recompute=True (the row 'flexsn-dsl recompute': states computed again "
                             "in the backward from per-chunk checkpoints; diff: its largest gradient difference from "
                             "the saving path's). On CUDA every training row of ours reports the memory its forward "
                             "pass holds when it returns, in MiB and over its outputs' bytes")
    parser.add_argument("--device", default="auto", help="cuda, cpu or auto")
    parser.add_argument("--json", metavar="FILE", help="append the results to this JSON file")
    add_spec_options(parser)
    parser.add_argument("--shape", type=int, nargs="+", default=None, metavar="D",
                        help="the shape of one step of the input (e.g. 32 128 32 32), instead of -n neurons: "
                             "needed by a spec whose parameters have a shape")


@dataclass
class Result:
    spec: str
    impl: str
    mode: str
    dtype: str
    T: int
    neurons: int
    ms: float | None = None          # eager call, median
    graph_ms: float | None = None    # CUDA-graph replay, median (no Python overhead)
    floor_ms: float | None = None
    peak_mib: float | None = None
    host_ms: float | None = None     # host (Python + launch) time of one call, not waiting for the GPU
    max_abs_diff: float | None = None
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def ratio(self) -> float | None:
        best = self.graph_ms or self.ms
        return best / self.floor_ms if best and self.floor_ms else None


def graph_replay_ms(fn: Callable, replays: int = 20, rounds: int = 7) -> float:
    """Median GPU time of one call of ``fn`` replayed from a CUDA graph, by PyTorch's recipe for
    capturing autograd: warm-up calls on a side stream that waits for the caller's stream, then
    one call captured (its tensors in the graph's own pool, whatever the call allocates), then
    ``rounds`` times ``replays`` replays between CUDA events. Raises what the capture raises."""
    import torch
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(3):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(rounds):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(replays):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) / replays)
    graph.reset()
    return statistics.median(times)


def _timer(device, repeats: int = 5, warmup_ms: int = 50, rep_ms: int = 200) -> Callable[[Callable], float]:
    """Median milliseconds of a call of ``fn``: on CUDA triton's ``do_bench`` (``warmup_ms`` of
    warm-up calls, then ``rep_ms`` of timed ones), elsewhere the wall clock of ``repeats`` calls
    after one warm-up call."""
    if device.type == "cuda":
        from triton.testing import do_bench
        return lambda fn: do_bench(fn, warmup=warmup_ms, rep=rep_ms, return_mode="median")

    def cpu(fn) -> float:
        fn()
        times = []
        for _ in range(repeats):
            start = time.perf_counter()
            fn()
            times.append((time.perf_counter() - start) * 1e3)
        return statistics.median(times)
    return cpu


def host_ms(device, fn, calls: int = 20, warmup: int = 0) -> float | None:
    """Median host time of one call without waiting for the GPU (but every 20 calls, to keep the
    launch queue short): the Python and launch cost that bounds an eager call when it exceeds
    the kernels' time."""
    import torch
    if device.type != "cuda":
        return None
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    times = []
    for k in range(1, calls + 1):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
        if k % 20 == 0:
            torch.cuda.synchronize()
    torch.cuda.synchronize()
    return statistics.median(times)


def copy_bandwidth(device) -> float:
    """Bytes per second of a large device copy (read + write counted)."""
    import torch
    n = (1 << 28) if device.type == "cuda" else (1 << 22)
    a = torch.empty(n, dtype=torch.float32, device=device).uniform_()
    b = torch.empty_like(a)
    ms = _timer(device)(lambda: b.copy_(a))
    return 2 * a.numel() * 4 / (ms * 1e-3)


def floor_bytes(info, T: int, n: int, itemsize: int, mode: str) -> int:
    """The floor of a call from reset states, in bytes: each input read and each output written
    once (the final states too; the initial states read only where they are not constants);
    training adds the output gradients read, the input gradients written and one saved tensor
    per state written and read back (a spec whose backward needs fewer values moves less)."""
    seq, states = T * n * itemsize, info.num_states * n * itemsize
    total = seq * (info.num_inputs + info.num_outputs) + states + (0 if info.initial_values else states)
    if mode == "training":
        total += seq * (info.num_inputs + info.num_outputs + 2 * info.num_states)
    return total


def _peak(device, fn) -> float | None:
    import torch
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - base) / 2 ** 20


def held_after_forward(device, module, xs) -> tuple[float, float] | None:
    """What a training forward call of ``module`` from reset states leaves allocated when it returns (its
    outputs and final states, and what it keeps for the backward): MiB, and over its outputs' bytes (None
    off CUDA)."""
    import torch
    if device.type != "cuda":
        return None
    module.reset()
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    ys = module(*xs)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - base
    ys = ys if isinstance(ys, tuple) else (ys,)
    output_bytes = sum(y.numel() * y.element_size() for y in ys)
    del ys
    module.reset()
    return held / 2 ** 20, held / output_bytes


def _inside(context: Callable, fn: Callable) -> Callable:
    """``fn`` called inside a fresh ``context()`` each time."""
    def call(*args):
        with context():
            return fn(*args)
    return call


def _runner(module, xs, mode: str, forward_in: Callable | None = None, upstream: list | None = None):
    """A call of ``module`` from reset states (training: then the gradients of the inputs and learnable
    parameters). ``forward_in``: a context (e.g. autocast) each call's forward runs in, made afresh per
    call; the backward runs outside it, as in a training step. ``upstream``: the outputs' gradients
    (random ones, drawn at the first call, where it is empty: a list two runners can share)."""
    import torch
    params = [p for p in module.parameters() if p.requires_grad]
    call = module if forward_in is None else _inside(forward_in, module)
    if mode == "inference":
        def run():
            module.reset()
            with torch.no_grad():
                return call(*xs)
        return run
    grads = [] if upstream is None else upstream

    def run():
        module.reset()
        ys = call(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        if not grads:
            grads.extend(torch.randn_like(y) for y in ys)
        return torch.autograd.grad(ys, [*xs, *params], grads, allow_unused=True)
    return run


def _seeded(fn: Callable, device) -> object:
    """``fn()`` with torch's generators seeded (restored afterwards): a noisy spec's calls draw the same numbers."""
    import torch
    with torch.random.fork_rng([device] if device.type == "cuda" else []):
        torch.manual_seed(0)
        return fn()


def minimal_runner(module, xs, mode: str, forward_in: Callable | None = None) -> Callable | None:
    """The host floor: the spec's fused kernels launched by a bare autograd.Function (inference:
    a bare launch) with no checks, the launch arguments computed once for these inputs (which
    must be contiguous); a call from reset states; ``forward_in`` as for :func:`_runner`. None for
    a spec whose kernels take more than inputs (runtime parameters, initial states that are not constants,
    a seed for draws).
    ``mode`` "function": the Function's ``apply`` itself (inputs to outputs, no final states), for a network."""
    import torch

    from .triton_plan import _kernels
    from .triton_settings import launch_settings
    info = module.info
    if info.param_names or info.shaped_names or not info.initial_values or info.draws:
        return None
    x = xs[0]
    plan = _kernels(module._compiled, x.device.type).plan(x.shape, x.dtype, launch_settings())
    T, n, step, kw = plan.T, plan.n, plan.step, plan.const_init
    n_out, n_saved, n_st = info.num_outputs, len(info.saved_names), info.num_states
    # (launched as Triton's documentation shows, ``kernel[grid](...)``: what a hand-written wrapper does)
    forward, inference, backward = (plan.kernels[v][plan.grid] for v in ("forward_final_state",
                                                                         "inference_final_state", "backward"))
    kw_backward = plan.backward_flags[False, False, False]

    class Minimal(torch.autograd.Function):
        @staticmethod
        def forward(ctx, *xs):
            outs = [torch.empty_like(xs[0]) for _ in range(n_out)]
            saved = [torch.empty_like(xs[0]) for _ in range(n_saved)]
            finals = [xs[0].new_empty(step) for _ in range(n_st)]
            forward(*xs, *finals, *outs, *saved, *finals, T, n, **kw)
            ctx.save_for_backward(*xs, *outs, *saved)
            return tuple(outs)

        @staticmethod
        def backward(ctx, *grads):
            tensors = ctx.saved_tensors
            n_in = len(tensors) - n_out - n_saved
            xs, outs, saved = tensors[:n_in], tensors[n_in:n_in + n_out], tensors[n_in + n_out:]
            grads = [g if g.is_contiguous() else g.contiguous() for g in grads]  # (as the kernels read them)
            grad_x = [torch.empty_like(x) for x in xs]
            unused = [grad_x[0]] * n_st
            backward(*grads, *unused, *unused, *saved, *xs, *outs, *grad_x, *unused, T, n, **kw_backward)
            return tuple(grad_x)

    if mode == "function":
        if forward_in is not None:
            raise ValueError("minimal_runner: mode 'function' gives the Function itself; enter forward_in around its call")
        return Minimal.apply
    if mode == "inference":
        def run():
            with torch.no_grad():
                outs = [torch.empty_like(xs[0]) for _ in range(n_out)]
                finals = [xs[0].new_empty(step) for _ in range(n_st)]
                inference(*xs, *finals, *outs, *finals, T, n, **kw)
                return outs
        return run if forward_in is None else _inside(forward_in, run)
    grads = None
    apply = Minimal.apply if forward_in is None else _inside(forward_in, Minimal.apply)

    def run():
        nonlocal grads
        ys = apply(*xs)
        if grads is None:
            grads = [torch.randn_like(y) for y in ys]
        return torch.autograd.grad(ys, xs, grads)
    return run


def _tensors(values) -> list:
    import torch
    out = []
    for v in values if isinstance(values, (tuple, list)) else (values,):
        if isinstance(v, torch.Tensor):
            out.append(v.detach().float())
    return out


def _diff(a, b) -> float:
    return max((x - y).abs().max().item() for x, y in zip(_tensors(a), _tensors(b)) if x.numel()) if a is not None else 0.0


def _sj_lif(device):
    """SpikingJelly's LIFNode (it picks its fastest CUDA backend itself), for LIF rows."""
    from spikingjelly.activation_based import neuron, surrogate
    node = neuron.LIFNode(tau=2.0, v_threshold=1.0, v_reset=0.0, surrogate_function=surrogate.Sigmoid(alpha=4.0),
                          step_mode="m")
    return node.to(device)


def _sj_lif_core(x, v):
    """The LIF step written for SpikingJelly's FlexSN (its surrogate as a pure autograd function)."""
    from spikingjelly.activation_based import surrogate
    h = v + (x - v) / 2.0
    s = surrogate.sigmoid.apply(h - 1.0, 4.0)
    return s, h * (1.0 - s)


def _sj_flexsn_lif(device):
    from spikingjelly.activation_based import neuron
    return neuron.FlexSN(core=_sj_lif_core, num_states=1, step_mode="m").to(device)


def _sj_runner(node, xs, mode):
    import torch
    from spikingjelly.activation_based import functional
    if mode == "inference":
        def run():
            functional.reset_net(node)
            with torch.no_grad():
                return node(xs[0])
        return run
    g = torch.randn_like(xs[0])

    def run():
        functional.reset_net(node)
        y = node(xs[0])
        return torch.autograd.grad(y, xs, g)
    return run


def _first_call(spec: str, params: dict[str, float], plugins: list[str], T: int, shape: tuple[int, ...], dtype: str,
                device: str, cache: str, sizes: dict[str, int]) -> float:
    """Seconds from load() to the end of one inference and one training call, in a fresh process."""
    code = f"""
import time, torch, flexsn_dsl
x = torch.rand({T}, *{tuple(shape)!r}, device={device!r}, dtype=torch.{dtype}, requires_grad=True)
torch.cuda.synchronize() if x.is_cuda else None
start = time.perf_counter()
m = flexsn_dsl.load({spec!r}, params={params!r}, plugins={list(plugins)!r}, sizes={sizes!r}, backend="triton")
with torch.no_grad():
    m(*[x] * len(m.spec.inputs))
m.reset()
y = m(*[x] * len(m.spec.inputs))
y = y if isinstance(y, tuple) else (y,)
sum(v.sum() for v in y).backward()
torch.cuda.synchronize() if x.is_cuda else None
print(time.perf_counter() - start)
"""
    env = dict(os.environ, TRITON_CACHE_DIR=os.path.join(cache, "triton"), FLEXSN_DSL_CACHE=os.path.join(cache, "gen"))
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=600)
    if out.returncode != 0:
        raise RuntimeError(out.stderr.strip().splitlines()[-1] if out.stderr.strip() else "failed")
    return float(out.stdout.strip().splitlines()[-1])


def cases(args, device) -> list[tuple[int, tuple[int, ...], list[str]]]:
    """What ``run_bench`` times, in order: (T, one step's shape, modes): every -T with every -n (or
    --shape), or the --long cases in the modes asked for."""
    if args.long:
        return [(T, shape, [m for m in args.mode if m in modes]) for T, shape, modes in LONG
                if set(modes) & set(args.mode)]
    shapes = [tuple(args.shape)] if args.shape else \
        [(n,) for n in (args.neurons or [4 * 1024 * 1024 if device.type == "cuda" else 4096])]
    return [(T, shape, list(args.mode)) for T in args.steps or [8] for shape in shapes]


def run_bench(args) -> list[Result]:
    import torch

    from .runtime import load

    params, sizes = parse_params(args.param), parse_sizes(args.size)
    if sizes:
        from .compiler import compile_spec
        check_size_names(sizes, [compile_spec(spec, params=params, plugins=args.plugin).model for spec in args.specs])
    device = _device(args.device)
    timer = _timer(device)
    graph_timer = graph_replay_ms if device.type == "cuda" else None  # kernel time without Python launch overhead
    bandwidth = copy_bandwidth(device)
    launch = " ".join(f"{k}={v}" for k, v in launch_environment().items())
    print(f"device {torch.cuda.get_device_name(device) if device.type == 'cuda' else platform.processor() or 'cpu'}; "
          f"copy bandwidth {bandwidth / 1e12:.3f} TB/s{'; ' + launch if launch else ''}", file=sys.stderr)
    results: list[Result] = []
    for spec in args.specs:
        ours = load(spec, params=params, sizes=sizes, plugins=args.plugin, backend="triton").to(device)
        recomputing = load(spec, params=params, sizes=sizes, plugins=args.plugin, backend="triton",
                           recompute=True).to(device) if args.recompute else None
        reference = load(spec, params=params, sizes=sizes, plugins=args.plugin, backend="torch").to(device)
        info = ours.info
        name = ours.spec.name
        for dtype_name in args.dtype:
            dtype = getattr(torch, dtype_name)
            for T, shape, modes in cases(args, device):
                n = math.prod(shape)
                gen = torch.Generator(device=device).manual_seed(0)
                xs = [(torch.rand(T, *shape, device=device, generator=gen) * 1.5).to(dtype).requires_grad_()
                      for _ in info.input_names]
                for mode in modes:
                    floor_ms = floor_bytes(info, T, n, xs[0].element_size(), mode) / bandwidth * 1e3
                    impls: list[tuple[str, Callable | None, str]] = [("flexsn-dsl", _runner(ours, xs, mode), "")]
                    held = {}  # ours in training: the module, for the memory its forward pass holds
                    upstream: list = []  # the recompute row's output gradients, for its comparison
                    if mode == "training":
                        held["flexsn-dsl"] = ours
                        if recomputing is not None:
                            impls.append(("flexsn-dsl recompute", _runner(recomputing, xs, mode, upstream=upstream),
                                          ""))
                            held["flexsn-dsl recompute"] = recomputing
                    if "minimal" in args.peers:
                        minimal = minimal_runner(ours, xs, mode)
                        impls.append(("minimal Function", minimal, "" if minimal else
                                      "skipped: runtime parameters, initial states that are not constants or draws"))
                    if "torch" in args.peers:
                        impls.append(("torch loop", _runner(reference, xs, mode), ""))
                    if "compile" in args.peers:
                        if T > args.compile_max_T:
                            impls.append(("torch.compile", None, f"skipped: T > --compile-max-T {args.compile_max_T}"))
                        else:
                            compiled = torch.compile(_runner(reference, xs, mode))
                            impls.append(("torch.compile", compiled, ""))
                    if "spikingjelly" in args.peers and name == "lif":
                        for label, make in (("SJ LIFNode", lambda: _sj_lif(device)),
                                            ("SJ FlexSN", lambda: _sj_flexsn_lif(device))):
                            if label == "SJ FlexSN" and T > args.compile_max_T:
                                impls.append((label, None, f"skipped: T > --compile-max-T {args.compile_max_T}"))
                                continue
                            try:
                                impls.append((label, _sj_runner(make(), xs, mode), ""))
                            except Exception as exc:  # not installed, or fails on this setup
                                impls.append((label, None, f"unavailable: {type(exc).__name__}: {exc}"[:120]))
                    # (a spec with draws: the torch loop draws other numbers, no comparison)
                    expected = _runner(reference, xs, mode)() if mode == "inference" and not info.draws else None
                    timed: list[tuple[Result, Callable]] = []
                    for label, fn, note in impls:
                        r = Result(name, label, mode, dtype_name, T, n, floor_ms=floor_ms, note=note)
                        if fn is not None:
                            try:
                                start = time.perf_counter()
                                got = fn()
                                if device.type == "cuda":
                                    torch.cuda.synchronize()
                                r.extra["first_call_s"] = time.perf_counter() - start
                                if expected is not None:
                                    r.max_abs_diff = _diff(got, expected)
                                if label == "flexsn-dsl recompute":  # (the same draws for both)
                                    r.max_abs_diff = _diff(_seeded(fn, device),
                                                           _seeded(_runner(ours, xs, mode, upstream=upstream), device))
                                r.ms = timer(fn)
                                # a failed capture can poison the CUDA context (seen on the H200 with
                                # the eager torch loop and SpikingJelly in training): peers are
                                # graph-timed in inference only
                                if graph_timer is not None and (label == "flexsn-dsl" or mode == "inference"):
                                    try:
                                        r.graph_ms = graph_timer(fn)
                                    except Exception as exc:
                                        r.note += f" (no CUDA graph: {type(exc).__name__})"
                                r.peak_mib = _peak(device, fn)
                                memory = held_after_forward(device, held[label], xs) if label in held else None
                                if memory is not None:
                                    r.extra["held_mib"], r.extra["held_per_output"] = memory
                                r.host_ms = host_ms(device, fn)
                                timed.append((r, fn))
                            except Exception as exc:
                                r.note = f"failed: {type(exc).__name__}: {exc}"[:160]
                        results.append(r)
                    _more_rounds(timed, timer, args.rounds)
                    for r in results[len(results) - len(impls):]:
                        _print_row(r)
                if args.first_call and device.type == "cuda" and dtype_name == args.dtype[0]:
                    with tempfile.TemporaryDirectory() as cache:
                        cold = _first_call(spec, params, args.plugin, T, shape, dtype_name, str(device), cache,
                                           sizes)
                        warm = _first_call(spec, params, args.plugin, T, shape, dtype_name, str(device), cache,
                                           sizes)
                    r = Result(name, "flexsn-dsl first call", "inference+training", dtype_name, T, n,
                               note=f"cold {cold:.2f} s, cached {warm:.2f} s",
                               extra={"cold_s": cold, "cached_s": warm})
                    results.append(r)
                    _print_row(r)
    return results


def launch_environment() -> dict[str, str]:
    """The launch settings set in the environment (``FLEXSN_DSL_TIME_TILE`` and the others), as a run records them."""
    from .triton_settings import SETTINGS
    return {name: os.environ[name] for name in SETTINGS if os.environ.get(name)}


def _more_rounds(timed: list[tuple[Result, Callable]], timer: Callable[[Callable], float], rounds: int) -> None:
    """Time each implementation ``rounds - 1`` more times, in turn; each result's ``ms`` becomes the
    median over all rounds, the rounds kept in ``extra["ms_rounds"]``."""
    if rounds < 2:
        return
    times = {id(r): [r.ms] for r, _ in timed}
    for _ in range(rounds - 1):
        for r, fn in timed:
            times[id(r)].append(timer(fn))
    for r, _ in timed:
        r.extra["ms_rounds"] = times[id(r)]
        r.ms = statistics.median(times[id(r)])


def _print_row(r: Result) -> None:
    ms = f"{r.ms:9.4f}" if r.ms is not None else "        -"
    graph = f"{r.graph_ms:8.4f}" if r.graph_ms is not None else "       -"
    ratio = f"{r.ratio:5.2f}x" if r.ratio else "    -"
    floor = f"{r.floor_ms:8.4f}" if r.floor_ms else "       -"
    peak = f"{r.peak_mib:8.1f}" if r.peak_mib is not None else "       -"
    diff = f"{r.max_abs_diff:.1e}" if r.max_abs_diff is not None else "-"
    host = f"  host {r.host_ms:.3f} ms" if r.host_ms is not None else ""
    if "held_mib" in r.extra:
        host += f"  held {r.extra['held_mib']:.1f} MiB ({r.extra['held_per_output']:.2f}x outputs)"
    print(f"{r.spec:14s} {r.mode:10s} {r.dtype:9s} T={r.T:<5d} N={r.neurons:<8d} {r.impl:22s} {ms} ms (graph {graph})  "
          f"floor {floor} ms {ratio}  peak {peak} MiB  diff {diff}{host}  {r.note}", flush=True)


def _device(name: str):
    """The torch device ``--device`` names (auto: cuda where there is a GPU); a UsageError otherwise."""
    import torch
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        raise UsageError(f"--device {name!r} is not cuda, cuda:N, cpu or auto")
    if device.type == "cpu":
        from . import triton_runtime
        if not triton_runtime.interpreting():
            raise UsageError(f"--device {name!r}: our kernels run on CPU tensors only in Triton's interpreter, which "
                             "is off in this process (a GPU is present): give --device cuda, or run with "
                             "TRITON_INTERPRET=1")
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if not count:
            raise UsageError(f"--device {name!r}: no CUDA GPU is available here; give --device cpu or auto")
        try:
            torch.cuda.get_device_properties(device)  # also where device_count() counts GPUs this process cannot use
        except Exception:  # noqa: BLE001 (torch raises AssertionError, RuntimeError or AcceleratorError)
            raise UsageError(f"--device {name!r}: there are {count} GPU(s), cuda:0 to cuda:{count - 1}") from None
    return device


def _earlier_runs(path: Path) -> list:
    """The runs a ``--json`` file holds already (none when it does not exist); a UsageError when it
    is not a JSON list that an earlier bench wrote."""
    if not path.exists():
        if not path.parent.is_dir():
            raise UsageError(f"--json {str(path)!r}: the folder {str(path.parent)!r} does not exist")
        return []
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        reason = (exc.strerror if isinstance(exc, OSError) and exc.strerror else
                  f"invalid JSON at line {exc.lineno}, column {exc.colno}" if isinstance(exc, json.JSONDecodeError)
                  else "not UTF-8" if isinstance(exc, UnicodeDecodeError) else type(exc).__name__)
        raise UsageError(f"--json {str(path)!r} is not a JSON file bench can append to ({reason}): give a new "
                         "file or one an earlier bench wrote") from None
    if not isinstance(runs, list):
        raise UsageError(f"--json {str(path)!r} holds a JSON {'object' if isinstance(runs, dict) else 'value'}, not the list of runs bench "
                         "writes: give a new file or one an earlier bench wrote")
    return runs


def check_arguments(args) -> list:
    """Refuse bad options before any work (UsageError); returns the runs already in ``--json``."""
    if args.long and (args.steps or args.neurons or args.shape):
        raise UsageError("--long sets the steps and neurons of its cases itself: leave out -T, -n and --shape")
    for option, values in (("-T/--steps", args.steps or []), ("-n/--neurons", args.neurons or [])):
        for value in values:
            if value < 1:
                raise UsageError(f"{option} {value}: give whole numbers of at least 1")
    at_least("--rounds", args.rounds, 1)
    at_least("--compile-max-T", args.compile_max_T, 0)
    for value in args.shape or []:
        at_least("--shape", value, 1)
    refuse_overwriting_inputs({"--json": args.json}, [*args.specs, *args.plugin])
    _device(args.device)
    return _earlier_runs(Path(args.json)) if args.json else []


def main(args) -> int:
    import torch

    from .triton_settings import triton  # (Triton imported after the interpreter's switch, where there is no GPU)
    existing = check_arguments(args)
    results = run_bench(args)
    if args.json:
        path = Path(args.json)
        existing.append({
            "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
            "device": torch.cuda.get_device_name() if torch.cuda.is_available() else platform.processor(),
            "torch": torch.__version__, "triton": triton.__version__, "python": platform.python_version(),
            "argv": sys.argv[1:], "launch": launch_environment(),
            "results": [dict(asdict(r), ratio=r.ratio) for r in results]})
        path.write_text(json.dumps(existing, indent=1) + "\n")
    return 0
