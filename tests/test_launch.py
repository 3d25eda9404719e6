"""How the generated kernels are launched: the direct launch of an already compiled specialization
(checked on the CPU against a stand-in kernel, and on a GPU against the torch backend), and, on a GPU,
the compiled step issuing the kernels itself (the traced operators)."""
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import triton_launch
from flexsn_dsl import triton_runtime as tr
from flexsn_dsl.triton_launch import DirectLaunch, _hooked
from flexsn_dsl.triton_plan import _kernels
from flexsn_dsl.triton_settings import interpreting, launch_settings

ROOT = Path(__file__).resolve().parents[1]
GPU = torch.cuda.is_available() and not interpreting()
gpu_only = pytest.mark.skipif(not GPU, reason="needs a GPU (the interpreter has no compiled kernels)")


class _Compiled:
    """A stand-in for Triton's CompiledKernel: records what its launcher gets."""

    function, packed_metadata = "function", "metadata"

    def __init__(self, calls):
        self.calls = calls

    def run(self, *args):
        self.calls.append(("direct", args))


class _Kernel:
    """A stand-in for a JIT kernel ``k(a, b, n, _B: constexpr, _F: constexpr)``: ``k[grid](...)`` is
    Triton's launch (recorded; returns the compiled kernel, as Triton's does)."""

    arg_names = ["a", "b", "n", "_B", "_F"]

    def __init__(self):
        self.calls = []

    def __getitem__(self, grid):
        def launch(*args, **keywords):
            self.calls.append(("jit", grid, args, keywords))
            return _Compiled(self.calls)
        return launch


def test_direct_launch_compiles_through_the_jit_once_per_specialization(monkeypatch):
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_launch, "_current_stream", lambda device: 1234)
    kernel = _Kernel()
    launch = DirectLaunch(kernel, (3,))
    flags = {"_F": True, "_B": 64, "num_warps": 2}
    storage = torch.zeros(64)
    a, b = storage[:16], storage[16:32]  # 16-byte aligned (64 and 128 bytes in)
    launch([a, b, 16], flags)
    launch([a, b, 16], flags)
    assert [c[0] for c in kernel.calls] == ["jit", "direct"]
    # the compiled kernel's launcher: grid padded to 3, stream, handles, no hooks, then every argument
    # followed by the constexprs in the kernel's declaration order
    assert kernel.calls[1][1] == (3, 1, 1, 1234, "function", "metadata", None, None, None, a, b, 16, 64, True)
    unaligned = storage[1:17]  # 4 bytes in: Triton specializes it apart
    launch([unaligned, b, 16], flags)
    launch([a.double(), b, 16], flags)  # another dtype
    launch([a, b, 17], flags)  # another integer
    launch([a, b, 16], dict(flags))  # other keywords
    assert [c[0] for c in kernel.calls[2:]] == ["jit"] * 4
    for args in ([unaligned, b, 16], [a.double(), b, 16], [a, b, 17]):
        launch(args, flags)
    assert [c[0] for c in kernel.calls[6:]] == ["direct"] * 3


@pytest.mark.parametrize("kind", ["function", "chain"])
def test_direct_launch_leaves_profiler_hooks_to_triton(monkeypatch, kind):
    """A launch hook (a function in Triton 3.6, a chain of calls in later versions, as a profiler sets
    it) gets Triton's own launch, with its metadata."""
    import triton
    monkeypatch.setattr(torch.cuda, "current_device", lambda: 0)
    monkeypatch.setattr(triton_launch, "_current_stream", lambda device: 0)
    hook = lambda metadata: None  # noqa: E731
    if kind == "chain":
        if not hasattr(triton.knobs, "HookChain"):
            pytest.skip("this Triton's launch hooks are plain functions")
        chain = triton.knobs.HookChain()
        assert not _hooked(chain)  # (an empty chain, as Triton 3.9 starts with, is no hook)
        chain.add(hook)
        hook = chain
    monkeypatch.setattr(triton.knobs.runtime, "launch_enter_hook", hook)
    kernel = _Kernel()
    launch = DirectLaunch(kernel, (1,))
    flags = {"_F": False, "_B": 16}
    x = torch.zeros(4)
    for _ in range(3):
        launch([x, x, 4], flags)
    assert [c[0] for c in kernel.calls] == ["jit"] * 3


