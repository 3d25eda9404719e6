"""The ``nn.Module`` that ``flexsn_dsl.load`` / ``flexsn_dsl.loads`` return.

The contract's Python API (``step_mode``, ``states``, ``state_seqs``, ``reset()``,
learnable parameters as ``nn.Parameter``\\ s, ``params=`` overrides, ``.to()`` and dtype
moves) in float16/bfloat16/float32/float64, ``state_dict``, ``copy.deepcopy``, pickle,
``DistributedDataParallel`` (two gloo processes on the CPU) and ``torch.compile``.

Every check runs against an independent reference: the hand-written torch steps
below (written from the models' equations, with the surrogate gradients written
out), or, for the Triton backend, the torch backend. On a machine with CUDA the
device-parametrised tests also run there.
"""
from __future__ import annotations

import copy
import io
import math
import os
import pickle
import socket
import types
from pathlib import Path

import pytest
import torch
from torch import nn

import flexsn_dsl

NEURONS = Path(__file__).resolve().parents[1] / "neurons"
F64 = torch.float64

DEVICES = ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(),
                                                                   reason="no CUDA device"))]
TIGHT = dict(rtol=1e-9, atol=1e-11)       # float64 against float64
F32 = dict(rtol=1e-5, atol=1e-6)          # float32 against a float64 reference


# --------------------------------------------------------------------------
# hand-written references
# --------------------------------------------------------------------------


def _sg_sigmoid(x, alpha=4.0):
    sg = torch.sigmoid(alpha * x)
    return alpha * sg * (1.0 - sg)


def _sg_atan(x, alpha=2.0):
    return alpha / 2.0 / (1.0 + (math.pi / 2.0 * alpha * x) ** 2)


def _sg_triangle(x, alpha=1.0):
    return alpha * torch.clamp(1.0 - alpha * x.abs(), min=0.0)


class _Spike(torch.autograd.Function):
    @staticmethod
    def forward(ctx, u, grad_fn):
        ctx.save_for_backward(u)
        ctx.grad_fn = grad_fn
        return (u >= 0).to(u.dtype)

    @staticmethod
    def backward(ctx, g):
        (u,) = ctx.saved_tensors
        return g * ctx.grad_fn(u), None


def _spike(u, grad_fn=_sg_sigmoid):
    return _Spike.apply(u, grad_fn)


def _ref_lif(xs, st, p):
    (x,), v = xs, st["v"]
    tau, v_th, v_reset = p.get("tau", 2.0), p.get("v_th", 1.0), p.get("v_reset", 0.0)
    h = v + (x - (v - v_reset)) / tau
    s = _spike(h - v_th)
    return (s,), {"v": h * (1.0 - s) + v_reset * s}


def _ref_plif(xs, st, p):
    (x,), v = xs, st["v"]
    h = v + (x - v) * torch.sigmoid(torch.as_tensor(p.get("w", 0.0), dtype=x.dtype))
    s = _spike(h - p.get("v_th", 1.0))
    return (s,), {"v": h * (1.0 - s)}


def _ref_alif(xs, st, p):
    (x,), v, b = xs, st["v"], st["b"]
    h = v + (x - v) / 2.0
    b_dec = b + (0.6 - b) / 5.0
    s = _spike(h - b_dec, _sg_triangle)
    z = s.detach()
    return (s,), {"v": (1.0 - z) * h, "b": b_dec + p.get("beta", 0.5) * z}


def _ref_leaky(xs, st, p):
    (x,), mem = xs, st["mem"]
    r = _spike(mem - 1.0, _sg_atan).detach()
    beta = torch.as_tensor(p.get("beta", 0.8), dtype=x.dtype)
    mem = torch.clamp(beta, 0.0, 1.0) * mem + x - r
    return (_spike(mem - 1.0, _sg_atan), mem), {"mem": mem}


# A two-input, two-output spec given as text (for loads): a learnable gain k.
GATED = """\
neuron: gated
description: two inputs, two outputs, a learnable parameter
inputs: [x, g]
parameters:
  tau: 2.0
  k: {value: 0.5, learnable: true}
states:
  v: 0.0
step:
  h: v + (x * sigmoid(g) - v) / tau + k * g
  s: spike(h - 1.0)
  v: h * (1 - s)
outputs: [s, h]
"""


def _ref_gated(xs, st, p):
    (x, g), v = xs, st["v"]
    h = v + (x * torch.sigmoid(g) - v) / 2.0 + p.get("k", 0.5) * g
    s = _spike(h - 1.0)
    return (s, h), {"v": h * (1.0 - s)}


REFS = {  # name -> (step, initial states)
    "lif": (_ref_lif, {"v": 0.0}),
    "plif": (_ref_plif, {"v": 0.0}),
    "alif": (_ref_alif, {"v": 0.0, "b": 0.6}),
    "leaky": (_ref_leaky, {"mem": 0.0}),
    "gated": (_ref_gated, {"v": 0.0}),
}


