"""The Triton backend's own machinery, run through Triton's interpreter on the CPU:
symbolic backward against finite differences, what the forward saves, the kernel cache,
torch.compile(fullgraph=True) around the operators, and the bench command."""
from __future__ import annotations

import contextlib
import json
import os
import re
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import compiler
from flexsn_dsl.compiler import compile_spec

ROOT = Path(__file__).resolve().parents[1]

# Every function of the language, no spike: the step is smooth, so finite differences
# are an independent check of the generated backward (gradcheck, float64).
SMOOTH = """
neuron: smooth
inputs: [x, y]
parameters:
  tau: {value: 1.7, learnable: true}
  a: 0.3
states:
  v: a
  u: {init: 2 * a}
step:
  h: tanh(x) + exp(-abs(v)) * sigmoid(v) + where((x > 0.5) | (y < -0.5), x * x, sqrt(abs(x) + 1))
  g: clip(v, -1, 1) / tau + max(x, v) + min(y, 0.2) + relu(v - 0.1) + log(1 + x * x)
  v: 0.5 * v + 0.1 * (h + g) + sin(u) * cos(y) + x ** 3 / 3 - detach(y) * 0.0
  u: u * 0.9 + y / tau ** 2
outputs: [v, h]
"""


def _gradcheck_module(backend: str) -> None:
    m = flexsn_dsl.loads(SMOOTH, backend=backend).double()
    torch.manual_seed(0)
    x = (torch.rand(4, 3, dtype=torch.float64) * 2 - 1).requires_grad_()
    y = (torch.rand(4, 3, dtype=torch.float64) * 2 - 1).requires_grad_()
    v0 = (torch.rand(3, dtype=torch.float64) * 2 - 1).requires_grad_()

    def f(x, y, v0, tau):
        m.reset()
        m.tau.data = tau.detach()
        m.states = {"v": v0, "u": v0 * 0.5}
        out_v, out_h = m(x, y)
        # tau enters through m.tau; reattach it so gradcheck sees its gradient
        return out_v, out_h, m.states["u"]

    tau = torch.tensor(1.7, dtype=torch.float64, requires_grad=True)
    with torch.no_grad():
        m.tau.copy_(tau)
    m.tau.requires_grad_(True)
    assert torch.autograd.gradcheck(lambda x, y, v0: f(x, y, v0, tau), (x, y, v0), eps=1e-6, atol=1e-6)
    # the learnable parameter: finite differences by hand
    m.reset()
    outs = m(x, y)
    loss = sum(o.sum() for o in outs)
    (grad_tau,) = torch.autograd.grad(loss, [m.tau])
    with torch.no_grad():
        def total(t):
            m.tau.fill_(t)
            m.reset()
            return sum(o.sum() for o in m(x, y)).item()
        numeric = (total(1.7 + 1e-6) - total(1.7 - 1e-6)) / 2e-6
        m.tau.fill_(1.7)
    assert grad_tau.item() == pytest.approx(numeric, rel=1e-6, abs=1e-8)


@pytest.mark.parametrize("backend", ["triton", "torch"])
def test_backward_matches_finite_differences(backend):
    _gradcheck_module(backend)


def test_forward_saves_the_fewest_tensors():
    lif = compile_spec(ROOT / "neurons" / "lif.yaml").info
    assert lif.saved_names == ("h",) and lif.c2k_return_mapping == (("saved", 0),)
    plif = compile_spec(ROOT / "neurons" / "plif.yaml").info
    # the learnable 1/tau needs x and v; x is the input itself: nothing copied for it
    assert ("input", 0) in plif.c2k_return_mapping and len(plif.c2k_return_mapping) == 2
    assert plif.param_names == ("w",)
    # the adaptive LIF's backward needs h and b_dec only through the spike argument h - b_dec
    alif = compile_spec(ROOT / "neurons" / "alif.yaml")
    assert alif.info.saved_names == ("s__u",)
    assert "s__u = -b_dec + h" in alif.triton_source and "s = _heaviside(s__u)" in alif.triton_source
    # an output already in memory is read back rather than stored again
    leaky = compile_spec(ROOT / "neurons" / "leaky.yaml").info
    assert leaky.saved_names == ("mem",) and ("output", 1) in leaky.c2k_return_mapping