@gpu_only
@pytest.mark.parametrize("offset", [0, 1])
def test_direct_launches_match_the_torch_backend(offset):
    """Calls from aligned and from 4-byte-offset inputs (Triton compiles those apart) alternate; every
    call's spikes, input gradient and final state equal the torch backend's."""
    ours = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton")
    reference = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="torch")
    storage = torch.rand(4 * 8 * 100 + 1, generator=torch.Generator().manual_seed(5), device="cpu").cuda() * 3
    for call in range(4):
        start = offset if call % 2 else 0
        x = storage[start:start + 4 * 8 * 100].view(4, 8, 100).requires_grad_()
        results = []
        for module in (ours, reference):
            module.reset()
            y = module(x)
            (g,) = torch.autograd.grad((y * torch.arange(100.0)).sum() + module.states["v"].sum(), [x])
            results.append((y, g, module.states["v"]))
        for a, b in zip(*results):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    plan = _kernels(ours._compiled, "cuda").plan(torch.Size([4, 8, 100]), torch.float32, launch_settings())
    assert isinstance(plan.launchers["forward_final_state"], DirectLaunch)
    assert len(plan.launchers["forward_final_state"].compiled) == (2 if offset else 1)


@gpu_only
def test_a_compiled_training_step_issues_the_kernels_itself(fresh_dynamo):
    """Under torch.compile on a GPU the step's code launches the generated kernels (forward and backward)
    with no call of the opaque operators; its results equal eager ones."""
    from torch._inductor.utils import run_and_get_code
    torch.manual_seed(3)
    m = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton")
    w, k = torch.rand(6, 6), torch.arange(6.0)

    def step(x):
        m.reset()
        y = m(x @ w)
        loss = (y * k).sum() + m.states["v"].sum()
        loss.backward()
        return y.detach(), m.w.grad

    x = torch.rand(5, 3, 6, generator=torch.Generator().manual_seed(4), device="cpu").cuda() * 3
    x.requires_grad_()
    expected = [t.clone() for t in step(x)]
    m.w.grad = None
    x.grad = None
    got, codes = run_and_get_code(torch.compile(step), x)
    code = "\n".join(codes)
    assert "plif_forward_final_state_kernel" in code and "plif_backward_kernel" in code
    assert "fused_forward" not in code and "fused_backward" not in code
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


@gpu_only
@pytest.mark.parametrize("spec", ["lif", "plif"])
def test_a_step_compiled_with_dynamic_shapes_issues_the_kernels_itself(spec, fresh_dynamo):
    """With dynamic shapes (sizes symbolic in the compiled code) the traced operators launch over the
    sizes of each call: two batch sizes, one compiled step, results equal to eager ones. A spec with
    learnable parameters calls the opaque operators there."""
    from torch._inductor.utils import run_and_get_code
    m = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton")
    k = torch.arange(7.0)

    def step(x):
        m.reset()
        y = m(x * 1.5)
        (y * k).sum().backward()
        return y.detach()

    compiled = torch.compile(step, dynamic=True)
    for batch in (3, 37):
        x = torch.rand(4, batch, 7, generator=torch.Generator().manual_seed(batch), device="cpu").cuda() * 2
        expected = []
        for run in (step, compiled):
            leaf = x.clone().requires_grad_()
            for p in m.parameters():
                p.grad = None
            if run is compiled and batch == 3:
                y, codes = run_and_get_code(run, leaf)
                code = "\n".join(codes)
                traced = f"{spec}_backward_kernel" in code and "fused_forward" not in code
                assert traced == (spec == "lif")
            elif run is compiled:
                with torch.compiler.set_stance("fail_on_recompile"):  # (the sizes are symbolic: no recompilation)
                    y = run(leaf)
            else:
                y = run(leaf)
            expected.append([y, leaf.grad, *[p.grad for p in m.parameters()]])
        for a, b in zip(*expected):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