def run_ref(name, xs, params=None, states=None):
    """Run the reference over ``[T, ...]`` inputs; returns (outputs, final states, state seqs)."""
    step, init = REFS[name]
    params = params or {}
    st = states or {k: torch.full_like(xs[0][0], v) for k, v in init.items()}
    outs, seqs = [], []
    for t in range(xs[0].shape[0]):
        o, st = step(tuple(x[t] for x in xs), st, params)
        outs.append(o)
        seqs.append(st)
    outputs = tuple(torch.stack([o[k] for o in outs]) for k in range(len(outs[0])))
    return outputs, st, {k: torch.stack([s[k] for s in seqs]) for k in st}


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _interpreting():
    from flexsn_dsl.triton_runtime import interpreting
    return interpreting()


def _triton_device():
    """Where the non-device-parametrised Triton tests run: the interpreter on the CPU,
    or the GPU where there is one (the interpreter is then off)."""
    return "cpu" if _interpreting() else "cuda"


def _need_triton_on(device):
    if device == "cpu" and not _interpreting():
        pytest.skip("Triton's interpreter is off (a CUDA machine): CPU tensors cannot use backend='triton'")


def _load(name, **kw):
    if name == "gated":
        return flexsn_dsl.loads(GATED, **kw)
    return flexsn_dsl.load(NEURONS / f"{name}.yaml", **kw)


def _tuple(y):
    return tuple(y) if isinstance(y, tuple) else (y,)


def _inputs(name, T, shape, seed=0, dtype=F64, device=None):
    gen = torch.Generator().manual_seed(seed)
    n_in = 2 if name == "gated" else 1
    xs = [torch.rand((T, *shape), generator=gen, dtype=F64, device="cpu") * 2.5 for _ in range(n_in)]
    if name == "gated":
        xs[1] = xs[1] - 1.25
    return [x.to(device=device or torch.get_default_device(), dtype=dtype) for x in xs]


def _leaves(xs, requires_grad=True):
    return [x.detach().clone().requires_grad_(requires_grad) for x in xs]


def _weights(like, seed):
    gen = torch.Generator().manual_seed(seed)
    return [torch.randn(t.shape, generator=gen, dtype=F64, device="cpu").to(t.device) for t in like]


def _loss(outs, finals, w_out, w_st):
    """A random weighted sum of outputs and final states (computed in float64)."""
    return (sum((w * o.to(F64)).sum() for w, o in zip(w_out, outs))
            + sum((w * s.to(F64)).sum() for w, s in zip(w_st, finals)))


def _rel(a, b):
    a, b = a.detach().to(F64), b.detach().to(F64)
    return float((a - b).norm() / b.norm().clamp_min(1e-30))


def _val(p):
    return p.detach().item()


def _assert_spiking(s):
    n = int(s.sum())
    assert bool(((s == 0) | (s == 1)).all()) and 0 < n < s.numel(), f"{n}/{s.numel()} spikes: not meaningful"


# --------------------------------------------------------------------------
# the module's API
# --------------------------------------------------------------------------


def test_load_returns_module_with_contract_api():
    m = flexsn_dsl.load(NEURONS / "alif.yaml")
    assert isinstance(m, nn.Module) and isinstance(m, flexsn_dsl.FlexSN)
    assert m.step_mode == "m" and m.states == {} and m.state_seqs == {}
    assert isinstance(m.info, flexsn_dsl.FlexSNInfo)
    named = dict(m.named_parameters())
    assert list(named) == ["beta"]
    assert isinstance(named["beta"], nn.Parameter) and named["beta"].requires_grad
    assert _val(named["beta"]) == pytest.approx(0.5)
    assert m.beta is named["beta"]
    # every parameter is in the state dict; constants are float64 0-dim buffers, no parameters
    assert set(m.state_dict()) == {"beta", "tau_m", "tau_a", "v_th", "v_reset"}
    assert m.tau_m.dtype == torch.float64 and m.tau_m.shape == () and not m.tau_m.requires_grad
    assert dict(flexsn_dsl.load(NEURONS / "lif.yaml").named_parameters()) == {}

    xs = _inputs("alif", 6, (3, 4), dtype=torch.float32)
    y = m(*xs)
    assert isinstance(y, torch.Tensor) and y.shape == (6, 3, 4) and y.dtype == torch.float32
    assert set(m.states) == {"v", "b"} and m.states["v"].shape == (3, 4)
    assert m.state_seqs == {}
    m.reset()
    assert m.states == {} and m.state_seqs == {}


def test_bad_step_mode_and_backend():
    with pytest.raises(ValueError, match="step_mode"):
        flexsn_dsl.load(NEURONS / "lif.yaml", step_mode="x")
    with pytest.raises(ValueError, match="backend"):
        flexsn_dsl.load(NEURONS / "lif.yaml", backend="cuda")


