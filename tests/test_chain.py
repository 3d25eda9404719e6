"""The forward core's short-chain form (flexsn_dsl.chain): the same step as the IR it is printed from,
the same spikes and resets as the torch backend at the threshold itself, and a shorter chain of dependent
instructions from one step's states to the next's in the compiled kernel."""
from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import sympy
import torch

import flexsn_dsl
from flexsn_dsl.autodiff import differentiate, name_spike_arguments, share_reciprocals
from flexsn_dsl.chain import ShortChain, used
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.symbolic import Spike

ROOT = Path(__file__).resolve().parents[1]
ZOO = sorted(p.name for p in (ROOT / "neurons").glob("*.yaml"))

NUMPY = {"FusedMultiplyAdd": lambda x, c, r: x * c + r, "Scaled": lambda x, c: x * c, "SpikeAtLeast": lambda a, b: np.where(a >= b, 1.0, 0.0),
         "Spike": lambda u: np.where(u >= 0, 1.0, 0.0), "Detach": lambda u: u,
         "Sigmoid": lambda u: 1 / (1 + np.exp(-u)), "Reciprocal": lambda u: 1 / u}


def _run(lines, env: dict) -> dict:
    """The values of straight-line ``lines`` evaluated in float64 numpy from ``env``."""
    env = dict(env)
    for sym, expr in lines:
        args = sorted(expr.free_symbols, key=lambda s: s.name)
        with np.errstate(all="ignore"):
            value = sympy.lambdify(args, expr, modules=[NUMPY, "numpy"])(*(env[a] for a in args))
        env[sym] = np.broadcast_to(np.asarray(value, dtype=np.float64), (64,))
    return env


@pytest.mark.parametrize("name", ZOO)
def test_the_short_chain_form_computes_the_step_of_the_ir(name):
    """Every zoo spec: the rewritten assignments give the IR's outputs and next states, spikes exactly, on
    random values and on values from a grid of quarters, where spikes' arguments are often exactly 0 (the
    threshold itself: LIF's h = (v + x) / 2 = 1)."""
    ir = name_spike_arguments(compile_spec(ROOT / "neurons" / name).ir)
    kept = list(ir.outputs) + list(ir.next_states)
    lines = used(ShortChain(ir.states).lines(ir.assignments), kept)
    rng = np.random.default_rng(0)
    free = set(ir.inputs) | set(ir.states) | set(ir.params) | set(ir.fixed) | set(ir.draws)
    spikes = [e.args[0] for _, e in ir.assignments if isinstance(e, Spike)]
    ties = 0
    for values in (lambda: rng.uniform(-2, 2, 64), lambda: rng.integers(-8, 9, 64) / 4):
        env = {s: values() for s in sorted(free, key=lambda s: s.name)}
        expected, got = _run(ir.assignments, env), _run(lines, env)
        for s in kept:
            np.testing.assert_allclose(got[s], expected[s], rtol=1e-12, atol=1e-12, err_msg=f"{name}: {s}")
            if s in spikes or any(isinstance(e, Spike) for t, e in ir.assignments if t == s):
                np.testing.assert_array_equal(got[s], expected[s], err_msg=f"{name}: {s}")
        ties += sum(int((expected[u] == 0).sum()) for u in spikes)
    if name in ("lif.yaml", "if.yaml", "cuba_lif.yaml"):
        assert ties > 0  # (the grid reached the threshold)


@pytest.mark.parametrize("name", ZOO)
def test_the_short_chain_form_computes_the_backward_step(name):
    """Every zoo spec's backward core: the rewritten lines give the symbolic derivative's gradients (the
    surrogate's included), on random values and on quarters (saved spike arguments exactly 0)."""
    ir = name_spike_arguments(compile_spec(ROOT / "neurons" / name).ir)
    backward = share_reciprocals(differentiate(ir))
    reverse = ShortChain(backward.seeds[len(ir.outputs):])
    lines = reverse.lines(backward.recompute) + reverse.lines(backward.adjoints)
    results = [sympy.Symbol(f"result__{k}") for k in range(len(backward.results))]
    rewritten = lines + [(r, reverse.expr(e)) for r, e in zip(results, backward.results)]
    original = list(backward.recompute + backward.adjoints) + list(zip(results, backward.results))
    free = set(backward.saved) | set(backward.seeds) | set(ir.params) | set(ir.fixed) | set(ir.draws)
    rng = np.random.default_rng(1)
    for values in (lambda: rng.uniform(-2, 2, 64), lambda: rng.integers(-8, 9, 64) / 4):
        env = {s: values() for s in sorted(free, key=lambda s: s.name)}
        expected, got = _run(original, env), _run(rewritten, env)
        for r in results:
            np.testing.assert_allclose(got[r], expected[r], rtol=1e-12, atol=1e-12, err_msg=f"{name}: {r}")