def test_generated_module_is_readable_and_t_independent():
    source = compile_spec(ROOT / "neurons" / "lif.yaml").triton_source
    assert "make_block_ptr" not in source and "tl.range(0, _tiled, _TC)" in source and "_tile_rows(" in source
    for variant in ("inference", "inference_final_state", "forward", "forward_final_state", "backward"):
        assert f"def lif_{variant}_kernel(" in source
    assert "def lif_forward_core(x, v):" in source and "def lif_backward_core(h, grad_out__s, grad_next__v):" in source
    compile(source, "lif.py", "exec")


def test_cached_module_loads_without_code_generation(tmp_path, monkeypatch):
    monkeypatch.setenv("FLEXSN_DSL_CACHE", str(tmp_path))
    text = (ROOT / "neurons" / "qif.yaml").read_text()
    first = compiler.Compiled(compile_spec(text=text).model, {"tau": 2.0, "v_c": 0.8, "a0": 1.0, "v_th": 1.0,
                                                              "v_rest": 0.0, "v_reset": -0.1})
    path = first.write()
    assert path.parent == tmp_path and first.key in path.read_text()
    second = compiler.Compiled(first.model, dict(first.values))

    def forbidden(ir):
        raise AssertionError("code generation ran although the module was cached")
    monkeypatch.setattr(compiler, "build_cores", forbidden)
    module = second.triton_module()
    assert module.INFO.neuron == "qif"
    other = compiler.Compiled(first.model, dict(first.values, tau=3.0))
    assert other.key != first.key  # parameter values are part of the key


@pytest.mark.parametrize("spec", ["lif", "plif", "modulated_lif"])
def test_torch_compile_fullgraph_triton_backend(spec):
    torch.manual_seed(0)
    m = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton", store_state_seqs=True).double()
    xs = [torch.rand(5, 7, dtype=torch.float64, requires_grad=True) for _ in m.spec.inputs]

    def run(module):
        for x in xs:
            x.grad = None
        for p in m.parameters():
            p.grad = None
        m.reset()
        ys = module(*xs)
        ys = ys if isinstance(ys, tuple) else (ys,)
        loss = sum((y * (i + 1)).sum() for i, y in enumerate(ys)) + sum(s.sum() for s in m.state_seqs.values())
        loss.backward()
        return [y.detach() for y in ys] + [x.grad.clone() for x in xs] + [p.grad.clone() for p in m.parameters()]

    eager = run(m)
    compiled = run(torch.compile(m, fullgraph=True))
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_torch_compile_without_gradients_runs_the_inference_kernels(monkeypatch, fresh_dynamo):
    """A compiled module under no_grad gives the eager results (outputs, state sequences, final states,
    carried to a second call) from the inference kernels: nothing is saved for a backward."""
    from flexsn_dsl import triton_operators
    torch.manual_seed(1)
    m = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton", store_state_seqs=True).double()
    xs = [torch.rand(5, 2, 7, dtype=torch.float64) * 2 for _ in range(2)]

    def run(module):
        m.reset()
        with torch.no_grad():
            ys = [module(x) for x in xs]
        return ys + [m.states["v"], m.state_seqs["v"]]

    eager = run(m)
    modes = []
    forward = triton_operators._forward  # (the compiled step's operators call it)
    monkeypatch.setattr(triton_operators, "_forward",
                        lambda plan, *args, **kw: modes.append(args[5]) or forward(plan, *args, **kw))
    compiled = run(torch.compile(m, fullgraph=True))
    assert modes and not any(modes)  # (on a GPU, the calls that trace the operators)
    for a, b in zip(eager, compiled):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


LINEAR = """
neuron: linear
inputs: [x]
states:
  v: 0.0
step:
  v: 0.5 * v + 2 * x
outputs: [v]
"""