@pytest.mark.parametrize("name", ["lif", "plif", "alif", "leaky"])
def test_torch_backend_float64_matches_reference(name):
    m = _load(name, backend="torch").to(F64)
    xs = _inputs(name, 8, (4, 5))
    xm, xr = _leaves(xs), _leaves(xs)
    params = {k: v.detach().clone().requires_grad_() for k, v in m.named_parameters()}
    outs = _tuple(m(*xm))
    outs_r, st_r, _ = run_ref(name, xr, params)
    for o, o_r in zip(outs, outs_r):
        torch.testing.assert_close(o, o_r, **TIGHT)
    _assert_spiking(outs[0])
    finals = [m.states[k] for k in st_r]
    for f, k in zip(finals, st_r):
        torch.testing.assert_close(f, st_r[k], **TIGHT)
    w_out, w_st = _weights(outs_r, 1), _weights(list(st_r.values()), 2)
    _loss(outs, finals, w_out, w_st).backward()
    grads = torch.autograd.grad(_loss(outs_r, list(st_r.values()), w_out, w_st), [*xr, *params.values()])
    torch.testing.assert_close(xm[0].grad, grads[0], **TIGHT)
    for (k, p), g in zip(m.named_parameters(), grads[1:]):
        torch.testing.assert_close(p.grad, g, rtol=1e-9, atol=1e-9)


def test_params_override():
    xs = _inputs("plif", 8, (20,))
    m = flexsn_dsl.load(NEURONS / "plif.yaml", backend="torch", params={"w": 0.7, "v_th": 0.8}).double()
    assert _val(m.w) == pytest.approx(0.7)  # the learnable parameter's initial value
    with torch.no_grad():
        y = m(*xs)
        y_r, st_r, _ = run_ref("plif", xs, {"w": _val(m.w), "v_th": 0.8})
        y_default, _, _ = run_ref("plif", xs)
    torch.testing.assert_close(y, y_r[0], **TIGHT)
    torch.testing.assert_close(m.states["v"], st_r["v"], **TIGHT)
    assert not torch.equal(y_r[0], y_default[0]), "the override changes nothing: not meaningful"


# --------------------------------------------------------------------------
# dtypes and devices
# --------------------------------------------------------------------------


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16],
                         ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", ["plif", "leaky"])
def test_torch_backend_dtypes(name, dtype, device):
    """Every dtype through the torch backend, against the float64 reference on the
    same (rounded) inputs: tight in float64/float32, loose in 16 bits."""
    m = _load(name, backend="torch", params={"w": 0.3} if name == "plif" else None).to(device=device, dtype=dtype)
    for p in m.parameters():
        assert p.dtype == dtype and p.device.type == device
    xs = _inputs(name, 8, (4, 64), seed=3, dtype=dtype, device=device)
    xm = _leaves(xs)
    xr = _leaves([x.to(F64) for x in xs])
    params = {k: v.detach().to(F64).requires_grad_() for k, v in m.named_parameters()}

    outs = _tuple(m(*xm))
    finals = list(m.states.values())
    for t in (*outs, *finals):
        assert t.dtype == dtype and t.device.type == device
    outs_r, st_r, _ = run_ref(name, xr, params)
    w_out, w_st = _weights(outs_r, 4), _weights(list(st_r.values()), 5)
    _loss(outs, finals, w_out, w_st).backward()
    grads = torch.autograd.grad(_loss(outs_r, list(st_r.values()), w_out, w_st), [*xr, *params.values()])
    assert xm[0].grad.dtype == dtype
    (p,) = m.parameters()
    assert p.grad is not None and p.grad.dtype == dtype

    _assert_spiking(outs[0])
    if dtype in (torch.float64, torch.float32):
        tol = TIGHT if dtype == torch.float64 else F32
        for o, o_r in zip(outs, outs_r):
            torch.testing.assert_close(o.to(F64), o_r, **tol)
        for f, f_r in zip(finals, st_r.values()):
            torch.testing.assert_close(f.to(F64), f_r, **tol)
        torch.testing.assert_close(xm[0].grad.to(F64), grads[0], **tol)
        torch.testing.assert_close(p.grad.to(F64), grads[1], rtol=1e-4 if dtype == torch.float32 else 1e-9, atol=1e-6)
    else:  # 16-bit: every op rounds; a spike may flip where h lands within rounding of v_th
        assert (outs[0].to(F64) != outs_r[0]).to(F64).mean() <= 0.01
        for o, o_r in zip([*outs[1:], *finals], [*outs_r[1:], *st_r.values()]):
            assert _rel(o, o_r) < 0.05
        assert _rel(xm[0].grad, grads[0]) < 0.08
        assert _rel(p.grad, grads[1]) < 0.08


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=lambda d: str(d).split(".")[-1])
@pytest.mark.parametrize("name", ["plif", "leaky"])
def test_triton_dtypes_against_torch_backend(name, dtype, device):
    """The Triton backend computes in float32 for 16-bit storage: equal to the torch
    backend in float32 on the same rounded inputs, up to the rounding of the results."""
    _need_triton_on(device)
    mt = _load(name, backend="triton").to(device=device, dtype=dtype)
    mr = _load(name, backend="torch").to(device=device)
    mr.load_state_dict({k: v.float() for k, v in mt.state_dict().items()})  # the same rounded values
    xs = _inputs(name, 8, (4, 64), seed=6, dtype=dtype, device=device)
    xt, xr = _leaves(xs), _leaves([x.float() for x in xs])
    outs_t, outs_r = _tuple(mt(*xt)), _tuple(mr(*xr))
    fin_t, fin_r = list(mt.states.values()), list(mr.states.values())
    for t in (*outs_t, *fin_t):
        assert t.dtype == dtype and t.device.type == device
    tol = F32 if dtype == torch.float32 else dict(rtol=1e-2 if dtype == torch.float16 else 2e-2, atol=1e-3)
    torch.testing.assert_close(outs_t[0].float(), outs_r[0], rtol=0, atol=0)  # spikes: exactly
    _assert_spiking(outs_t[0])
    for a, b in zip([*outs_t[1:], *fin_t], [*outs_r[1:], *fin_r]):
        torch.testing.assert_close(a.float(), b, **tol)
    w_out, w_st = _weights(outs_r, 7), _weights(fin_r, 8)
    _loss(outs_t, fin_t, w_out, w_st).backward()
    _loss(outs_r, fin_r, w_out, w_st).backward()
    assert xt[0].grad.dtype == dtype
    if dtype != torch.float32:  # the gradients coming in were rounded to 16 bits too
        tol = dict(rtol=tol["rtol"], atol=tol["rtol"] * float(xr[0].grad.abs().max()))
    torch.testing.assert_close(xt[0].grad.float(), xr[0].grad, **tol)
    (pt,), (pr,) = mt.parameters(), mr.parameters()
    assert pt.grad.dtype == dtype
    torch.testing.assert_close(pt.grad.float(), pr.grad, rtol=1e-4 if dtype == torch.float32 else 2e-2, atol=1e-4)


