"""Time-parallel kernels (issue 27): the analysis of which steps are affine in their states, and
the scan kernels against the sequential ones (``FLEXSN_DSL_TIME_PARALLEL=0``), run through
Triton's interpreter in float64: outputs, final states and state sequences, and the gradients of
inputs, initial states and parameters, equal to 1e-9 relative (the scan reorders the arithmetic)."""
from __future__ import annotations

from pathlib import Path

import pytest
import sympy
import torch

import flexsn_dsl
from flexsn_dsl import triton_runtime
from flexsn_dsl.cli import main
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.names import kernel_name, scan_variant
from flexsn_dsl.parallel import TIME_PARALLEL, Affine, analyse, verdict

ROOT = Path(__file__).resolve().parents[1]
TILE = triton_runtime.SCAN_TC

# a leaky integrator read out by a threshold: the spike does not enter the update
LI = """
neuron: li
parameters:
  tau: {value: 2.0, learnable: true}
states:
  v: 0.25
step:
  v: v + (x - v) / tau
  s: spike(v - 0.5)
outputs: [s, v]
"""
# CUBA LI (Norse's LICell): the current jumps by the input and decays, v integrates the new current:
# a lower-triangular A; two inputs, one of them only in a coefficient
CUBA = """
neuron: cuba_li
inputs: [x, g]
parameters:
  tau_syn_inv: {value: 0.5, learnable: true}
  tau_mem_inv: 0.3
  v_leak: 0.1
states:
  v: 0.0
  i: 0.0
step:
  i_jump: i + x
  v: v + tau_mem_inv * ((v_leak - v) + i_jump) * (1 + 0.5 * sigmoid(g))
  i: i_jump - tau_syn_inv * i_jump
  s: spike(v - 0.3)
outputs: [v, s]
"""
# ODEs: the exact propagator of the coupled linear system, a learnable time constant in its coefficients
CUBA_CT = """
neuron: cuba_li_ct
parameters:
  tau_mem: {value: 2.0, learnable: true}
  tau_syn: 1.0
  R: 2.0
  dt: 1.0
states:
  v: 0.0
  i: 0.0
equations:
  v: (-v + R * i) / tau_mem
  i: (x - i) / tau_syn
method: exact
outputs: [v]
"""
# coefficients that are products of the spec's (a ** 2): printed with a helper (_pow_2) the cores do not call
SQUARED = """
neuron: squared
parameters:
  a: {value: 0.7, learnable: true}
states:
  i: 0.0
  v: 0.0
step:
  u: a * i
  i: a * u + x
  v: 0.5 * v + i
outputs: [v]
"""
# a learnable per-channel decay and a fixed per-channel gain (shaped parameters), a condition on the input
SHAPED = """
neuron: channel_trace
parameters:
  decay: {value: 0.8, learnable: true, shape: [C]}
  gain: {value: 1.5, shape: [C]}
states:
  a: 0.0
step:
  a: decay * a + where(x > 0.5, gain * x, x)
  s: spike(a - 1)
outputs: [a, s]
"""
# a fixed shaped parameter only (the backward is time-parallel too), a detached coefficient
FIXED = """
neuron: fixed_trace
parameters:
  decay: {value: 0.8, shape: [C]}
  k: {value: 0.5, learnable: true}
states:
  a: 0.0
step:
  a: decay * a + k * x + detach(0.1 * a)
outputs: [a]
"""


def _module(text: str, **kwargs) -> flexsn_dsl.FlexSN:
    return flexsn_dsl.loads(text, backend="triton", **kwargs).double()


def _relative(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max() / b.abs().max().clamp_min(1e-300)) if b.numel() else 0.0


def _run(text: str, parallel: bool, monkeypatch, steps: list[int], shape: tuple[int, ...], sizes=None,
         seqs: bool = False, grad: bool = True, carry: bool = True) -> dict[str, torch.Tensor]:
    """Outputs and final states of ``len(steps)`` calls carrying the states (from random initial states
    when ``carry``), and with ``grad`` the gradients of a weighted sum of them, all in one dict."""
    monkeypatch.setenv("FLEXSN_DSL_TIME_PARALLEL", "1" if parallel else "0")
    m = _module(text, store_state_seqs=seqs, **({"sizes": sizes} if sizes else {}))
    gen = torch.Generator().manual_seed(1)
    names = m.spec.inputs
    xs = [[(torch.rand((T, *shape), generator=gen, dtype=torch.float64) * 2).requires_grad_(grad) for _ in names]
          for T in steps]
    inits = {s: torch.rand(shape, generator=gen, dtype=torch.float64).requires_grad_(grad) for s in m.spec.states}
    if carry:
        m.states = dict(inits)
    result, loss = {}, 0.0
    for k, x in enumerate(xs):
        outs = m(*x)
        outs = outs if isinstance(outs, tuple) else (outs,)
        for name, out in zip(m.spec.outputs, outs):
            result[f"{name}{k}"] = out
        for name, seq in m.state_seqs.items():
            result[f"{name}__seq{k}"] = seq
    result.update({f"{n}__final": v for n, v in m.states.items()})
    if not grad:
        return {k: v.detach() for k, v in result.items()}
    for value in result.values():  # a fixed random weight per value
        loss = loss + (value * torch.rand(value.shape, generator=gen, dtype=torch.float64)).sum()
    leaves = {f"{n}{k}.grad": x for k, group in enumerate(xs) for n, x in zip(names, group)}
    leaves.update({f"{n}__init.grad": v for n, v in inits.items()} if carry else {})
    leaves.update({f"{n}.grad": p for n, p in m.named_parameters()})
    grads = torch.autograd.grad(loss, list(leaves.values()), allow_unused=True)
    result.update({k: g for k, g in zip(leaves, grads) if g is not None})
    return {k: v.detach() for k, v in result.items()}


