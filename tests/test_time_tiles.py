"""Time tiles (issue 27): the kernels walk time in tiles of ``_TC`` steps, each tile's loads issued
before its steps run, then the last ``T % _TC`` steps one at a time. Every tile size gives the bits
of the step-at-a-time kernels (``FLEXSN_DSL_TIME_TILE=1``) and the torch backend's values, through
calls that carry states, for odd T, T shorter than a tile and T a multiple of it; and the launch
shapes the runtime picks from the neurons and steps of a call."""
from __future__ import annotations

import copy
import importlib.util
import inspect
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import triton_plan
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.triton_plan import Kernels, _kernels
from flexsn_dsl.triton_settings import TILE, TILE_CODE, TILE_VALUES, LaunchSettings, interpreting, launch_settings

NEURONS = Path(__file__).resolve().parents[1] / "neurons"
DRAWING = ("escape_lif", "ou_lif")
CALLS = (7, 2, 8)  # steps of three calls that carry states: against tiles of 2, 4 and 8, odd, short and whole
TILES = (2, 4, 8)
# spec: (sizes, one step's shape); what each adds: two states (alif), two inputs and an input the backward
# reads (modulated_lif), a continuous-time spec (izhikevich_ct), a learnable scalar (plif), learnable shaped
# parameters: the tiled backward (plif_channel, per channel; lif_hetero_ct, per neuron), a recurrent spec
CASES = {
    "lif": ({}, (2, 9)),
    "escape_lif": ({}, (2, 9)),  # draws: the step of a tile picks its numbers (the torch backend draws others)
    "ou_lif": ({}, (2, 9)),  # white noise in an ODE (Euler-Maruyama)
    "alif": ({}, (2, 9)),
    "modulated_lif": ({}, (2, 9)),
    "izhikevich_ct": ({}, (2, 9)),
    "plif": ({}, (2, 9)),
    "plif_channel": ({"C": 3}, (2, 3, 2, 2)),
    "lif_hetero_ct": ({"N": 9}, (2, 9)),
    "rlif": ({"N": 9}, (2, 9)),
}