@pytest.mark.parametrize("spec,kept", [("lif", [False]), ("leaky", [False, True]), ("linear", [True])])
def test_the_backward_keeps_only_the_outputs_its_kernel_reads(spec, kept):
    """An output the backward kernel does not read (LIF's spikes: its backward reads the saved h) is not saved
    for the backward (eager), so the next layer's input is not held twice; a spec whose backward reads nothing
    of [T, ...] keeps its first output (the backward's shape and dtype); the gradients equal the torch backend's."""
    torch.manual_seed(3)
    load = (lambda backend: flexsn_dsl.loads(LINEAR, backend=backend)) if spec == "linear" else \
        (lambda backend: flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend=backend))
    ours, reference = load("triton").double(), load("torch").double()
    x = torch.randn(5, 7, dtype=torch.float64, requires_grad=True)
    weights = torch.rand(5, 7, dtype=torch.float64)

    def grads(module):
        packed = []
        with torch.autograd.graph.saved_tensors_hooks(lambda t: packed.append(t.data_ptr()) or t, lambda t: t):
            outs = module(x * 1.5)
        outs = outs if isinstance(outs, tuple) else (outs,)
        loss = sum(((y * weights) * (i + 1)).sum() for i, y in enumerate(outs))
        return [y.data_ptr() in packed for y in outs], torch.autograd.grad(loss, [x, *module.parameters()])

    saved, got = grads(ours)
    assert saved == kept
    for a, b in zip(got, grads(reference)[1]):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("spec,freed", [("lif", [True]), ("modulated_lif", [True, False]), ("plif", [False])])
@pytest.mark.parametrize("compiled", [False, True])
def test_the_backward_keeps_only_the_inputs_its_kernel_reads(spec, freed, compiled, fresh_dynamo):
    """An input the backward kernel does not read (LIF's x: its backward reads the saved h) is not kept
    alive by the graph; the gradients (all inputs, parameters) equal the torch backend's."""
    import weakref
    torch.manual_seed(2)
    ours = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton").double()
    reference = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="torch").double()
    leaves = [torch.rand(4, 6, dtype=torch.float64, requires_grad=True) for _ in ours.spec.inputs]
    weights = torch.rand(4, 6, dtype=torch.float64)

    def grads(module, run, check_freed):
        module.reset()
        xs = [leaf * 2 for leaf in leaves]  # not leaves: nothing else holds them
        refs = [weakref.ref(x) for x in xs]
        outs = run(*xs)
        del xs
        if check_freed:
            assert [r() is None for r in refs] == freed
        loss = sum(((y * weights) * (i + 1)).sum() for i, y in enumerate(outs if isinstance(outs, tuple) else [outs]))
        return torch.autograd.grad(loss + module.states["v"].sum(), [*leaves, *module.parameters()])

    expected = grads(reference, reference, False)
    got = grads(ours, torch.compile(ours, fullgraph=True) if compiled else ours, True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)


def test_detach_allows_truncated_bptt():
    m = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton")
    x = torch.rand(3, 9) * 2
    m(x).sum().backward()
    m.detach()
    before = m.w.grad.clone()
    m(x).sum().backward()  # no "backward through the graph a second time"
    assert not torch.equal(m.w.grad, before)


def test_bench_runs_on_cpu(tmp_path, capsys):
    from flexsn_dsl.cli import main
    out = tmp_path / "bench.json"
    assert main(["bench", str(ROOT / "neurons" / "lif.yaml"), "-T", "3", "-n", "40", "--peers", "torch", "minimal",
                 "--json", str(out)]) == 0
    runs = json.loads(out.read_text())
    rows = runs[-1]["results"]
    assert {(r["impl"], r["mode"]) for r in rows} == {(i, m) for i in ("flexsn-dsl", "minimal Function", "torch loop")
                                                    for m in ("inference", "training")}
    inference = [r for r in rows if r["mode"] == "inference"]
    assert all(r["max_abs_diff"] == 0.0 and r["ms"] > 0 and r["floor_ms"] > 0 for r in inference)
    assert "flexsn-dsl" in capsys.readouterr().out