# --------------------------------------------------------------------------
# the shortcut: a call like the last one (inference or training), from reset states, skips the general path
# --------------------------------------------------------------------------
DEVICE = "cuda" if GPU else "cpu"


@pytest.fixture
def general_calls(monkeypatch):
    """The number of calls that took the general path (``run_triton``)."""
    calls = []
    run = tr.run_triton
    monkeypatch.setattr(tr, "run_triton", lambda *args: calls.append(1) or run(*args))
    return calls


def _inputs(seed: int, shape=(6, 3, 5)) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(shape, generator=g, device="cpu") * 2).to(DEVICE)


@pytest.mark.parametrize("spec", ["lif", "lif_refractory"])  # one output and state; two of each
def test_inference_shortcut_gives_what_the_torch_backend_does(spec, general_calls):
    ours = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton")
    reference = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="torch")
    with torch.no_grad():
        for seed in range(4):
            x = _inputs(seed)
            ours.reset(), reference.reset()
            got, want = ours(x), reference(x)
            for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
                torch.testing.assert_close(a, b)
            assert ours.states.keys() == reference.states.keys()
            for name in ours.states:
                torch.testing.assert_close(ours.states[name], reference.states[name])
    assert len(general_calls) == 1  # the first call built the shortcut; the other three took it


def test_inference_shortcut_steps_aside_for_what_it_does_not_check(general_calls, monkeypatch):
    ours = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="triton")
    reference = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="torch")
    x = _inputs(0)
    with torch.no_grad():
        ours(x)
        torch.testing.assert_close(ours(x), reference(reference(x) * 0 + x))  # states carried: a second call
    assert len(general_calls) == 2
    cases = {"another shape": _inputs(1, (6, 3, 4)), "not contiguous": _inputs(2, (6, 5, 3)).transpose(1, 2),
             "another dtype": _inputs(3).double()}
    for what, y in cases.items():
        ours.reset(), reference.reset()
        with torch.no_grad():
            torch.testing.assert_close(ours(y), reference(y), msg=what)
    assert len(general_calls) == 2 + len(cases)
    ours.reset()
    y = _inputs(4).requires_grad_()  # a gradient is needed: the general path, with its autograd
    ours(y).sum().backward()
    reference.reset()
    z = y.detach().clone().requires_grad_()
    reference(z).sum().backward()
    torch.testing.assert_close(y.grad, z.grad)
    assert len(general_calls) == 3 + len(cases)
    ours.reset()
    with torch.no_grad():
        ours(_inputs(5))  # (builds the shortcut for these inputs again)
    monkeypatch.setenv("FLEXSN_DSL_STAGES", "many")  # a bad launch setting is refused on the shortcut too
    ours.reset()
    with torch.no_grad(), pytest.raises(ValueError, match="FLEXSN_DSL_STAGES='many'"):
        ours(_inputs(5))
    assert len(general_calls) == 4 + len(cases)


def _trained(m, x: torch.Tensor) -> list[torch.Tensor]:
    """A training call from reset states whose loss weighs every output and final state: the outputs,
    final states and the input's gradient."""
    m.reset()
    leaf = x.clone().requires_grad_()
    ys = m(leaf)
    ys = list(ys) if isinstance(ys, tuple) else [ys]
    finals = [m.states[name] for name in m.spec.states]
    loss = sum(((k + 1) * torch.linspace(-1, 1, t.numel(), device=t.device).reshape(t.shape) * t).sum()
               for k, t in enumerate(ys + finals))
    loss.backward()
    return [*ys, *finals, leaf.grad]