def _calls(spec: str, backend: str, monkeypatch, tile: int = 0,
           calls: tuple[int, ...] = CALLS) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Outputs, state sequences, final states, and the gradients of the inputs and parameters of a
    loss on all of them, over three calls from the same random inputs (float64; blocks of 16 neurons:
    two programs, the second partly masked)."""
    monkeypatch.setenv("FLEXSN_DSL_TIME_TILE", str(tile))
    monkeypatch.setenv("FLEXSN_DSL_BLOCK", "16")
    sizes, shape = CASES[spec]
    recurrent = spec == "rlif"
    torch.manual_seed(0)  # (the recurrent weight's initial values, then the inputs)
    m = flexsn_dsl.load(NEURONS / f"{spec}.yaml", sizes=sizes, backend=backend,
                        store_state_seqs=not recurrent).double()
    inputs = [[(torch.rand(T, *shape, dtype=torch.float64) * 2).requires_grad_() for _ in m.spec.inputs]
              for T in calls]
    results, loss = [], 0
    for xs in inputs:
        ys = m(*xs)
        results += [*(ys if isinstance(ys, tuple) else (ys,)), *m.state_seqs.values()]
        if backend == "triton" and not recurrent:  # the setting reached the launch
            plan = _kernels(m._compiled, xs[0].device.type).plan(xs[0].shape, xs[0].dtype, launch_settings())
            assert plan.read_init["_TC"] == tile
    results += list(m.states.values())
    for r in results:
        loss = loss + (r * torch.rand(r.shape, dtype=torch.float64)).sum()
    wrt = [x for xs in inputs for x in xs] + [p for p in m.parameters() if p.requires_grad]
    return [r.detach() for r in results], list(torch.autograd.grad(loss, wrt))


@pytest.mark.parametrize("spec", CASES)
def test_time_tiles_give_the_bits_of_the_step_at_a_time_kernels(spec, monkeypatch):
    results, grads = _calls(spec, "triton", monkeypatch, tile=1)
    assert all(g.abs().sum() > 0 for g in grads)  # (three calls: each one's inputs get a gradient)
    for tile in TILES:
        tiled = _calls(spec, "triton", monkeypatch, tile)
        for kind, got, expected in zip(("result", "gradient"), tiled, (results, grads)):
            assert len(got) == len(expected)
            for k, (a, b) in enumerate(zip(got, expected)):
                if interpreting():  # the same operations in the same order
                    assert torch.equal(a, b), f"tile {tile}: {kind} {k} differs from the step-at-a-time kernels'"
                else:  # compiled, the unrolled steps may contract a product and a sum differently (FMA): the
                    # H200 gave gradients of alif, izhikevich_ct and lif_hetero_ct that differ in their last bits
                    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)
    if spec in DRAWING:  # (torch's generator, not Philox: other numbers)
        return
    for got, expected in zip((results, grads), _calls(spec, "torch", monkeypatch)):
        for a, b in zip(got, expected):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("spec", ["lif", "alif"])
def test_the_largest_tiles_give_the_bits_of_the_step_at_a_time_kernels(spec, monkeypatch):
    """Tiles of 32 and 64 steps, as a GPU takes them for long sequences (their blocks taken apart over five and
    six levels of pairs), over two whole tiles and a rest, and a call shorter than a tile."""
    calls = (2 * 64 + 3, 9, 40)
    results, grads = _calls(spec, "triton", monkeypatch, tile=1, calls=calls)
    for tile in (32, 64):
        for got, expected in zip(_calls(spec, "triton", monkeypatch, tile, calls), (results, grads)):
            for a, b in zip(got, expected):
                if interpreting():
                    assert torch.equal(a, b), f"tile {tile}"
                else:
                    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-14)


def test_the_time_loop_is_tiled_in_forward_and_backward_kernels_only():
    """Every block kernel walks tiles of _TC steps, each read as one block with the next tile's block in
    flight, and then the rest one by one; the recurrent kernels, one matrix product per step, do not."""
    source = compile_spec(NEURONS / "rlif.yaml").triton_source
    kernels = source.split("@triton.jit\ndef ")[1:]
    by_name = {k[:k.index("(")]: k for k in kernels}
    for variant in ("inference", "inference_final_state", "forward", "forward_final_state", "backward"):
        body = by_name[f"rlif_{variant}_kernel"]
        assert body.count("for _k in tl.static_range(_TC):") == 1, variant
        assert "for _t0 in tl.range(0, _tiled, _TC):" in body
        assert "_tile_rows(" in body and "_tile_load(" in body
        assert "for _t in tl.range(_tiled, _T, num_stages=_STAGES):" in body
    for variant in ("recurrent_forward", "recurrent_backward"):
        assert "_TC" not in by_name[f"rlif_{variant}_kernel"]


UNSET = LaunchSettings(autotune=False, stages=0, recurrent_precision="tf32x3", block=0, warps=0, time_tile=0)


def _gpu_kernels(monkeypatch, spec: str = "lif") -> Kernels:
    """A spec's kernels as the runtime configures them for a GPU of 132 SMs (an H200)."""
    device = "cpu" if interpreting() else "cuda"  # (a GPU machine runs no interpreter)
    kernels = copy.copy(_kernels(flexsn_dsl.load(NEURONS / f"{spec}.yaml", backend="triton")._compiled, device))
    kernels.interpret = False
    monkeypatch.setattr(triton_plan, "_sm_count", lambda: 132)
    return kernels