def test_to_and_double_move_parameters_and_states():
    xs = _inputs("alif", 5, (3, 4))
    m = flexsn_dsl.load(NEURONS / "alif.yaml", backend="torch")
    assert m.beta.dtype == torch.float32
    with torch.no_grad():
        m(xs[0].float())
    assert m.states["v"].dtype == torch.float32
    assert m.double() is m and m.beta.dtype == F64
    assert all(s.dtype == F64 for s in m.states.values()), "states move with the module"
    m.reset()
    m2 = flexsn_dsl.load(NEURONS / "alif.yaml", backend="torch").to(torch.float64)
    assert m2.beta.dtype == F64
    for mod in (m, m2):
        y = mod(*_leaves(xs))
        assert y.dtype == F64 and mod.states["b"].dtype == F64
        y_r, st_r, _ = run_ref("alif", xs, {"beta": _val(mod.beta)})
        torch.testing.assert_close(y, y_r[0], **TIGHT)
        torch.testing.assert_close(mod.states["b"], st_r["b"], **TIGHT)
    m.half()
    assert m.beta.dtype == torch.float16 and m.states["v"].dtype == torch.float16


@pytest.mark.parametrize("device", DEVICES)
def test_backend_auto(device, monkeypatch):
    """"auto" picks torch for CPU tensors (the Triton kernels are never launched) and
    Triton for CUDA tensors."""
    import flexsn_dsl.triton_runtime as tr
    m = flexsn_dsl.load(NEURONS / "plif.yaml").to(device)
    assert m.backend == "auto"
    x = torch.rand(4, 10, device=device)
    if device == "cpu":
        def fail(*a, **k):
            raise AssertionError("backend='auto' ran the Triton kernels on the CPU")
        monkeypatch.setattr(tr, "run_triton", fail)
        assert m._choose_backend(x[0]) == "torch"
    else:
        assert m._choose_backend(x[0]) == "triton"
    y = m(x)
    y_r, _, _ = run_ref("plif", [x.double()])
    torch.testing.assert_close(y.double(), y_r[0])


def test_backend_auto_builds_the_kernels_once_per_generated_code(monkeypatch):
    """"auto" with CUDA inputs builds the Triton kernels at the first call, not at every call (nor
    again after one failed: it warns once and runs the torch step); specialize() builds the new code's."""
    from flexsn_dsl.compiler import Compiled
    from flexsn_dsl.errors import SpecError
    cuda_input = types.SimpleNamespace(is_cuda=True)  # (_choose_backend reads only this)
    built = []
    monkeypatch.setattr(Compiled, "triton_module", lambda self: built.append(self))
    m = flexsn_dsl.load(NEURONS / "lif.yaml")
    assert [m._choose_backend(cuda_input) for _ in range(3)] == ["triton"] * 3 and built == [m._compiled]
    m.specialize()
    assert m._choose_backend(cuda_input) == "triton" and built == [built[0], m._compiled]

    def fail(self):
        built.append(self)
        raise SpecError("cannot lower")
    monkeypatch.setattr(Compiled, "triton_module", fail)
    m = flexsn_dsl.load(NEURONS / "lif.yaml")
    with pytest.warns(UserWarning, match="cannot build this spec, falling back to torch: .*cannot lower"):
        assert m._choose_backend(cuda_input) == "torch"
    assert [m._choose_backend(cuda_input) for _ in range(2)] == ["torch"] * 2 and len(built) == 3


@pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.device_count() < 2, reason="needs two GPUs")
@pytest.mark.parametrize("spec,sizes", [("lif", None), ("plif", None), ("rlif", {"N": 16})])
def test_triton_runs_on_the_inputs_gpu_when_another_is_current(spec, sizes):
    """Triton launches on the current device: with cuda:0 current, a module and inputs on cuda:1 give the
    torch backend's outputs, final states and gradients there (inference and training), and cuda:0
    stays current."""
    torch.manual_seed(3)
    device = torch.device("cuda", 1)
    ours = flexsn_dsl.load(NEURONS / f"{spec}.yaml", backend="triton", sizes=sizes).to(device, F64)
    reference = flexsn_dsl.load(NEURONS / f"{spec}.yaml", backend="torch", sizes=sizes).to(device, F64)
    reference.load_state_dict(ours.state_dict())
    x = (2 * torch.rand(5, 3, 16, dtype=F64, device=device)).requires_grad_(True)
    with torch.cuda.device(0):
        results = []
        for m in (ours, reference):
            m.reset()
            with torch.no_grad():
                inference = m(x)
            m.reset()
            y = m(x)
            grads = torch.autograd.grad((y * torch.arange(16, device=device)).sum() + m.states["v"].sum(),
                                        [x, *m.parameters()])
            results.append([inference, y, m.states["v"], *grads])
        assert torch.cuda.current_device() == 0
    assert results[1][0].sum() > 0  # some spikes
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, **TIGHT)


# --------------------------------------------------------------------------
# inputs: several, positional; wrong count or shape; single-step mode
# --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_loads_text_with_two_inputs_and_outputs(backend):
    dev = _triton_device() if backend == "triton" else "cpu"
    m = flexsn_dsl.loads(GATED, backend=backend).to(dev, F64)
    assert [n for n, _ in m.named_parameters()] == ["k"]
    xs = _inputs("gated", 8, (4, 6), seed=2, device=dev)
    xm, xr = _leaves(xs), _leaves(xs)
    k = m.k.detach().clone().requires_grad_()
    s, h = m(*xm)  # positional, in `inputs` order
    (s_r, h_r), st_r, _ = run_ref("gated", xr, {"k": k})
    torch.testing.assert_close(s, s_r, **TIGHT)
    torch.testing.assert_close(h, h_r, **TIGHT)
    _assert_spiking(s)
    w = _weights([s_r, h_r, st_r["v"]], 9)
    _loss((s, h), [m.states["v"]], w[:2], w[2:]).backward()
    grads = torch.autograd.grad(_loss((s_r, h_r), [st_r["v"]], w[:2], w[2:]), [*xr, k])
    for a, b in zip([*[x.grad for x in xm], m.k.grad], grads):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-10)
    # the order matters: swapped inputs compute something else
    m.reset()
    with torch.no_grad():
        assert not torch.equal(m(xs[1], xs[0])[1], h_r)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_wrong_inputs_raise(backend):
    m = flexsn_dsl.loads(GATED, backend=backend)
    x = torch.rand(4, 3)
    with pytest.raises(TypeError, match="2 input"):
        m(x)
    with pytest.raises(TypeError, match="2 input"):
        m(x, x, x)
    with pytest.raises(ValueError, match="shape"):
        m(x, torch.rand(4, 5))
    with pytest.raises(ValueError, match=r"\[T, \.\.\.\]"):
        flexsn_dsl.load(NEURONS / "lif.yaml", backend=backend)(torch.tensor(1.0))
    assert m.states == {}, "a failed call must not leave states behind"


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_single_step_mode(backend):
    dev = _triton_device()
    xs = _inputs("leaky", 6, (2, 7), device=dev)
    m = flexsn_dsl.load(NEURONS / "leaky.yaml", step_mode="s", backend=backend, store_state_seqs=True).to(dev, F64)
    assert m.step_mode == "s"
    steps = []
    for t in range(6):
        spk, mem = m(xs[0][t])
        assert spk.shape == (2, 7) and m.state_seqs["mem"].shape == (2, 7)
        steps.append((spk, mem))
    (spk_r, mem_r), st_r, _ = run_ref("leaky", xs, {"beta": _val(m.beta)})
    torch.testing.assert_close(torch.stack([s for s, _ in steps]), spk_r, **TIGHT)
    torch.testing.assert_close(torch.stack([v for _, v in steps]), mem_r, **TIGHT)
    torch.testing.assert_close(m.states["mem"], st_r["mem"], **TIGHT)


# --------------------------------------------------------------------------
# state_dict, deepcopy, pickle
# --------------------------------------------------------------------------


def test_state_dict_round_trip():
    m1 = flexsn_dsl.load(NEURONS / "plif.yaml", backend="torch").double()
    with torch.no_grad():
        m1.w.fill_(-0.4)
    sd = m1.state_dict()
    assert set(sd) == {"w", "v_th", "v_reset"} and float(sd["w"]) == pytest.approx(-0.4)
    buf = io.BytesIO()
    torch.save(sd, buf)
    buf.seek(0)
    m2 = flexsn_dsl.load(NEURONS / "plif.yaml", backend="torch").double()
    assert _val(m2.w) == 0.0
    m2.load_state_dict(torch.load(buf))
    assert _val(m2.w) == pytest.approx(-0.4)
    xs = _inputs("plif", 8, (30,))
    with torch.no_grad():
        y1, y2 = m1(*xs), m2(*xs)
        y_r, _, _ = run_ref("plif", xs, {"w": -0.4})
    torch.testing.assert_close(y2, y_r[0], **TIGHT)
    assert torch.equal(y1, y2)
    # a strict load rejects a missing or an unknown key
    with pytest.raises(RuntimeError):
        m2.load_state_dict({})
    with pytest.raises(RuntimeError):
        m2.load_state_dict({"w": torch.tensor(0.0), "tau": torch.tensor(2.0)})