def test_lif_forward_core_is_fma_compare_select():
    """The form the streaming kernels wait on: LIF's next v is one fma, one comparison and one select."""
    source = compile_spec(ROOT / "neurons" / "lif.yaml").triton_source
    core = source[source.index("def lif_forward_core"):source.index("def lif_backward_core")]
    assert "h = tl.fma(v, 0.5, 0.5 * x)" in core
    assert "s = _heaviside_ge(h, 1.0)" in core
    assert "v__next = tl.where(h >= 1.0, 0.0, h)" in core
    assert "s__u" not in core  # the spike's argument: only the backward recomputes it


def test_a_spike_copied_by_detach_gates_its_resets():
    """ALIF's reset goes through z = detach(s): z selects as s does, and z itself is not computed."""
    source = compile_spec(ROOT / "neurons" / "alif.yaml").triton_source
    core = source[source.index("def alif_forward_core"):source.index("def alif_backward_core")]
    assert "v__next = tl.where(s__u >= 0.0, 0.0, h)" in core
    assert "b__next = tl.where(s__u >= 0.0, b_dec + beta, b_dec)" in core
    assert " z = " not in core


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_spikes_and_resets_at_the_threshold_equal_the_torch_backend(dtype):
    """LIF (h = (v + x) / 2, threshold 1) driven to h = 1 exactly, and to the values next to it: the
    interpreted Triton kernels (compare and select) give the torch backend's spikes and states bit for
    bit, and the analytic ones: a spike exactly where h >= 1, v reset to 0 there."""
    one = torch.tensor(1.0, dtype=dtype)
    below, above = torch.nextafter(one, one - 1), torch.nextafter(one, one + 1)
    h = torch.stack([one, below, above, one * 0.5, one * 3, -one]).repeat(3)
    x = (2 * h).reshape(1, -1).repeat(5, 1)  # from v = 0: h = x / 2 at every step after a reset or below it
    results = []
    for backend in ("torch", "triton"):
        m = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend=backend).to(dtype)
        s = m(x)
        results.append((s, m.states["v"]))
    (s_torch, v_torch), (s_triton, v_triton) = results
    assert torch.equal(s_triton, s_torch) and torch.equal(v_triton, v_torch)
    assert torch.equal(s_triton[0], (h >= 1).to(dtype))
    assert torch.equal(s_triton[0], torch.tensor([1.0, 0, 1, 0, 1, 0] * 3, dtype=dtype))


TOOLS = Path(importlib.util.find_spec("triton").origin).parent / "backends" / "nvidia" / "bin"


@pytest.mark.skipif(not list(TOOLS.glob("nvdisasm")), reason="this Triton has no CUDA backend tools")
def test_the_streaming_kernel_waits_on_three_instructions_a_step():
    """LIF's inference kernel as batch-1 streaming launches it (blocks of 16, one warp, tiles of 64 steps),
    compiled for sm_90 and read by nvdisasm (benchmarks/isa_count.py): the longest chain of dependent
    instructions through a tile is 3 a step (fma, compare, select), with a little for the loop. Printed
    from the IR as it is, it was 6 (FMUL FFMA FADD FSET FADD FMUL: the compiler fused x's product, and the
    reset multiplied by 1 - s)."""
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "isa_count.py"), str(ROOT / "neurons" / "lif.yaml"),
                          "--block", "16", "--warps", "1", "--tile", "64", "--variants", "inference", "forward"],
                         capture_output=True, text=True, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    chains = [float(c) for c in re.findall(r"dependent chain ([0-9.]+) instructions per step", run.stdout)]
    assert len(chains) == 2, run.stdout + run.stderr[-2000:]
    assert all(3 <= c <= 3.5 for c in chains), run.stdout