def test_launch_shapes_keep_many_neurons_as_they_were_and_tile_time_for_few(monkeypatch):
    gpu = _gpu_kernels(monkeypatch)
    # B*N >= 65,536: the blocks measured before time tiles, no tiles
    assert gpu.config(4 << 20, 8, UNSET) == {"_BLOCK": 1024, "num_warps": 4, "_STAGES": 2, "_TC": 1}
    assert gpu.config(1 << 18, 64, UNSET) == {"_BLOCK": 256, "num_warps": 2, "_STAGES": 4, "_TC": 1}
    assert gpu.config(65536, 500, UNSET) == {"_BLOCK": 64, "num_warps": 1, "_STAGES": 4, "_TC": 1}
    # fewer: one-warp blocks small enough for more programs than SMs (down to 32 neurons), tiles of about T / 16
    assert gpu.config(8192, 1000, UNSET) == {"_BLOCK": 32, "num_warps": 1, "_STAGES": 2, "_TC": 32}
    assert gpu.config(32768, 500, UNSET)["_BLOCK"] == 64  # 512 programs
    assert gpu.config(4096, 4096, UNSET)["_BLOCK"] == 32  # 128 programs
    assert gpu.config(256, 1000, UNSET)["_BLOCK"] == 16  # batch-1 streaming: 16 programs, not 8
    # the tile: a power of two, at most T / 16 and the largest for the spec and direction (LIF: 64 and 32)
    assert [gpu.config(4096, T, UNSET)["_TC"] for T in (1, 31, 32, 64, 500, 1000, 4096)] == [1, 1, 2, 4, 16, 32, 64]
    assert [gpu.config(4096, T, UNSET, "backward")["_TC"] for T in (500, 1000, 4096)] == [16, 32, 32]
    assert gpu.config(4096, 3, UNSET)["_STAGES"] == 4  # no tiles: the step-at-a-time loop pipelined as before


def test_a_thread_holds_one_neurons_tiles(monkeypatch):
    """Blocks of 64 or 128 neurons (16,896 to 65,535 on an H200) with tiles take a warp for each 32 neurons:
    the tile bound counts one neuron's values a thread."""
    gpu = _gpu_kernels(monkeypatch)
    for n, T, block in ((20_000, 2048, 64), (40_000, 4096, 128), (8192, 1000, 32)):
        config = gpu.config(n, T, UNSET)
        assert config["_BLOCK"] == block and config["num_warps"] == block // 32 and config["_TC"] > 1
    assert gpu.config(40_000, 8, UNSET)["num_warps"] == 1  # (no tiles: the loop as before)