@pytest.mark.parametrize("spec", ["lif", "izhikevich"])
def test_bench_minimal_peer_computes_what_the_torch_backend_does(spec):
    """The host-floor peer launches the same kernels with no checks: its outputs and input
    gradients from reset states are the torch step's."""
    from flexsn_dsl.bench import minimal_runner
    ours = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton")
    reference = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="torch")
    torch.manual_seed(0)
    xs = [(torch.rand(5, 3, 7) * 2).requires_grad_() for _ in ours.spec.inputs]
    expected = reference(*xs)
    expected = expected if isinstance(expected, tuple) else (expected,)
    for got, want in zip(minimal_runner(ours, xs, "inference")(), expected):
        torch.testing.assert_close(got, want.detach())
    torch.manual_seed(1)
    got = minimal_runner(ours, xs, "training")()  # draws its upstream gradients, then returns the input gradients
    torch.manual_seed(1)
    want = torch.autograd.grad(expected, xs, [torch.randn_like(y) for y in expected])
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
    ys = minimal_runner(ours, xs, "function")(*xs)  # the Function itself (benchmarks/network.py's floor)
    for a, b in zip(ys, expected):
        torch.testing.assert_close(a, b)
    torch.manual_seed(1)
    for a, b in zip(torch.autograd.grad(ys, xs, [torch.randn_like(y) for y in ys]), want):
        torch.testing.assert_close(a, b)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's own switch: only where there is no GPU")
def test_the_bench_command_trains_on_a_cpu_in_a_fresh_process(tmp_path):
    """`flexsn-dsl bench` switches Triton's interpreter on before Triton is imported (a process that had imported
    it first ran the backward kernels half interpreted: "Cannot call @triton.jit'd outside of the scope")."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(FLEXSN_DSL_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-m", "flexsn_dsl", "bench", str(ROOT / "neurons" / "lif.yaml"), "-T", "2",
                          "-n", "16", "--mode", "training", "--peers", "minimal"], capture_output=True, text=True,
                         env=env, timeout=600)
    assert run.returncode == 0, run.stderr
    rows = [line for line in run.stdout.splitlines() if line.startswith("lif")]
    assert len(rows) == 2 and not any("failed" in row for row in rows), run.stdout


IMPORT_ORDERS = """
import sys
import torch
if sys.argv[1] == "torch._dynamo first":
    import torch._dynamo
import flexsn_dsl
if sys.argv[1] == "checkpoint after":
    m = flexsn_dsl.load(sys.argv[2], backend="torch", recompute=True)  # (torch.utils.checkpoint imports Triton)
    m(torch.rand(3, 1, 2, requires_grad=True)).sum().backward()
elif sys.argv[1] == "torch._dynamo after":
    import torch._dynamo
