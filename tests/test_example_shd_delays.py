"""examples/shd_delays.py: SHD's events binned into steps as the data set defines them, read from files of SHD's
layout, and the training loop on SHD-shaped random data (a CPU smoke run of the GPU benchmark's script)."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import shd_delays  # noqa: E402


def events(seed: int, n: int) -> tuple[list, list]:
    g = np.random.default_rng(seed)
    sizes = g.integers(0, 60, n)
    return ([np.sort(g.uniform(0, 0.05, k)) for k in sizes], [g.integers(0, 700, k).astype(np.uint16) for k in sizes])


def by_hand(times, units, steps: int, dt: float) -> np.ndarray:
    x = np.zeros((steps, len(times), 700))
    for b, (ts, us) in enumerate(zip(times, units)):
        for t, u in zip(ts, us):
            if int(np.floor(t / dt)) < steps:  # step floor(t / dt)
                x[int(np.floor(t / dt)), b, u] = 1
    return x


def test_binning_drops_late_spikes_and_caps_counts_at_one():
    times, units = events(0, 5)
    times[0] = np.array([0.0, 0.0004, 0.0011, 0.0299, 0.03, 0.049])  # two in one step, one on a step's edge, late ones
    units[0] = np.array([3, 3, 4, 5, 6, 7], dtype=np.uint16)
    x = shd_delays.bin_events(times, units, 30, 1e-3, torch.device("cpu"))
    np.testing.assert_array_equal(x.numpy(), by_hand(times, units, 30, 1e-3))
    assert x[0, 0, 3] == 1 and x[1, 0, 4] == 1 and x[29, 0, 5] == 1 and x[:, 0, 6:8].sum() == 0


def test_reads_files_of_shds_layout(tmp_path):
    h5py = pytest.importorskip("h5py")
    times, units = events(1, 4)
    with h5py.File(tmp_path / "shd_test.h5", "w") as f:
        f.create_dataset("spikes/times", data=np.array(times, dtype=object), dtype=h5py.vlen_dtype(np.float32))
        f.create_dataset("spikes/units", data=np.array(units, dtype=object), dtype=h5py.vlen_dtype(np.uint16))
        f.create_dataset("labels", data=np.array([3, 1, 19, 0], dtype=np.uint16))
    t, u, labels = shd_delays.read_shd(tmp_path / "shd_test.h5")
    assert labels.tolist() == [3, 1, 19, 0]
    x = shd_delays.bin_events(t, u, 40, 1e-3, torch.device("cpu"))
    np.testing.assert_array_equal(x.numpy(), by_hand([a.astype(np.float32) for a in times], units, 40, 1e-3))


def test_trains_on_random_data_of_shds_shapes(capsys):
    seconds = shd_delays.main(["--samples", "12", "--batch", "6", "--steps", "25", "--hidden", "6", "--max-delay", "5",
                               "--epochs", "2", "--rate", "20", "--device", "cpu"])
    out = capsys.readouterr().out
    assert len(seconds) == 2  # one wall time an epoch
    assert "RANDOM data of SHD shapes: 12 training samples, 25 steps of 1 ms" in out and "epoch 2:" in out
    losses = [float(line.split("loss ")[1].split(",")[0]) for line in out.splitlines() if line.startswith("epoch")]
    assert all(np.isfinite(losses)) and losses[0] != losses[1]  # the delays and weights moved


def test_delay_bench_runs_on_the_cpu(capsys, monkeypatch, fresh_dynamo):
    """benchmarks/delay_bench.py's CPU smoke run: the layers' input densities it reports are those of its input and
    of hidden layers made active by --gain, and the table, the profile, the kernels' timings, the listing's in
    each shape and each layer's alone print (the GPU session's commands), also the step of the network compiled as
    one graph; --cuda-graph is refused without a GPU."""
    from flexsn_dsl import delay_kernels
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import delay_bench
    for name in ("EVENT_FORWARD", "EVENT_TAPS"):  # (restored: --event-density sets them)
        monkeypatch.setattr(delay_kernels, name, getattr(delay_kernels, name))
    delay_bench.main(["--quick", "--gain", "16", "--event-density", "0.5"])
    out = capsys.readouterr().out
    densities = next(line for line in out.splitlines() if line.startswith("gain 16.0"))
    values = [float(v) for v in densities.split("densities ")[1].split(", ")]
    assert len(values) == 3 and 0.005 < values[0] < 0.02 and all(v > 0 for v in values[1:])
    assert "event kernels up to density 0.5 (forward" in out and "| 8 | flexsn-dsl DelayLinear |" in out
    delay_bench.main(["--quick", "--profile"])
    out = capsys.readouterr().out
    assert "longest delay 8:" in out and "aten::" in out
    delay_bench.main(["--quick", "--kernels"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if "->" in line and "| 0." in line]
    assert [(r[0].strip(), float(r[1])) for r in rows] == [("24 -> 8", 0.05), ("24 -> 8", 0.2),
                                                             ("8 -> 8", 0.05), ("8 -> 8", 0.2)]
    assert all(float(v) > 0 for r in rows for v in r[2:])
    blocks = delay_kernels.EVENT_OUTPUTS, delay_kernels.EVENT_STEPS
    delay_bench.main(["--quick", "--blocks"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| 0.0")]
    assert [(float(r[0]), int(r[1])) for r in rows] == [(0.01, 8), (0.02, 8)] and all(len(r) == 4 for r in rows)
    assert (delay_kernels.EVENT_OUTPUTS, delay_kernels.EVENT_STEPS) == blocks  # (restored)
    shape = delay_kernels.LIST_STEPS, delay_kernels.LIST_WARPS
    delay_bench.main(["--quick", "--listing"])
    out = capsys.readouterr().out
    rows = [line.split("|")[1:-1] for line in out.splitlines() if line.startswith("| ") and line[2].isdigit()]
    assert [(r[0].strip(), r[-1].strip()) for r in rows] == [("2 x 1", "yes")]  # (equal to the lists in 1 x 1)
    assert "input (28, 4, 24)" in out and (delay_kernels.LIST_STEPS, delay_kernels.LIST_WARPS) == shape
    delay_bench.main(["--quick", "--layers"])
    rows = [line.split("|")[1:-1] for line in capsys.readouterr().out.splitlines() if line.startswith("| ") and
            "->" in line]
    assert [(r[0].strip(), int(r[1])) for r in rows] == [("24 -> 8", 8), ("8 -> 8", 8)]
    assert all(float(r[2]) > 0 for r in rows)
    delay_bench.main(["--quick", "--compile", "eager"])  # (dynamo's capture alone: the compiled graph runs eagerly)
    row = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("| 8 | flexsn-dsl"))
    assert float(row.split("|")[3]) > 0
    if not torch.cuda.is_available():  # (CUDA graphs: refused on the CPU, with the reason)
        with pytest.raises(SystemExit):
            delay_bench.main(["--quick", "--cuda-graph"])
        assert "--cuda-graph captures CUDA graphs: it needs a GPU" in capsys.readouterr().err


def test_delay_bench_memory_finds_the_blocks_live_at_the_peak(monkeypatch):
    """--memory's reading of the allocator's history: the peak above the start, and what is live there grouped by
    the first frame in the package (a free of a block allocated before the history is not counted)."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import delay_bench

    def frames(*where):
        return [{"filename": f"/x/{path}", "line": line, "name": "f"} for path, line in where]
    kernels, module = ("flexsn_dsl/delay_kernels.py", 10), ("flexsn_dsl/delays.py", 20)
    events = [{"action": "free_completed", "addr": 99, "size": 1000},  # (allocated before the history)
              {"action": "alloc", "addr": 1, "size": 300, "frames": frames(("torch/x.py", 1), kernels, module)},
              {"action": "alloc", "addr": 2, "size": 200, "frames": frames(module)},
              {"action": "alloc", "addr": 3, "size": 50, "frames": frames(kernels)},
              {"action": "free_completed", "addr": 1, "size": 300},
              {"action": "alloc", "addr": 4, "size": 100, "frames": frames(("torch/y.py", 2))},
              {"action": "free_completed", "addr": 3, "size": 50}]
    peak, groups = delay_bench.peak_blocks(events)
    assert peak == 550
    assert groups == [("delay_kernels.py:10 f", 350, 2), ("delays.py:20 f", 200, 1)]