def _compare(text: str, monkeypatch, steps, shape=(3,), **kwargs) -> None:
    scan = _run(text, True, monkeypatch, steps, shape, **kwargs)
    sequential = _run(text, False, monkeypatch, steps, shape, **kwargs)
    assert scan.keys() == sequential.keys()
    assert any(k.endswith(".grad") for k in scan) == kwargs.get("grad", True)
    for key in scan:
        assert _relative(scan[key], sequential[key]) < 1e-9, key


# -- the analysis --------------------------------------------------------------------------------
@pytest.mark.parametrize("spec, expected", [
    ("lif", "sequential: s feeds back into v"),
    ("cuba_lif_ct", "sequential: s feeds back into v"),
    ("resonate_fire", "sequential: s feeds back into z_re"),
    ("leaky", "sequential: mem enters mem's update nonlinearly (spike(mem - 1.0))"),
    ("hh", "sequential: n enters V's update nonlinearly (n**4)"),
    ("morris_lecar", "sequential: V, w enter V's update nonlinearly (-0.04*w*(V + 84.0))"),
    ("lif_refractory", "sequential: refractory enters v's update nonlinearly (refractory > 0.5)"),
    ("rlif", "sequential: s feeds back through a recurrent input"),
])
def test_zoo_verdicts_name_why_a_spec_is_sequential(spec, expected):
    assert verdict(compile_spec(ROOT / "neurons" / f"{spec}.yaml").ir) == expected


def test_every_zoo_spec_has_a_verdict():
    verdicts = {path.stem: verdict(compile_spec(path).ir) for path in sorted((ROOT / "neurons").glob("*.yaml"))}
    assert [name for name, v in verdicts.items() if v == TIME_PARALLEL] == ["li"]  # Norse's LICell
    assert all(v.startswith("sequential: ") for name, v in verdicts.items() if name != "li")


@pytest.mark.parametrize("step, expected", [
    ("v: v * exp(v) + x", "sequential: v enters v's update nonlinearly (exp(v))"),
    ("v: v * w + x\n  w: 0.5 * w", "sequential: v, w enter v's update nonlinearly (v*w)"),
    ("v: where(v > 1, 0.5 * v, v) + x\n  w: w", "sequential: v enters v's update nonlinearly (v > 1)"),
    ("w: w / v\n  v: 0.5 * v + x", "sequential: v enters w's update nonlinearly (1/v)"),
    ("s: spike(w - 1)\n  v: 0.5 * v * (1 - s) + x", "sequential: s feeds back into v"),
    ("u: spike(w - 1)\n  v: 0.5 * v * (1 - u) + x", "sequential: w enters v's update nonlinearly (spike(w - 1))"),
])
def test_verdicts_of_nonlinear_steps(step, expected):
    outputs = "[s]" if "s:" in step else "[v]"
    text = f"neuron: n\nstates: {{v: 0.0, w: 1.0}}\nstep:\n  {step}\noutputs: {outputs}\n"
    assert verdict(compile_spec(text=text).ir) == expected


def test_affine_forms_are_the_hand_derived_ones():
    cuba = analyse(compile_spec(text=CUBA).ir)
    assert isinstance(cuba, Affine)
    syn, g, x = sympy.symbols("tau_syn_inv g x", real=True)
    mem = 0.3 * (1 + 0.5 / (1 + sympy.exp(-g)))  # tau_mem_inv times the gate
    expected = [[1 - mem, mem], [0, 1 - syn]]  # over (v, i): v integrates the jumped current
    values = {syn: 0.37, g: -0.4, x: 1.3}
    for got, want in zip([*cuba.matrix[0], *cuba.matrix[1], *cuba.offset],
                         [*expected[0], *expected[1], mem * (0.1 + x), (1 - syn) * x]):
        value = float(sympy.N(got.subs(values).rewrite(sympy.exp)))
        assert abs(value - float(sympy.sympify(want).subs(values))) < 1e-12
    assert cuba.pattern == ((0, 0), (0, 1), (1, 1))  # upper triangular over (v, i), the diagonal
    li = analyse(compile_spec(text=LI).ir)
    assert verdict(compile_spec(text=LI).ir) == TIME_PARALLEL and li.pattern == ((0, 0),)