@pytest.mark.parametrize("spec", ["lif", "lif_refractory"])
def test_training_shortcut_gives_the_torch_backends_outputs_states_and_gradients(spec, general_calls):
    """Four training calls like the first take the shortcut (the general path's autograd Function, its
    arguments worked out once), gradients through the final states included; an inference call then
    takes the general path and is right too."""
    ours = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="triton")
    reference = flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend="torch")
    for seed in range(4):
        x = _inputs(seed)
        for a, b in zip(_trained(ours, x), _trained(reference, x)):
            torch.testing.assert_close(a, b)
    assert len(general_calls) == 1
    ours.reset(), reference.reset()
    with torch.no_grad():
        got, want = ours(x), reference(x)
    torch.testing.assert_close(got, want)
    assert len(general_calls) == 2  # another mode: the general path (which builds an inference shortcut)
    for a, b in zip(_trained(ours, x), _trained(reference, x)):
        torch.testing.assert_close(a, b)
    assert len(general_calls) == 3
    needs_grad = x.clone().requires_grad_()  # an input that needs a gradient, in a mode that computes none
    for mode in (torch.no_grad, torch.inference_mode):
        ours.reset(), reference.reset()
        with mode():
            got, want = ours(needs_grad), reference(needs_grad)
        for a, b in zip(got if isinstance(got, tuple) else [got], want if isinstance(want, tuple) else [want]):
            assert not a.requires_grad
            torch.testing.assert_close(a, b)
    # not the training shortcut: the first took the general path (building the inference shortcut), the second that
    assert len(general_calls) == 4


def test_training_shortcut_is_not_built_where_the_general_path_detaches_the_input(general_calls):
    """An input whose gradient is known to be zero is detached by the general path, so the output needs
    no gradient; the shortcut is not built for such a call, so every call keeps doing that."""
    spec = "neuron: n\ninputs: [x]\nstates: {v: 0}\nstep:\n  h: v + detach(x)\n  s: spike(h - 1)\n  v: h - s\n" \
           "outputs: [s]\n"
    m = flexsn_dsl.loads(spec, backend="triton")
    for seed in range(3):
        m.reset()
        assert not m(_inputs(seed).requires_grad_()).requires_grad
    assert m._fast is None and len(general_calls) == 3


def test_inference_shortcut_survives_copies_and_moves_and_is_not_built_for_parameters():
    import copy
    import pickle
    m = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="triton")
    x = _inputs(0)
    with torch.no_grad():
        want = m(x)
        for clone in (copy.deepcopy(m), pickle.loads(pickle.dumps(m))):
            clone.reset()
            torch.testing.assert_close(clone(x), want)
    plif = flexsn_dsl.load(ROOT / "neurons" / "plif.yaml", backend="triton")
    with torch.no_grad():
        plif(x)
    assert plif._fast is None and m._fast is not None


@gpu_only
@pytest.mark.parametrize("default", ["0", "1"])
def test_kernels_fuse_multiply_adds_whatever_tritons_default(default, monkeypatch):
    """Every launch asks for fused multiply-adds (``COMPILE_OPTIONS``): with ``TRITON_DEFAULT_FP_FUSION=0``
    (Triton 3.10's default) the compiled kernels of a LIF step (``a * x + b * v``) still have them. A spec
    of its own, so that its kernels are compiled here, under that setting."""
    monkeypatch.setenv("TRITON_DEFAULT_FP_FUSION", default)
    text = (ROOT / "neurons" / "lif.yaml").read_text().replace("neuron: lif", f"neuron: lif_fma_{default}")
    m = flexsn_dsl.loads(text, backend="triton")
    x = torch.rand(8, 1000, device="cuda", requires_grad=True)
    m(x).sum().backward()
    with torch.no_grad():
        m.reset()
        m(x)
    plan = _kernels(m._compiled, "cuda").plan(x.shape, x.dtype, launch_settings())
    ptx = {v: entry[0].asm["ptx"] for v, launcher in plan.launchers.items() for entry in launcher.compiled.values()}
    assert {"inference_final_state", "forward_final_state", "backward"} <= set(ptx)
    assert all("fma.rn.f32" in code for code in ptx.values()), [v for v, code in ptx.items() if "fma.rn" not in code]