def _pickle_copy(m):
    return pickle.loads(pickle.dumps(m))


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("how", [copy.deepcopy, _pickle_copy], ids=["deepcopy", "pickle"])
def test_copy_computes_identically(how, backend):
    """A copy taken mid-sequence (states with an autograd graph, a trained parameter)
    carries the states and parameter values, is independent, and computes the same."""
    dev = _triton_device() if backend == "triton" else "cpu"
    m = flexsn_dsl.load(NEURONS / "alif.yaml", backend=backend, store_state_seqs=True).to(dev, F64)
    with torch.no_grad():
        m.beta.fill_(0.35)
    xs1, xs2 = _inputs("alif", 6, (3, 5), seed=1, device=dev), _inputs("alif", 6, (3, 5), seed=2, device=dev)
    m(*_leaves(xs1)).sum().backward()  # the states now hold an autograd graph
    assert m.states["v"].grad_fn is not None
    c = how(m)
    assert type(c) is type(m) and c is not m
    assert (c.step_mode, c.backend, c.store_state_seqs) == (m.step_mode, m.backend, m.store_state_seqs)
    assert c.beta is not m.beta and _val(c.beta) == 0.35 and c.beta.requires_grad
    assert set(c.states) == {"v", "b"} and set(c.state_seqs) == {"v", "b"}
    for k in m.states:
        assert torch.equal(c.states[k], m.states[k]) and not c.states[k].requires_grad
        assert torch.equal(c.state_seqs[k], m.state_seqs[k])
    m.zero_grad()
    m.states = {k: v.detach() for k, v in m.states.items()}  # the graph of the last call was freed
    xa, xb = _leaves(xs2), _leaves(xs2)
    ya, yb = m(*xa), c(*xb)
    assert torch.equal(ya, yb)
    for k in m.states:
        assert torch.equal(m.states[k], c.states[k])
    (ya * _weights([ya], 3)[0]).sum().backward()
    (yb * _weights([yb], 3)[0]).sum().backward()
    assert torch.equal(xa[0].grad, xb[0].grad) and torch.equal(m.beta.grad, c.beta.grad)
    # both continue the sequence of the reference
    y_r, _, _ = run_ref("alif", [torch.cat([xs1[0], xs2[0]])], {"beta": 0.35})
    torch.testing.assert_close(yb, y_r[0][6:], **TIGHT)
    # independent
    with torch.no_grad():
        c.beta.fill_(0.9)
    assert _val(m.beta) == 0.35
    c.reset()
    assert c.states == {} and set(m.states) == {"v", "b"}


def test_pickle_keeps_plugin_files(tmp_path):
    plugin = tmp_path / "my_plugin.py"
    plugin.write_text(
        "import flexsn_dsl\n\n"
        "@flexsn_dsl.hookimpl\n"
        "def flexsn_dsl_register_surrogates(registry):\n"
        "    registry.register('test_module_tri', gradient='alpha * Max(0, 1 - alpha * Abs(x))',"
        " params={'alpha': 1.0})\n")
    spec = GATED.replace("step:", "surrogate: test_module_tri\nstep:")
    m = flexsn_dsl.loads(spec, backend="torch", plugins=[str(plugin)]).double()
    c = _pickle_copy(m)
    xs = _inputs("gated", 4, (8,))
    with torch.no_grad():
        assert all(torch.equal(a, b) for a, b in zip(m(*xs), c(*xs)))


# --------------------------------------------------------------------------
# DistributedDataParallel: two gloo processes on the CPU
# --------------------------------------------------------------------------

DDP_STEPS, DDP_LR, DDP_T, DDP_BATCH, DDP_IN, DDP_OUT = 3, 0.5, 6, 8, 5, 7


def _ddp_net():
    torch.manual_seed(1234)
    lin = nn.Linear(DDP_IN, DDP_OUT)
    return nn.Sequential(lin, flexsn_dsl.load(NEURONS / "plif.yaml", backend="torch")).double()


def _ddp_data(rank, step):
    gen = torch.Generator().manual_seed(100 * rank + step)
    x = torch.rand(DDP_T, DDP_BATCH, DDP_IN, generator=gen, dtype=F64) * 3.0
    target = (torch.rand(DDP_T, DDP_BATCH, DDP_OUT, generator=gen, dtype=F64) > 0.7).to(F64)
    return x, target


def _ddp_worker(rank, world, port, out_dir):
    import torch.distributed as dist
    torch.set_num_threads(1)
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        net = _ddp_net()
        ddp = nn.parallel.DistributedDataParallel(net)
        opt = torch.optim.SGD(ddp.parameters(), lr=DDP_LR)
        for step in range(DDP_STEPS):
            x, target = _ddp_data(rank, step)
            opt.zero_grad()
            net[1].reset()  # each batch starts from the initial states
            ((ddp(x) - target) ** 2).mean().backward()
            opt.step()
        torch.save({k: v.detach().clone() for k, v in net.named_parameters()}, os.path.join(out_dir, f"rank{rank}.pt"))
    finally:
        dist.destroy_process_group()
    # (as examples/ddp.py: gloo's threads torn down during interpreter finalization can abort a rank that has
    # done its work, SIGABRT; a finished rank leaves without finalization, a failed one raises above)
    os._exit(0)


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_distributed_data_parallel_gloo(tmp_path):
    with torch.device("cpu"):  # gloo and the workers' CPU tensors, also on a GPU machine
        _check_ddp(tmp_path)