x = torch.tensor([[[0.5, 3.0]], [[2.5, 0.0]], [[0.1, 2.2]]], requires_grad=True)
y = flexsn_dsl.load(sys.argv[2], backend="triton")(x)
y.sum().backward()  # (the backward kernels call Triton's own functions)
print(y.flatten().tolist())
"""


@pytest.mark.skipif(torch.cuda.is_available(), reason="the interpreter's own switch: only where there is no GPU")
@pytest.mark.parametrize("order", ["torch._dynamo after", "checkpoint after", "torch._dynamo first"])
def test_the_interpreter_is_on_whoever_imports_triton_first(order, tmp_path):
    """Importing flexsn_dsl switches the interpreter on at Triton's first import, also where torch.compile or
    torch.utils.checkpoint makes it (Triton's own functions imported without the switch cannot run in the
    interpreter: every later call failed with "Cannot call @triton.jit'd outside of the scope of a kernel"); a
    process that imported Triton before flexsn_dsl is told so. LIF with tau 2, v_th 1: h = (v + x) / 2."""
    import subprocess
    import sys
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    env.update(FLEXSN_DSL_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    run = subprocess.run([sys.executable, "-c", IMPORT_ORDERS, order, str(ROOT / "neurons" / "lif.yaml")],
                         capture_output=True, text=True, env=env, timeout=600)
    if order == "torch._dynamo first":
        assert run.returncode != 0 and "import flexsn_dsl before them" in run.stderr, run.stderr
        return
    assert run.returncode == 0, run.stderr
    assert run.stdout.split() == ["[0.0,", "1.0,", "1.0,", "0.0,", "0.0,", "1.0]"], run.stdout


def test_bench_runners_run_the_forward_only_inside_forward_in():
    """``forward_in`` (the autocast rows of benchmarks/host_cpu.py) is entered once a call, around the
    forward; the backward runs outside it, as in a training step; the gradients are those without it."""
    from flexsn_dsl.bench import _runner, minimal_runner
    m = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="triton")
    x = (torch.rand(5, 3, 7) * 2).requires_grad_()
    inside, entered, backward_inside = [False], [], []

    @contextlib.contextmanager
    def forward_in():
        inside[0] = True
        entered.append(1)
        try:
            yield
        finally:
            inside[0] = False

    x.register_hook(lambda g: backward_inside.append(inside[0]))
    for make in (_runner, minimal_runner):
        torch.manual_seed(0)
        want = make(m, [x], "training")()
        torch.manual_seed(0)
        got = make(m, [x], "training", forward_in)()
        torch.testing.assert_close(got[0], want[0], rtol=0, atol=0)
        torch.testing.assert_close(make(m, [x], "inference", forward_in)()[0],
                                   make(m, [x], "inference")()[0], rtol=0, atol=0)
    assert len(entered) == 4 and backward_inside == [False] * 4


def test_bench_minimal_peer_refuses_kernels_that_take_more_than_inputs():
    from flexsn_dsl.bench import minimal_runner
    x = torch.rand(2, 4)
    assert minimal_runner(flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton"), [x], "training") is None
    assert minimal_runner(flexsn_dsl.loads(LEARNABLE_INIT, backend="triton"), [x], "inference") is None


def test_bench_floor_counts_the_bytes_a_call_from_reset_states_must_move():
    from flexsn_dsl.bench import floor_bytes
    T, n = 8, 1000
    lif = compile_spec(ROOT / "neurons" / "lif.yaml").info  # 1 input, 1 output, 1 state, constant init
    # inference: x read, s written, final v written; training adds grad s read, grad x written,
    # one saved sequence written and read
    assert floor_bytes(lif, T, n, 4, "inference") == (2 * T * n + n) * 4
    assert floor_bytes(lif, T, n, 2, "training") == (6 * T * n + n) * 2
    # an initial state that depends on a learnable parameter is read
    learnable_init = flexsn_dsl.loads(LEARNABLE_INIT).info  # 2 states, one initial value learnable
    assert learnable_init.initial_values == ()
    assert floor_bytes(learnable_init, T, n, 4, "training") == (8 * T * n + 4 * n) * 4


def test_bench_skips_peers_that_compile_per_sequence_length(tmp_path, capsys):
    from flexsn_dsl.cli import main
    out = tmp_path / "bench.json"
    assert main(["bench", str(ROOT / "neurons" / "lif.yaml"), "-T", "3", "-n", "40", "--mode", "inference",
                 "--peers", "compile", "--compile-max-T", "2", "--json", str(out)]) == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())[-1]["results"]}
    assert rows["torch.compile"]["ms"] is None
    assert rows["torch.compile"]["note"] == "skipped: T > --compile-max-T 2"
    assert rows["flexsn-dsl"]["ms"] > 0


LEARNABLE_INIT = ("neuron: t\nparameters: {v0: {value: 0.3, learnable: true}}\nstates: {v: v0, w: 0.25}\n"
                  "step:\n  h: 0.5 * v + x - w\n  s: spike(h - 1.0)\n  v: h * (1 - s)\n  w: 0.9 * w + 0.2 * s\n"
                  "outputs: [s]\n")


@pytest.mark.parametrize("spec", ["alif", "izhikevich", "learnable_init"])
@pytest.mark.parametrize("loss_on", ["outputs", "outputs_and_states", "second_call"])
def test_gradients_whichever_upstream_gradients_exist(spec, loss_on):
    """Constant initial states are not read, and missing final-state gradients are not
    materialised; gradients still equal the torch backend's, also through a second call
    whose initial states carry the first call's graph."""
    x1, x2 = ((torch.rand(5, 7, dtype=torch.float64) * 2).requires_grad_() for _ in range(2))
    results = []
    for backend in ("triton", "torch"):
        if spec == "learnable_init":
            m = flexsn_dsl.loads(LEARNABLE_INIT, backend=backend).double()
        else:
            m = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend=backend).double()
        w = torch.linspace(-1, 1, 7, dtype=torch.float64)
        loss = (m(x1) * w).sum()
        if loss_on == "outputs_and_states":
            loss = loss + sum((s * w).sum() for s in m.states.values())
        if loss_on == "second_call":
            loss = loss + (m(x2) * w.flip(0)).sum()
        results.append(torch.autograd.grad(loss, [x1, x2, *m.parameters()], allow_unused=True))
    for a, b in zip(*results):
        assert (a is None) == (b is None)
        if a is not None:
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
    assert results[0][0].abs().sum() > 0 and (loss_on != "second_call" or results[0][1].abs().sum() > 0)