def test_show_prints_the_verdict(tmp_path, capsys):
    path = tmp_path / "li.yaml"
    path.write_text(LI)
    assert main(["show", str(path)]) == 0
    assert "  time steps: time-parallel\n" in capsys.readouterr().out
    assert main(["show", str(ROOT / "neurons" / "lif.yaml")]) == 0
    assert "  time steps: sequential: s feeds back into v\n" in capsys.readouterr().out


# -- the kernels -----------------------------------------------------------------------------------
def test_time_parallel_specs_launch_the_scan_kernels(monkeypatch):
    """The plan holds the scan kernels (also for the tiled backward of a learnable shaped parameter), and
    the sequential ones with FLEXSN_DSL_TIME_PARALLEL=0 and for other specs."""
    def kernels(text: str, setting: str, **sizes) -> dict[str, str]:
        monkeypatch.setenv("FLEXSN_DSL_TIME_PARALLEL", setting)
        compiled = compile_spec(text=text)
        kernels = triton_runtime._kernels(compiled, "cpu")
        plan = kernels.plan(torch.Size([4, 6]), torch.float64, triton_runtime.launch_settings())
        names = {getattr(kernels.module, n): n for n in dir(kernels.module) if n.endswith("_kernel")}
        return {v: names[k] for v, k in plan.kernels.items()}
    scan = kernels(LI, "1")
    assert scan == {v: kernel_name("li", scan_variant(v)) for v in scan}
    assert kernels(LI, "0") == {v: kernel_name("li", v) for v in scan}
    assert kernels((ROOT / "neurons" / "lif.yaml").read_text(), "1") == {v: kernel_name("lif", v) for v in scan}
    monkeypatch.setenv("FLEXSN_DSL_TIME_PARALLEL", "1")
    tiled = triton_runtime._kernels(compile_spec(text=SHAPED), "cpu")  # a learnable shaped parameter: tiles
    plan = tiled.plan(torch.Size([4, 2, 3]), torch.float64, triton_runtime.launch_settings())
    assert plan.tiled and plan.tiled_variant == scan_variant("backward") and plan.tiled_meta["_TC"] == TILE


@pytest.mark.parametrize("steps", [[1], [TILE - 3], [TILE], [2 * TILE + 5], [TILE + 1, 3]])
def test_li_equals_the_sequential_kernels(steps, monkeypatch):
    _compare(LI, monkeypatch, steps, seqs=True)


def test_long_sequences_equal_the_sequential_kernels(monkeypatch):
    _compare(CUBA, monkeypatch, [1500], shape=(2, 2))


@pytest.mark.parametrize("seqs", [False, True])
def test_coupled_states_equal_the_sequential_kernels(seqs, monkeypatch):
    _compare(CUBA, monkeypatch, [2 * TILE + 3, TILE - 1], seqs=seqs)


def test_coefficients_with_their_own_helpers_equal_the_sequential_kernels(monkeypatch):
    assert "_pow_2(a)" not in compile_spec(text=SQUARED).cores.source
    _compare(SQUARED, monkeypatch, [TILE + 2])


def test_inference_equals_the_sequential_kernels(monkeypatch):
    for seqs in (False, True):
        _compare(CUBA, monkeypatch, [TILE + 7, 5], seqs=seqs, grad=False)
    _compare(LI, monkeypatch, [3 * TILE + 1], grad=False, carry=False)  # from the constant initial state


@pytest.mark.parametrize("grad", [False, True])
def test_the_direct_call_equals_the_sequential_kernels(grad, monkeypatch):
    """One input, no runtime parameters, from reset states: the module's shortcut (triton_runtime.direct_call)."""
    plain = LI.replace("{value: 2.0, learnable: true}", "2.0")
    _compare(plain, monkeypatch, [2 * TILE + 5, 7], grad=grad, carry=False)


def test_continuous_time_specs_equal_the_sequential_kernels(monkeypatch):
    assert verdict(compile_spec(text=CUBA_CT).ir) == TIME_PARALLEL
    _compare(CUBA_CT, monkeypatch, [TILE * 2 + 1, TILE - 2], shape=(4,))


@pytest.mark.parametrize("text, shape", [(SHAPED, (2, 3)), (SHAPED, (3, 40)), (FIXED, (2, 3))])
def test_shaped_parameters_equal_the_sequential_kernels(text, shape, monkeypatch):
    """(3, 40): a learnable value per neuron of a row, the rows' tiles split into several columns."""
    _compare(text, monkeypatch, [TILE + 9, 4], shape=shape, sizes={"C": shape[-1]}, seqs=True)


def test_float32_is_close_to_the_sequential_kernels(monkeypatch):
    results = []
    for parallel in (True, False):
        monkeypatch.setenv("FLEXSN_DSL_TIME_PARALLEL", "1" if parallel else "0")
        m = flexsn_dsl.loads(CUBA, backend="triton")
        x = torch.rand(3 * TILE + 2, 5, generator=torch.Generator().manual_seed(0)).requires_grad_()
        v, _ = m(x, x.detach())
        v.sum().backward()
        results.append((v.detach(), x.grad))
    for scan, sequential in zip(*results):
        assert _relative(scan, sequential) < 1e-5