def _check_ddp(tmp_path):
    import torch.multiprocessing as mp
    mp.spawn(_ddp_worker, args=(2, _free_port(), str(tmp_path)), nprocs=2, join=True)
    r0 = torch.load(tmp_path / "rank0.pt")
    r1 = torch.load(tmp_path / "rank1.pt")
    assert set(r0) == {"0.weight", "0.bias", "1.w"}
    for k in r0:
        assert torch.equal(r0[k], r1[k]), f"{k} differs across ranks"

    # single process: the gradients of the two ranks' batches, averaged
    net = _ddp_net()
    init_w = _val(net[1].w)
    opt = torch.optim.SGD(net.parameters(), lr=DDP_LR)
    for step in range(DDP_STEPS):
        grads = []
        for rank in range(2):
            net.zero_grad()
            net[1].reset()
            x, target = _ddp_data(rank, step)
            ((net(x) - target) ** 2).mean().backward()
            grads.append([p.grad.clone() for p in net.parameters()])
        for p, g0, g1 in zip(net.parameters(), *grads):
            p.grad = (g0 + g1) / 2
        opt.step()
    for k, p in net.named_parameters():
        torch.testing.assert_close(r0[k], p.detach(), rtol=1e-10, atol=1e-12)
    assert abs(_val(net[1].w) - init_w) > 1e-4, "the learnable parameter did not train: not meaningful"


# --------------------------------------------------------------------------
# torch.compile
# --------------------------------------------------------------------------


def test_torch_compile_torch_backend():
    import torch._dynamo
    torch._dynamo.reset()
    m = flexsn_dsl.load(NEURONS / "plif.yaml", backend="torch", params={"w": 0.2})
    cm = torch.compile(m, fullgraph=True)  # no graph breaks: the whole T-step loop is one graph
    xs = _inputs("plif", 6, (4, 16), dtype=torch.float32, seed=5)
    w_out = _weights([xs[0]], 11)[0].float()
    for _ in range(2):  # the second call runs the compiled code
        m.reset()
        xm, xr = _leaves(xs), _leaves(xs)
        m.zero_grad()
        y = cm(*xm)
        (y * w_out).sum().backward()
        wr = torch.tensor(_val(m.w), requires_grad=True)
        (y_r,), st_r, _ = run_ref("plif", xr, {"w": wr})
        (y_r * w_out).sum().backward()
        torch.testing.assert_close(y, y_r)
        _assert_spiking(y)
        torch.testing.assert_close(m.states["v"], st_r["v"], **F32)
        torch.testing.assert_close(xm[0].grad, xr[0].grad, **F32)
        torch.testing.assert_close(m.w.grad, wr.grad, rtol=1e-4, atol=1e-5)


# --------------------------------------------------------------------------
# the Triton backend against the torch backend
# --------------------------------------------------------------------------


def _twins(name, dtype=F64, device="cpu", **kw):
    _need_triton_on(device)
    mt = _load(name, backend="triton", **kw).to(device=device, dtype=dtype)
    mr = _load(name, backend="torch", **kw).to(device=device, dtype=dtype)
    return mt, mr


def _grad_tol(dtype):
    return dict(rtol=1e-9, atol=1e-10) if dtype == F64 else dict(rtol=1e-4, atol=1e-5)


def _fwd_tol(dtype):
    return TIGHT if dtype == F64 else F32


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("T,n", [(1, 7), (16, 7), (5, 1), (1, 1000), (8, 1000), (12, 1025)])
def test_triton_sizes(T, n, dtype, device):
    """T=1 and neuron counts that are not a multiple of the block size."""
    mt, mr = _twins("plif", dtype, device, params={"w": 0.4})
    xs = _inputs("plif", T, (n,), seed=n + T, dtype=dtype, device=device)
    xt, xr = _leaves(xs), _leaves(xs)
    yt, yr = mt(*xt), mr(*xr)
    torch.testing.assert_close(yt, yr, rtol=0, atol=0)
    torch.testing.assert_close(mt.states["v"], mr.states["v"], **_fwd_tol(dtype))
    w = _weights([yr, mr.states["v"]], n)
    _loss([yt], [mt.states["v"]], w[:1], w[1:]).backward()
    _loss([yr], [mr.states["v"]], w[:1], w[1:]).backward()
    torch.testing.assert_close(xt[0].grad, xr[0].grad, **_grad_tol(dtype))
    torch.testing.assert_close(mt.w.grad, mr.w.grad, **_grad_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["alif", "leaky"])