# generated names that once met: the spike argument of `out` (out__u) and the upstream gradient of an
# output `u`; the spike argument of `next` and the upstream gradient of a state `u`
NAME_CLASHES = [
    "neuron: t\nstates: {v: 0.0}\nstep:\n  u: v + x\n  out: spike(u - 1)\n  v: u * (1 - out)\noutputs: [out, u]\n",
    "neuron: t\nstates: {u: 0.0}\nstep:\n  next: spike(u * 2 + x - 1)\n  u: u * 0.5 + x - next\noutputs: [next]\n",
]


@pytest.mark.parametrize("text", NAME_CLASHES)
def test_generated_names_do_not_clash_with_spec_names(text):
    x = torch.rand(4, 3, dtype=torch.float64) * 2
    grads = []
    for backend in ("torch", "triton"):
        xi = x.clone().requires_grad_()
        ys = flexsn_dsl.loads(text, backend=backend).double()(xi)
        ys = ys if isinstance(ys, tuple) else (ys,)
        grads.append(torch.autograd.grad(sum(y.sum() * (k + 1) for k, y in enumerate(ys)), [xi])[0])
    torch.testing.assert_close(grads[1], grads[0], rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("spec", ["lif", "alif"])
@pytest.mark.parametrize("shape", [(0, 5), (3, 0)], ids=["T=0", "no neurons"])
def test_empty_sequences_and_populations(spec, shape):
    """T=0 leaves the states at their initial values; zero neurons give empty results; gradients
    (zeros) agree with the torch backend, also under torch.compile."""
    results = []
    for backend, compiled in (("torch", False), ("triton", False), ("triton", True)):
        m = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend=backend).double()
        x = torch.rand(*shape, dtype=torch.float64, requires_grad=True)
        call = torch.compile(m, fullgraph=True) if compiled else m
        y = call(x)
        states = [m.states[k] for k in m.spec.states]
        loss = y.sum() + sum(s.sum() * 2 for s in states)
        wrt = [x, *m.parameters()]
        grads = torch.autograd.grad(loss, wrt, allow_unused=True) if loss.requires_grad else [None] * len(wrt)
        results.append([y, *states, *(g if g is not None else torch.zeros_like(w) for g, w in zip(grads, wrt))])
    for other in results[1:]:
        for a, b in zip(results[0], other):
            torch.testing.assert_close(a, b.reshape(a.shape))


CONSTANT_FOLDING = [
    # spike()/detach() of a line that folds to a constant
    "neuron: t\nstates: {v: 0.0}\nstep: {u: pi, s: 'spike(u - 3)', v: v + x * s}\noutputs: [s, v]\n",
    "neuron: t\nstates: {v: 0.0}\nstep: {u: pi, s: spike(x), v: x + detach(u)}\noutputs: [s, v]\n",
    # a condition on a learnable parameter (a scalar in the kernels) combined with a tensor condition
    "neuron: t\nparameters: {w: {value: 0.5, learnable: true}}\nstates: {v: 0.0}\nstep:\n"
    "  v: where((w > 0) & (v < 0) | (x > w), x * w, 2.0 * x)\n  s: spike(v - 1.5)\noutputs: [s, v]\n",
]


@pytest.mark.parametrize("text", CONSTANT_FOLDING)
def test_constants_and_scalar_conditions_agree_across_backends(text):
    x = (torch.randn(4, 6, dtype=torch.float64) * 2).requires_grad_()
    results = []
    for backend in ("torch", "triton"):
        m = flexsn_dsl.loads(text, backend=backend).double()
        s, v = m(x)
        grads = torch.autograd.grad((s * 2 + v).sum(), [x, *m.parameters()])
        results.append([s, v, *grads])
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_overridden_parameters_are_checked_like_written_ones():
    text = "neuron: t\nparameters: {tau: 2.0}\nstates: {v: 0.0}\nstep:\n  s: spike(v + x / tau)\n"
    with pytest.raises(flexsn_dsl.SpecError) as err:
        flexsn_dsl.loads(text, params={"tau": 0.0}, filename="t.yaml")
    assert err.value.line == 5 and "tau = 0 (params=)" in err.value.message