def test_delay_bench_idle_gaps_between_overlapping_kernels(monkeypatch):
    """--profile's idle time of the GPU: kernels that overlap count once as busy; a gap is measured from the end of
    the last kernel that ran before it (not the last one started), named by the kernels around it and when it
    starts, and given the host's CUDA calls and garbage collections of at least ``least`` microseconds that overlap
    it, longest first, and the two innermost other host spans that hold all of it."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import delay_bench
    host = [(62, 95, "cudaMalloc"), (58, 61, "cudaLaunchKernel"), (57, 70, "cudaFree"), (12, 19, "cudaMalloc"),
            (110, 150, "cudaStreamSynchronize"), (0, 200, "step"), (55, 101, "node"), (61, 99, "inner"),
            (5, 40, "op")]
    text = delay_bench.idle_gaps([(100, 110, "d"), (0, 10, "a"), (30, 50, "b"), (35, 40, "c"), (55, 60, "e")],
                                 host, least=10)
    lines = text.splitlines()
    assert lines[0].startswith("device busy 0.04 ms of 0.11 ms") and "idle 0.07 ms, 0.06 ms of it in 2 gaps" in lines[0]
    assert [line.split() for line in lines[1:]] == [  # ("inner" does not hold the whole gap: not named)
        ["40.0", "us", "at", "0.06", "ms", "after", "e", "before", "d;", "host:", "cudaMalloc", "33", "us,", "cudaFree",
         "13", "us;", "in", "node", "<", "step"],
        ["20.0", "us", "at", "0.01", "ms", "after", "a", "before", "b;", "host:", "nothing", "recorded;", "in", "op",
         "<", "step"]]
    assert delay_bench.idle_gaps([]) == "no device events recorded"


def test_delay_bench_profiles_garbage_collections(monkeypatch):
    """--profile records each garbage collection in its block as a span named by the oldest generation it
    collects (what idle_gaps names in a gap), and none after the block."""
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "benchmarks"))
    import gc

    import delay_bench
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        with delay_bench.collections_profiled():
            gc.collect(1)
            gc.collect(2)
        gc.collect(0)
    names = [e.name for e in prof.events() if e.name.startswith("gc gen")]
    assert names == ["gc gen1", "gc gen2"]