def test_triton_state_seqs_gradients(name, dtype, device):
    """A loss on ``state_seqs`` sends gradients back through the stored states."""
    mt, mr = _twins(name, dtype, device, store_state_seqs=True)
    xs = _inputs(name, 10, (3, 37), seed=4, dtype=dtype, device=device)
    xt, xr = _leaves(xs), _leaves(xs)
    outs_t, outs_r = _tuple(mt(*xt)), _tuple(mr(*xr))
    for k in mr.states:
        assert mt.state_seqs[k].shape == (10, 3, 37)
        torch.testing.assert_close(mt.state_seqs[k], mr.state_seqs[k], **_fwd_tol(dtype))
        assert mt.state_seqs[k].requires_grad
    w = _weights(list(mr.state_seqs.values()), 12)
    sum((wi * s).sum() for wi, s in zip(w, mt.state_seqs.values())).backward()
    sum((wi * s).sum() for wi, s in zip(w, mr.state_seqs.values())).backward()
    assert xr[0].grad.abs().sum() > 0
    torch.testing.assert_close(xt[0].grad, xr[0].grad, **_grad_tol(dtype))
    (pt,), (pr,) = mt.parameters(), mr.parameters()
    assert pr.grad.abs() > 0
    torch.testing.assert_close(pt.grad, pr.grad, **_grad_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["plif", "alif", "leaky"])
def test_triton_chained_calls_equal_one_long_call(name, dtype, device):
    """Two calls of T steps without reset equal one call of 2T steps, gradients included:
    the gradient reaches the first call through the carried states."""
    _need_triton_on(device)
    mt = _load(name, backend="triton").to(device=device, dtype=dtype)
    mr = _load(name, backend="torch").to(device=device, dtype=dtype)
    T = 6
    xs = _inputs(name, 2 * T, (2, 33), seed=8, dtype=dtype, device=device)
    xt, xr = _leaves(xs), _leaves(xs)
    first = _tuple(mt(xt[0][:T]))
    second = _tuple(mt(xt[0][T:]))
    whole = _tuple(mr(xr[0]))
    for a, b, c in zip(first, second, whole):
        torch.testing.assert_close(torch.cat([a, b]), c, **_fwd_tol(dtype))
    for k in mr.states:
        torch.testing.assert_close(mt.states[k], mr.states[k], **_fwd_tol(dtype))
    w = _weights(whole, 13)
    (sum((wi[:T] * a).sum() + (wi[T:] * b).sum() for wi, a, b in zip(w, first, second))).backward()
    (sum((wi * c).sum() for wi, c in zip(w, whole))).backward()
    assert xr[0].grad[:T].abs().sum() > 0
    torch.testing.assert_close(xt[0].grad, xr[0].grad, **_grad_tol(dtype))
    (pt,), (pr,) = mt.parameters(), mr.parameters()
    torch.testing.assert_close(pt.grad, pr.grad, **_grad_tol(dtype))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("needs_grad", ["inputs_and_params", "params_only", "inputs_only"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("name", ["plif", "alif", "leaky"])
def test_triton_learnable_parameter_gradients(name, dtype, needs_grad, device):
    mt, mr = _twins(name, dtype, device)
    inputs_grad, params_grad = needs_grad != "params_only", needs_grad != "inputs_only"
    for p in (*mt.parameters(), *mr.parameters()):
        p.requires_grad_(params_grad)
    xs = _inputs(name, 9, (5, 41), seed=9, dtype=dtype, device=device)
    xt, xr = _leaves(xs, inputs_grad), _leaves(xs, inputs_grad)
    outs_t, outs_r = _tuple(mt(*xt)), _tuple(mr(*xr))
    assert all(o.requires_grad for o in outs_t)
    w_out, w_st = _weights(outs_r, 14), _weights(list(mr.states.values()), 15)
    _loss(outs_t, list(mt.states.values()), w_out, w_st).backward()
    _loss(outs_r, list(mr.states.values()), w_out, w_st).backward()
    (pt,), (pr,) = mt.parameters(), mr.parameters()
    if params_grad:
        assert pr.grad.abs() > 0
        torch.testing.assert_close(pt.grad, pr.grad, **_grad_tol(dtype))
    else:
        assert pt.grad is None
    if inputs_grad:
        assert xr[0].grad.abs().sum() > 0
        torch.testing.assert_close(xt[0].grad, xr[0].grad, **_grad_tol(dtype))
    else:
        assert xt[0].grad is None


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("backend", ["triton", "torch"])
@pytest.mark.parametrize("name", ["alif", "leaky"])
def test_no_grad_inference_equals_training_path(name, backend, device):
    if backend == "triton":
        _need_triton_on(device)
    m = _load(name, backend=backend, store_state_seqs=True).to(device=device, dtype=F64)
    xs = _inputs(name, 7, (4, 9), seed=10, device=device)
    train = _tuple(m(*_leaves(xs)))
    train_states = {k: v.detach() for k, v in m.states.items()}
    train_seqs = {k: v.detach() for k, v in m.state_seqs.items()}
    for ctx in (torch.no_grad, torch.inference_mode):
        m.reset()
        with ctx():
            infer = _tuple(m(*xs))
        assert not any(o.requires_grad for o in infer)
        for a, b in zip(infer, train):
            torch.testing.assert_close(a, b.detach(), rtol=0, atol=0)
        for k in train_states:
            torch.testing.assert_close(m.states[k], train_states[k], rtol=0, atol=0)
            torch.testing.assert_close(m.state_seqs[k], train_seqs[k], rtol=0, atol=0)