# Denominators the gradient divides by at several places: a line (d) and a compound one (2 + exp(-v)).
SHARED_DENOMINATORS = """
neuron: shared
inputs: [x]
parameters:
  tau: {value: 2.0, learnable: true}
states:
  v: 0.5
step:
  d: 1 + v * v + tau
  v: x / d + v / d ** 2 + x / (2 + exp(-v)) + v / (2 + exp(-v)) ** 3
outputs: [v]
"""


def test_shared_denominators_are_inverted_once():
    """The backward core inverts each shared denominator once and multiplies; its gradients match
    finite differences (gradcheck) and the torch backend's autograd (float64)."""
    source = compile_spec(text=SHARED_DENOMINATORS).triton_source
    backward = source[source.index("def shared_backward_core("):source.index("def shared_inference_kernel(")]
    assert "d__inv = _reciprocal(d)\n" in backward and not re.findall(r"/ d\b", backward)
    assert "_inv1 = _reciprocal(2.0 + _exp(-v))\n" in backward and "/ (" not in backward
    assert "/ _pow_" not in backward  # powers of a denominator are powers of its reciprocal
    torch.manual_seed(0)
    x = (torch.rand(5, 4, dtype=torch.float64) * 2 - 1).requires_grad_()
    v0 = (torch.rand(4, dtype=torch.float64) * 2 - 1).requires_grad_()
    tau = torch.tensor(2.0, dtype=torch.float64, requires_grad=True)
    grads = []
    for backend in ("triton", "torch"):
        m = flexsn_dsl.loads(SHARED_DENOMINATORS, backend=backend).double()

        def run(x, v0, tau):
            m.reset()
            m.states = {"v": v0}
            m.tau.data = tau.detach().clone()
            v = m(x)
            return v.sum() + (v * v).sum()
        if backend == "triton":
            assert torch.autograd.gradcheck(lambda x, v0: run(x, v0, tau), (x, v0), eps=1e-6, atol=1e-7)
            with torch.no_grad():
                numeric = (run(x, v0, tau + 1e-6) - run(x, v0, tau - 1e-6)) / 2e-6
        loss = run(x, v0, tau)
        grads.append(torch.autograd.grad(loss, [x, v0, m.tau]))
    assert grads[0][2].item() == pytest.approx(numeric.item(), rel=1e-6)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# A spike and a condition on values divided by the shared denominator d.
DECISIONS = """
neuron: branches
inputs: [x]
states:
  v: 0.5
step:
  d: 1 + v * v
  s: spike(x / d - 0.5)
  v: where(v / d > 0.2, x / d + v / d ** 2, x * v / d) * (1 - s)
outputs: [s, v]
"""


def test_branch_decisions_of_the_backward_are_the_forwards():
    """With shared reciprocals, the backward still decides its branches on the values the forward
    decided on (the spike argument and the condition divide as the forward does), and its
    gradients match the torch backend's autograd (float64)."""
    cores = compile_spec(text=DECISIONS).cores.source
    forward = cores[cores.index("def branches_forward_core("):cores.index("def branches_backward_core(")]
    backward = cores[cores.index("def branches_backward_core("):]
    spike_argument = next(line for line in forward.splitlines() if line.strip().startswith("s__u ="))
    assert spike_argument in backward.splitlines() and "/ d" in spike_argument
    assert "v / d > tl.full((), 0.2, d.dtype)" in backward and "d__inv = _reciprocal(d)\n" in backward
    torch.manual_seed(0)
    x = (torch.rand(6, 5, dtype=torch.float64) * 2).requires_grad_()
    results = []
    for backend in ("triton", "torch"):
        m = flexsn_dsl.loads(DECISIONS, backend=backend).double()
        s, v = m(x)
        results.append([s, v, *torch.autograd.grad((s * 3 + v * v).sum(), [x])])
    assert 0 < results[0][0].sum() < results[0][0].numel()  # both branches of the spike are taken
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