@pytest.mark.skipif(not list((Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin")
                              .glob("cuobjdump")), reason="this Triton has no CUDA backend tools")
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_the_built_in_launch_keeps_the_tiles_in_registers(dtype):
    """LIF's inference, forward and backward kernels as a plan launches them for 40,000 neurons x 4,096 steps
    (blocks of 128; tiles of 64 and 32 steps, float64 half as many), compiled for sm_90a by Triton and read by
    cuobjdump and nvdisasm: no spill in the time loop (a loop invariant reloaded once a tile is allowed).
    One-warp blocks of 128 spilled 1.3 to 2.8 KB a thread, float64 at float32's tiles 0.1 to 1.6 KB."""
    root = NEURONS.parent
    run = subprocess.run([sys.executable, str(root / "benchmarks" / "register_check.py"), str(NEURONS / "lif.yaml"),
                          "-n", "40000", "-T", "4096", "--dtype", dtype], capture_output=True, text=True, cwd=root,
                         env={**os.environ, "PYTHONPATH": str(root)})
    assert run.returncode == 0 and "0 kernel launches spill" in run.stdout, run.stdout + run.stderr[-2000:]
    assert run.stdout.count(" registers") == 3


def test_the_built_in_tile_unrolls_a_bounded_amount_of_code(monkeypatch):
    """Compile time grows faster than a tile's code: a step of more code gets smaller tiles (a power of
    two, at most TILE_CODE characters of core source); a kernel that reads more sequences too (two tiles
    of each in registers, TILE_VALUES values at most)."""
    for spec, largest in (("lif", (64, 32)), ("izhikevich_ct", (32, 8)), ("adex_ct", (8, 8)), ("hh", (2, 2))):
        gpu = _gpu_kernels(monkeypatch, spec)
        code = max(len(inspect.getsource(getattr(gpu.module, f"{spec}_{d}_core").fn)) for d in ("forward", "backward"))
        assert (gpu.largest_tiles["forward"], gpu.largest_tiles["backward"]) == largest
        for tile in largest:
            assert tile * code <= TILE_CODE or tile == 1
        info = gpu.info
        reads = {"forward": info.num_inputs, "backward": info.num_outputs + len(set(info.c2k_return_mapping))}
        for direction, tile in zip(("forward", "backward"), largest):
            assert 2 * reads[direction] * tile <= TILE_VALUES
            assert tile == TILE or 2 * tile * code > TILE_CODE or 4 * reads[direction] * tile > TILE_VALUES
            assert gpu.config(8192, 4096, UNSET, direction)["_TC"] == tile


def test_a_plan_launches_the_backward_with_the_backward_tile(monkeypatch):
    """The backward reads more sequences than the forward (LIF: two against one): its launches take its own,
    smaller tile; a setting gives both the same."""
    gpu = _gpu_kernels(monkeypatch)
    plan = gpu.plan(torch.Size([4096, 4096]), torch.float32, UNSET)
    assert plan.read_init["_TC"] == plan.const_init["_TC"] == 64
    assert {flags["_TC"] for flags in plan.backward_flags.values()} == {32}
    assert {flags["_TC"] for flags in plan.carrying_flags.values()} == {32}  # (recompute's chunks)
    given = gpu.plan(torch.Size([4096, 4096]), torch.float32, UNSET._replace(time_tile=8))
    assert given.read_init["_TC"] == 8 and {flags["_TC"] for flags in given.backward_flags.values()} == {8}
    # float64: values of two registers, half the tiles (a setting as given)
    wide = gpu.plan(torch.Size([4096, 4096]), torch.float64, UNSET)
    assert wide.read_init["_TC"] == 32 and {flags["_TC"] for flags in wide.backward_flags.values()} == {16}
    assert gpu.plan(torch.Size([4096, 4096]), torch.float64, UNSET._replace(time_tile=8)).read_init["_TC"] == 8


def test_launch_settings_override_each_choice(monkeypatch):
    gpu = _gpu_kernels(monkeypatch)
    given = UNSET._replace(stages=3, block=128, warps=2, time_tile=8)
    for n in (4 << 20, 8192):
        assert gpu.config(n, 1000, given) == {"_BLOCK": 128, "num_warps": 2, "_STAGES": 3, "_TC": 8}
    assert gpu.config(8192, 1000, UNSET._replace(time_tile=1))["_TC"] == 1  # no tiles
    if interpreting():  # the interpreter: small blocks and tiles of at most 4 steps, unless a setting says
        cpu = _kernels(flexsn_dsl.load(NEURONS / "lif.yaml", backend="triton")._compiled, "cpu")
        assert cpu.config(40, 1000, UNSET) == {"_BLOCK": 64, "_STAGES": 1, "_TC": 4}
        assert cpu.config(40, 1000, given) == {"_BLOCK": 128, "_STAGES": 1, "_TC": 8}



COMPILE_FOR_GPU = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from flexsn_dsl.compiler import compile_spec
spec, variant = sys.argv[1:]
module = compile_spec(spec).triton_module()
fn = getattr(module, f"{module.INFO.neuron}_{variant}_kernel")
given = dict(_BLOCK=32, _ROWS=1, _COLS=32, _DTYPE=tl.float32, _STAGES=2, _TC=4, _CONST_INIT=True,
             _HAS_STATE_GRADS=True, _HAS_FINAL_GRADS=False, _WRITE_INIT_GRADS=False)
signature = {a: "constexpr" if a in given else "i32" if a in ("_T", "_N", "_P") or a.endswith(("__inner", "__size",
             "__split")) else "*fp32" for a in fn.arg_names}
constants = {a: given[a] for a in fn.arg_names if a in given}
kernel = triton.compile(triton.compiler.ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 1})
print(kernel.asm["ptx"])
"""


@pytest.mark.parametrize("spec,variant", [("lif", "forward"), ("lif", "backward"), ("plif_channel", "backward")])
def test_tiles_compile_for_a_gpu(spec, variant, tmp_path):
    """Compiled offline for an NVIDIA GPU (Triton's own toolchain; the interpreter does not check what its
    compiler accepts): a tile's blocks taken apart (block kernels) or its tuple of loads (the tiled backward), and
    the steps after the tiles pipelined."""
    pytest.importorskip("triton.backends.nvidia")
    env = dict(os.environ, TRITON_INTERPRET="0", FLEXSN_DSL_CACHE=str(tmp_path), PYTHONPATH=str(NEURONS.parent),
               TRITON_CACHE_DIR=str(tmp_path / "triton"))
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU, str(NEURONS / f"{spec}.yaml"), variant], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.count(".entry") == 1 and "cp.async" in done.stdout  # the steps after the tiles: pipelined