COMPILE_FOR_GPU = """
import sys
import triton
import triton.language as tl
from triton.backends.compiler import GPUTarget
from flexsn_dsl.compiler import compile_spec
fn = compile_spec(text=sys.stdin.read()).triton_module().shared_backward_kernel
signature = {a: "*fp32" for a in fn.arg_names}
signature.update(_T="i32", _N="i32")
# tiles of one step (_TC=1): no step is left after the last tile, and the compiler drops that loop
constants = dict(_BLOCK=128, _DTYPE=tl.float32, _STAGES=1, _TC=1, _HAS_STATE_GRADS=False, _HAS_FINAL_GRADS=False,
                 _WRITE_INIT_GRADS=False, _CARRY_SUMS=False)
signature.update({name: "constexpr" for name in constants})
kernel = triton.compile(triton.compiler.ASTSource(fn, signature, constants), target=GPUTarget("cuda", 90, 32),
                        options={"num_warps": 4})  # one neuron per thread
print(kernel.asm["ptx"])
"""


def test_compiled_reciprocals_and_exponentials_are_one_instruction_each(tmp_path):
    """Compiled for an NVIDIA GPU (offline, Triton's own toolchain), the float32 backward computes each
    shared reciprocal with rcp.approx.ftz and divides nowhere else, and exp(-v) is ex2.approx.ftz
    (the interpreter runs 1.0 / x and tl.exp)."""
    pytest.importorskip("triton.backends.nvidia")
    import subprocess
    import sys
    env = dict(os.environ, TRITON_INTERPRET="0", FLEXSN_DSL_CACHE=str(tmp_path), PYTHONPATH=str(ROOT))
    done = subprocess.run([sys.executable, "-c", COMPILE_FOR_GPU], input=SHARED_DENOMINATORS, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    ptx = done.stdout
    assert ptx.count("rcp.approx.ftz.f32") == 2  # d and 2 + exp(-v), once each (one neuron per thread)
    assert "div.full.f32" not in ptx and "div.rn.f32" not in ptx
    assert ptx.count("ex2.approx.ftz.f32") == 1 and "ex2.approx.f32" not in ptx  # exp(-v), once


class _NewTensors(torch.utils._python_dispatch.TorchDispatchMode):
    """Counts the tensors of ``shape`` that the ops run under it make (results that are neither views nor
    written in place, by each op's schema)."""

    def __init__(self, shape: tuple[int, ...]):
        super().__init__()
        self.shape, self.made = shape, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        results = out if isinstance(out, (tuple, list)) else (out,)
        self.made += sum(isinstance(t, torch.Tensor) and tuple(t.shape) == self.shape and r.alias_info is None
                         for t, r in zip(results, func._schema.returns))
        return out


@pytest.mark.parametrize("spec", ["lif", "li"])  # (li: the time-parallel kernels, in chunks)
def test_a_broadcast_upstream_gradient_lends_its_memory_to_the_input_gradient(spec, monkeypatch):
    """``out.sum()`` gives the backward a broadcast gradient, which the kernels read as a contiguous copy;
    the input's gradient takes that copy's memory: the backward makes one [T, N] tensor less than for
    ``(out * weight).sum()``, whose upstream gradient ``weight * 1`` is one [T, N] tensor more, made by
    autograd (the interpreter's own copies are the same in both). The gradients equal the torch backend's."""
    monkeypatch.setenv("FLEXSN_DSL_SCAN_CHUNK", "4")
    T, N = 11, 6
    x = torch.rand(T, N, dtype=torch.float64, generator=torch.Generator(torch.get_default_device()).manual_seed(2))
    weight = torch.rand(T, N, dtype=torch.float64, generator=torch.Generator(torch.get_default_device()).manual_seed(3))
    grads, counts = {}, {}
    for backend in ("torch", "triton"):
        for upstream in ("broadcast", "contiguous"):
            m = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend=backend).double()
            xg = x.clone().requires_grad_()
            out = m(xg)
            out = out[0] if isinstance(out, tuple) else out
            loss = (out * weight).sum() if upstream == "contiguous" else out.sum() * 2.0
            counter = _NewTensors((T, N))
            with counter:
                grads[backend, upstream], = torch.autograd.grad(loss, [xg])
            counts[backend, upstream] = counter.made
    assert counts["triton", "broadcast"] == counts["triton", "contiguous"] - 1
    for upstream in ("broadcast", "contiguous"):
        assert torch.allclose(grads["triton", upstream], grads["torch", upstream], rtol=1e-10, atol=1e-12)
