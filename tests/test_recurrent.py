"""Recurrent inputs (``recurrent: {r: {from: s}}``, language v2 section 3) on both backends against
hand-written torch loops in float64: outputs, final states, the carried previous value, and the
gradients of the inputs, the recurrent weight and the learnable parameters, across calls without
reset(); the Triton kernel (tl.dot in the fused time loop) runs in Triton's interpreter here."""
from __future__ import annotations

import math
import sys
import types
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl import ShapeError, SpecError  # noqa: E402
from flexsn_dsl.triton_runtime import interpreting  # noqa: E402

NEURONS = Path(__file__).resolve().parents[1] / "neurons"
DTYPE = torch.float64
TOL = dict(rtol=1e-10, atol=1e-12)


def _gen(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def _uniform(gen: torch.Generator, *shape: int, high: float = 1.0, dtype: torch.dtype = DTYPE) -> torch.Tensor:
    """U(0, high) drawn on the CPU and moved to the default device: the same numbers on a GPU machine
    (where tests/conftest.py makes CUDA the default and a CPU generator cannot draw CUDA tensors)."""
    return (high * torch.rand(shape, generator=gen, dtype=dtype, device="cpu")).to(torch.get_default_device())


def _normal(gen: torch.Generator, *shape: int) -> torch.Tensor:
    """N(0, 1) in float64, drawn on the CPU and moved to the default device."""
    return torch.randn(shape, generator=gen, dtype=DTYPE, device="cpu").to(torch.get_default_device())

RLIF = """\
neuron: rlif_test
parameters: {tau: {value: 2.0, learnable: true}, v_th: 1.0}
states: {v: 0.0}
recurrent:
  r: {from: s}
surrogate: atan
step:
  h: v + (x + r - v) / tau
  s: spike(h - v_th)
  v: h * (1 - s)
"""




def _rlif_loop(x, v, prev, w, tau, v_th=1.0):
    """The hand-written recurrent LIF: returns spikes [T, ...], final v, last spikes."""
    out = []
    for t in range(x.shape[0]):
        r = torch.einsum("ij,...j->...i", w, prev)
        h = v + (x[t] + r - v) / tau
        s = zr.spike(h - v_th, "atan", alpha=2.0)
        v = h * (1 - s)
        prev = s
        out.append(s)
    return torch.stack(out), v, prev


def _rlif(n: int, backend: str = "torch", **kwargs):
    return flexsn_dsl.loads(RLIF, sizes={"N": n}, backend=backend, **kwargs).to(DTYPE)


@pytest.mark.parametrize("backend,shape,w_slice", [
    ("torch", (3, 7), None), ("torch", (1, 2, 5), None), ("torch", (4, 16), None),
    ("triton", (3, 7), None), ("triton", (2, 10, 5), None), ("triton", (1, 17), None),
    ("triton", (3, 29), 256),  # the weight read in two slices of 16 rows (N padded to 32)
    ("triton", (2, 45), 256),  # four slices (N padded to 64)
], ids=str)
def test_rlif_two_calls_match_hand_loop(backend, shape, w_slice, monkeypatch):
    if w_slice is not None:
        from flexsn_dsl import triton_recurrent
        monkeypatch.setattr(triton_recurrent, "W_SLICE", w_slice)
    torch.manual_seed(0)
    n = shape[-1]
    m = _rlif(n, backend)
    w = m.r_weight.detach().clone().requires_grad_(True)
    tau = m.tau.detach().clone().requires_grad_(True)
    gen = _gen(0)
    x1 = _uniform(gen, 6, *shape, high=2.5).requires_grad_(True)
    x2 = _uniform(gen, 5, *shape, high=2.5).requires_grad_(True)
    y1, y2 = m(x1), m(x2)  # no reset(): the second call continues from the first
    v_m, prev_m = m.states["v"], m.states["r_prev"]

    zero = torch.zeros(shape, dtype=DTYPE)
    r1, v, prev = _rlif_loop(x1, zero, zero, w, tau)
    r2, v, prev = _rlif_loop(x2, v, prev, w, tau)
    for got, want in ((y1, r1), (y2, r2), (v_m, v), (prev_m, prev)):
        torch.testing.assert_close(got, want, **TOL)
    assert 0 < float(y1.detach().sum() + y2.detach().sum()) < y1.numel() + y2.numel(), "no spikes or all spikes: meaningless"

    a, b, c = (_normal(gen, *t.shape) for t in (y1, y2, v_m))
    ((a * y1).sum() + (b * y2).sum() + (c * v_m).sum() + (c * prev_m).sum()).backward()
    want = torch.autograd.grad((a * r1).sum() + (b * r2).sum() + (c * v).sum() + (c * prev).sum(),
                               [x1, x2, w, tau])
    for got, ref in zip((x1.grad, x2.grad, m.r_weight.grad, m.tau.grad), want):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(got, ref, **TOL)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_an_empty_call_keeps_the_carried_values(backend):
    """Calls of T = 3, 0 and 4 steps without reset(): the same outputs, final states and gradients of
    the weight and tau as the hand loop over the 7 steps."""
    torch.manual_seed(12)
    m = _rlif(5, backend)
    w = m.r_weight.detach().clone().requires_grad_(True)
    tau = m.tau.detach().clone().requires_grad_(True)
    gen = _gen(12)
    xs = [_uniform(gen, t, 2, 5, high=2.5) for t in (3, 0, 4)]
    ys = [m(x) for x in xs]
    assert ys[1].shape == (0, 2, 5)
    ref, v, prev = _rlif_loop(torch.cat(xs), torch.zeros(2, 5, dtype=DTYPE), torch.zeros(2, 5, dtype=DTYPE), w, tau)
    for got, want in ((torch.cat(ys), ref), (m.states["v"], v), (m.states["r_prev"], prev)):
        torch.testing.assert_close(got, want, **TOL)
    g = _normal(gen, 7, 2, 5)
    ((g * torch.cat(ys)).sum() + m.states["v"].sum() + m.states["r_prev"].sum()).backward()
    want = torch.autograd.grad((g * ref).sum() + v.sum() + prev.sum(), [w, tau])
    for got, ref_grad in zip((m.r_weight.grad, m.tau.grad), want):
        assert ref_grad.abs().sum() > 0
        torch.testing.assert_close(got, ref_grad, **TOL)


def test_reset_zeroes_the_carried_value_and_single_step_equals_multi_step():
    torch.manual_seed(1)
    m = _rlif(5)
    x = _uniform(_gen(1), 7, 2, 5, high=3.0)
    y = m(x).detach()
    assert m.states["r_prev"].abs().sum() > 0
    m.reset()
    assert m.states == {}
    torch.testing.assert_close(m(x), y, **TOL)
    s = flexsn_dsl.loads(RLIF, sizes={"N": 5}, backend="torch", step_mode="s").to(DTYPE)
    s.load_state_dict(m.state_dict())
    torch.testing.assert_close(torch.stack([s(x[t]) for t in range(7)]), y, **TOL)


def test_weight_init_like_linear_and_from_params():
    m = flexsn_dsl.loads(RLIF, sizes={"N": 300})
    w = m.r_weight
    assert isinstance(w, torch.nn.Parameter) and w.shape == (300, 300)
    bound = 1 / math.sqrt(300)  # nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    w = w.detach()
    assert float(w.abs().max()) <= bound and float(w.abs().max()) > 0.95 * bound
    assert abs(float(w.mean())) < 0.05 * bound
    assert "r_weight" in m.state_dict()
    given = _normal(_gen(2), 6, 6)
    m = flexsn_dsl.loads(RLIF, params={"r_weight": given, "v_th": 0.5})
    assert torch.equal(m.r_weight.detach(), given) and m.r_weight.data_ptr() != given.data_ptr()


def _leaky_rnn(n: int, backend: str = "torch"):
    """A spike-free recurrent spec (smooth, so finite differences check every gradient)."""
    text = """\
neuron: leaky_rnn
parameters: {tau: {value: 3.0, learnable: true}}
states: {v: 0.5}
recurrent:
  q: {from: u}
step:
  u: tanh(v)
  v: v + (x + q - v) / tau
outputs: [u, v]
"""
    return flexsn_dsl.loads(text, sizes={"N": n}, backend=backend).to(DTYPE)


def test_non_spike_source_in_weight_slices_matches_torch_backend(monkeypatch):
    """The value fed back is real (u = tanh(v)), read back from memory in four slices of the weight
    (N = 45, padded to 64), two programs (18 rows), two calls: outputs, final states and the gradients
    of both inputs, the weight and tau against the torch backend on the same weight, in float64."""
    from flexsn_dsl import triton_recurrent
    monkeypatch.setattr(triton_recurrent, "W_SLICE", 256)
    torch.manual_seed(10)
    ref, fused = _leaky_rnn(45, "torch"), _leaky_rnn(45, "triton")
    fused.load_state_dict(ref.state_dict())
    gen = _gen(11)
    xs = [_normal(gen, t, 18, 45) for t in (5, 4)]
    weights, results = None, []
    for m in (ref, fused):
        x1, x2 = (x.clone().requires_grad_(True) for x in xs)
        outs = [*m(x1), *m(x2), m.states["v"], m.states["q_prev"]]  # u and v of both calls, final v, carried u
        weights = weights or [_normal(gen, *o.shape) for o in outs]
        sum((w * o).sum() for w, o in zip(weights, outs)).backward()
        results.append((outs, (x1.grad, x2.grad, m.q_weight.grad, m.tau.grad)))
    (want_outs, want_grads), (got_outs, got_grads) = results
    for got, want in zip(got_outs, want_outs):
        torch.testing.assert_close(got, want, **TOL)
    for got, want in zip(got_grads, want_grads):
        assert want.abs().sum() > 0
        torch.testing.assert_close(got, want, **TOL)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gradcheck_through_two_calls(backend):
    torch.manual_seed(2)
    m = _leaky_rnn(3, backend)
    gen = _gen(3)
    x1 = _normal(gen, 3, 2, 3).requires_grad_(True)
    x2 = _normal(gen, 2, 2, 3).requires_grad_(True)
    w = m.q_weight.detach().clone().requires_grad_(True)
    tau = m.tau.detach().clone().requires_grad_(True)

    def f(x1, x2, w, tau):  # the module with w and tau as its parameters, functionally
        params = {"q_weight": w, "tau": tau}
        m.reset()
        out1 = torch.func.functional_call(m, params, (x1,))
        out2 = torch.func.functional_call(m, params, (x2,))
        return (*out1, *out2, m.states["q_prev"])

    assert torch.autograd.gradcheck(f, (x1, x2, w, tau), fast_mode=backend == "triton")  # interpreter: fewer calls
    # and the carried value is the previous u: q at the first step of the second call is W u
    u1, _, u2, v2, prev = f(x1, x2, w, tau)
    torch.testing.assert_close(prev, u2[-1], **TOL)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_equals_hand_loop_for_non_spike_source(backend):
    torch.manual_seed(3)
    m = _leaky_rnn(4, backend)
    x = _normal(_gen(4), 5, 3, 4)
    u, v = m(x)
    w, tau = m.q_weight.detach(), m.tau.detach()
    vv, prev = torch.full((3, 4), 0.5, dtype=DTYPE), torch.zeros(3, 4, dtype=DTYPE)
    for t in range(5):
        uu = torch.tanh(vv)
        vv = vv + (x[t] + prev @ w.T - vv) / tau
        torch.testing.assert_close(u[t], uu, **TOL)
        torch.testing.assert_close(v[t], vv, **TOL)
        prev = uu


# -- the zoo's recurrent neurons ----------------------------------------------------

def _lsnn_loop(x, w, p):
    """Bellec et al. 2018 LSNN by hand: leaky v, soft reset by v_th, threshold v_th + beta * a."""
    alpha, rho = math.exp(-1 / p["tau_m"]), math.exp(-1 / p["tau_a"])
    v = a = prev = torch.zeros(x.shape[1:], dtype=DTYPE)
    out = []
    for t in range(x.shape[0]):
        h = alpha * v + (1 - alpha) * (x[t] + prev @ w.T)
        s = zr.spike(h - (p["v_th"] + p["beta"] * a), "triangle")
        z = s.detach()
        v = h - z * p["v_th"]
        a = rho * a + (1 - rho) * z
        prev = s
        out.append(s)
    return torch.stack(out), v, a




@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_zoo_lsnn_matches_hand_loop(backend):
    torch.manual_seed(4)
    m = flexsn_dsl.load(NEURONS / "lsnn.yaml", sizes={"N": 9}, backend=backend).to(DTYPE)
    p = {"tau_m": 20.0, "tau_a": 200.0, "v_th": 0.5}
    gen = _gen(5)
    x = _uniform(gen, 30, 3, 9, high=4.0).requires_grad_(True)
    y = m(x)
    w = m.r_weight.detach().clone().requires_grad_(True)
    beta = m.beta.detach().clone().requires_grad_(True)
    ref, v, a = _lsnn_loop(x, w, {**p, "beta": beta})
    torch.testing.assert_close(y, ref, **TOL)
    torch.testing.assert_close(m.states["v"], v, **TOL)
    torch.testing.assert_close(m.states["a"], a, **TOL)
    assert 0 < float(y.detach().sum()) < y.numel()
    g = _normal(gen, *y.shape)
    want = torch.autograd.grad((g * ref).sum(), [x, w, beta])
    assert all(t.abs().sum() > 0 for t in want)
    (g * y).sum().backward()
    for got, ref_grad in zip((x.grad, m.r_weight.grad, m.beta.grad), want):
        torch.testing.assert_close(got, ref_grad, **TOL)


def test_zoo_rlif_matches_hand_loop():
    torch.manual_seed(5)
    m = flexsn_dsl.load(NEURONS / "rlif.yaml", sizes={"N": 6}, backend="torch").to(DTYPE)
    x = _uniform(_gen(6), 8, 2, 6, high=2.5)
    w = m.r_weight.detach()
    v = prev = torch.zeros(2, 6, dtype=DTYPE)
    for t in range(8):
        h = v + (x[t] + prev @ w.T - v) / 2.0
        s = (h >= 1.0).to(DTYPE)
        v = h * (1 - s)
        prev = s
    y = m(x)
    torch.testing.assert_close(y[-1], prev, **TOL)
    torch.testing.assert_close(m.states["v"], v, **TOL)


# -- errors --------------------------------------------------------------------------

@pytest.mark.parametrize("replace,message,line,col", [
    ("r: {from: q}", "comes from 'q', which is not a step name, state or output", 5, 13),
    ("x: {from: s}", "recurrent input 'x' collides with the input 'x'", 5, 3),
    ("v: {from: s}", "recurrent input 'v' collides with the state", 5, 3),
    ("tau: {from: s}", "recurrent input 'tau' collides with the parameter", 5, 3),
    ("r: {from: s}\n  r2: {from: s}", "recurrent input 'r2' is used nowhere in `step`", 6, 3),
    ("r: s", "must say where it comes from", 5, 6),
    ("r: {from: s, to: v}", "unknown key 'to'", 5, 16),
])
def test_spec_errors_point_at_the_source(replace, message, line, col):
    text = RLIF.replace("r: {from: s}", replace)
    with pytest.raises(SpecError) as info:
        flexsn_dsl.loads(text, sizes={"N": 4}, filename="rnn.yaml")
    assert message in str(info.value)
    assert (info.value.file, info.value.line, info.value.col) == ("rnn.yaml", line, col), str(info.value)


def test_derived_names_and_assignment_are_refused():
    with pytest.raises(SpecError, match="'r_prev', which collides with the state 'r_prev'"):
        flexsn_dsl.loads(RLIF.replace("states: {v: 0.0}", "states: {v: 0.0, r_prev: 0.0}"), sizes={"N": 4})
    with pytest.raises(SpecError, match="cannot assign the recurrent input 'r'"):
        flexsn_dsl.loads(RLIF.replace("  v: h * (1 - s)", "  v: h * (1 - s)\n  r: v"), sizes={"N": 4})


def test_sizes_and_shapes_are_checked():
    with pytest.raises(SpecError, match=r"needs the number of neurons N[\s\S]*sizes=\{'N': 256\}"):
        flexsn_dsl.loads(RLIF)
    with pytest.raises(ShapeError, match=r"shape \[N, N\] with N = 4, not \[3, 3\]"):
        flexsn_dsl.loads(RLIF, sizes={"N": 4}, params={"r_weight": torch.zeros(3, 3)})
    with pytest.raises(ShapeError, match=r"not \[3, 4\]"):
        flexsn_dsl.loads(RLIF, params={"r_weight": torch.zeros(3, 4)})
    with pytest.raises(SpecError, match="size 'N' must be a positive whole number, got 0"):
        flexsn_dsl.loads(RLIF, sizes={"N": 0})
    m = flexsn_dsl.loads(RLIF, sizes={"N": 4})
    with pytest.raises(ShapeError, match=r"last dimension is N = 4 .*step shape \[2, 5\]"):
        m(torch.zeros(3, 2, 5))
    s = flexsn_dsl.loads(RLIF, sizes={"N": 4}, step_mode="s")
    with pytest.raises(ShapeError, match=r"step shape \[\]"):
        s(torch.zeros(()))


def test_triton_refuses_what_the_fused_kernel_does_not_run():
    with pytest.raises(SpecError, match="feeds back outputs only: recurrent input 'r' comes from 'v'") as info:
        flexsn_dsl.loads(RLIF.replace("{from: s}", "{from: v}"), sizes={"N": 4}, backend="triton",
                         filename="rnn.yaml")
    assert (info.value.line, info.value.col) == (5, 3)
    with pytest.raises(SpecError, match="does not store state sequences"):
        flexsn_dsl.loads(RLIF, sizes={"N": 4}, backend="triton", store_state_seqs=True)
    with pytest.raises(SpecError, match="at most N = 512 neurons per layer .*got N = 513") as info:
        flexsn_dsl.loads(RLIF, sizes={"N": 513}, backend="triton", filename="rnn.yaml")
    assert (info.value.file, info.value.line, info.value.col) == ("rnn.yaml", 5, 3)
    assert 'backend="torch"' in info.value.hint
    flexsn_dsl.loads(RLIF, sizes={"N": 512}, backend="triton")  # the largest layer it holds


@pytest.mark.parametrize("dtype,tol", [(torch.float32, dict(rtol=1e-5, atol=1e-5)),
                                       (torch.bfloat16, dict(rtol=2e-2, atol=2e-2))], ids=str)
def test_triton_matches_torch_in_low_precision(dtype, tol):
    """float32 and bfloat16 storage: the Triton kernel against the torch backend on the same weights
    (spike counts may differ where a membrane lands within rounding of the threshold)."""
    torch.manual_seed(6)
    a = flexsn_dsl.loads(RLIF, sizes={"N": 12}, backend="torch")
    b = flexsn_dsl.loads(RLIF, sizes={"N": 12}, backend="triton")
    b.load_state_dict(a.state_dict())
    x = _uniform(_gen(7), 6, 5, 12, high=2.5, dtype=torch.float32)
    xa, xb = (x.to(dtype).requires_grad_(True) for _ in range(2))
    ya, yb = a(xa), b(xb)
    assert yb.dtype == dtype
    assert float((ya != yb).float().mean()) < 0.02
    # batch rows whose spike trains agree at every step and neuron (through W, one differing spike
    # moves every membrane of its row): their membranes must agree
    same = (ya == yb).all(0).all(-1)
    assert same.any(), "no batch row without a differing spike: meaningless"
    torch.testing.assert_close(b.states["v"][same].float(), a.states["v"][same].float(), **tol)
    ya.float().sum().backward()
    yb.float().sum().backward()
    torch.testing.assert_close(b.r_weight.grad, a.r_weight.grad, **{k: 10 * v for k, v in tol.items()})


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_torch_compile_fullgraph_matches_eager(backend, fresh_dynamo):
    """One graph (no breaks) over both calls' T steps, forward and backward; aot_eager keeps the test
    fast on the CPU while still tracing with dynamo and AOT autograd (the custom operators' fakes)."""
    torch.manual_seed(7)
    eager, compiled = _rlif(6, backend), _rlif(6, backend)
    compiled.load_state_dict(eager.state_dict())
    run = torch.compile(compiled, fullgraph=True, backend="aot_eager")
    x = _uniform(_gen(8), 5, 3, 6, high=2.5)
    ys = [m(x) for m in (eager, eager)], [run(x), run(x)]  # two calls: the carried value flows through
    for a, b in zip(*ys):
        torch.testing.assert_close(b, a, **TOL)
    for (a, b), m in zip([ys[0], ys[1]], (eager, compiled)):
        (a.sum() + 2 * b.sum() + m.states["v"].sum()).backward()
    torch.testing.assert_close(compiled.r_weight.grad, eager.r_weight.grad, **TOL)
    torch.testing.assert_close(compiled.tau.grad, eager.tau.grad, **TOL)
    assert eager.r_weight.grad.abs().sum() > 0


# -- with shaped parameters and with `equations` ---------------------------------------

RLIF_SHAPED = RLIF.replace("parameters: {tau: {value: 2.0, learnable: true}, v_th: 1.0}",
                           "parameters: {tau: {value: 2.0, learnable: true, shape: [N]}, v_th: {value: 1.0, shape: [N]}}")


@pytest.mark.parametrize("backend,shape", [("torch", (3, 7)), ("triton", (3, 7)), ("triton", (2, 3, 5))], ids=str)
def test_shaped_parameters_match_hand_loop(backend, shape):
    """A learnable time constant per neuron and a fixed threshold per neuron (different values)."""
    torch.manual_seed(8)
    n = shape[-1]
    v_th = torch.linspace(0.8, 1.3, n, dtype=DTYPE)
    m = flexsn_dsl.loads(RLIF_SHAPED, sizes={"N": n}, params={"v_th": v_th}, backend=backend).to(DTYPE)
    with torch.no_grad():
        m.tau.copy_(torch.linspace(1.5, 3.0, n, dtype=DTYPE))
    w = m.r_weight.detach().clone().requires_grad_(True)
    tau = m.tau.detach().clone().requires_grad_(True)
    gen = _gen(9)
    x1 = _uniform(gen, 6, *shape, high=2.5).requires_grad_(True)
    x2 = _uniform(gen, 4, *shape, high=2.5).requires_grad_(True)
    y1, y2 = m(x1), m(x2)
    zero = torch.zeros(shape, dtype=DTYPE)
    r1, v, prev = _rlif_loop(x1, zero, zero, w, tau, v_th)
    r2, v, prev = _rlif_loop(x2, v, prev, w, tau, v_th)
    for got, want in ((y1, r1), (y2, r2), (m.states["v"], v), (m.states["r_prev"], prev)):
        torch.testing.assert_close(got, want, **TOL)
    assert 0 < float(y1.detach().sum() + y2.detach().sum()) < y1.numel() + y2.numel()
    a, b, c = (_normal(gen, *t.shape) for t in (y1, y2, v))
    ((a * y1).sum() + (b * y2).sum() + (c * m.states["v"]).sum()).backward()
    want = torch.autograd.grad((a * r1).sum() + (b * r2).sum() + (c * v).sum(), [x1, x2, w, tau])
    assert m.tau.grad.shape == (n,) and m.v_th.grad is None
    for got, ref in zip((x1.grad, x2.grad, m.r_weight.grad, m.tau.grad), want):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(got, ref, **TOL)


RLIF_CT = """\
neuron: rlif_ct
inputs: [I]
parameters: {tau: {value: 3.0, learnable: true}, v_th: 1.0, dt: 1.0}
states: {v: 0.0}
recurrent:
  r: {from: s}
equations:
  v: (I + r - v) / tau
method: exact
threshold: v >= v_th
reset: {v: 0.0}
surrogate: atan
"""


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_equations_match_hand_loop(backend):
    """`equations` with a recurrent input held over the step: v(t+dt) = a v + (1 - a)(I + W s_prev),
    a = exp(-dt / tau), then threshold and reset; gradients through the learnable tau inside a."""
    torch.manual_seed(9)
    m = flexsn_dsl.loads(RLIF_CT, sizes={"N": 5}, backend=backend).to(DTYPE)
    w = m.r_weight.detach().clone().requires_grad_(True)
    tau = m.tau.detach().clone().requires_grad_(True)
    gen = _gen(10)
    xs = [_uniform(gen, t, 3, 5, high=4.0).requires_grad_(True) for t in (7, 5)]
    ys = [m(x) for x in xs]  # two calls, no reset()

    v = prev = torch.zeros(3, 5, dtype=DTYPE)
    refs = []
    for x in xs:
        out = []
        for t in range(x.shape[0]):
            a = torch.exp(-1.0 / tau)
            h = a * v + (1 - a) * (x[t] + prev @ w.T)
            s = zr.spike(h - 1.0, "atan", alpha=2.0)
            v = s * 0.0 + (1 - s) * h
            prev = s
            out.append(s)
        refs.append(torch.stack(out))
    for got, want in zip((*ys, m.states["v"], m.states["r_prev"]), (*refs, v, prev)):
        torch.testing.assert_close(got, want, **TOL)
    assert 0 < float(sum(y.detach().sum() for y in ys)) < sum(y.numel() for y in ys)
    g = [_normal(gen, *y.shape) for y in ys]
    sum((gi * y).sum() for gi, y in zip(g, ys)).backward()
    want = torch.autograd.grad(sum((gi * r).sum() for gi, r in zip(g, refs)), [*xs, w, tau])
    for got, ref in zip((*(x.grad for x in xs), m.r_weight.grad, m.tau.grad), want):
        assert ref.abs().sum() > 0
        torch.testing.assert_close(got, ref, **TOL)


def test_equations_must_use_the_recurrent_input():
    text = RLIF_CT.replace("(I + r - v)", "(I - v)")
    with pytest.raises(SpecError, match="'r' is used nowhere in `equations`, `threshold` or `reset`") as info:
        flexsn_dsl.loads(text, sizes={"N": 4}, filename="ct.yaml")
    assert (info.value.line, info.value.col) == (6, 3)


LEAKY_RNN = """\
neuron: leaky_rnn
parameters: {tau: 2.0}
states: {v: 0.0}
recurrent:
  r: {from: v}
step:
  v: v + (x + r - v) / tau
outputs: [v]
"""


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_linear_recurrent_spec_that_keeps_nothing_for_the_backward(backend):
    """A leaky RNN feeding back its state (linear: its backward reads no saved value) against the hand loop."""
    N, B, T = 5, 3, 6
    gen = _gen(11)
    m = flexsn_dsl.loads(LEAKY_RNN, sizes={"N": N}, backend=backend).to(DTYPE)
    with torch.no_grad():
        m.r_weight.copy_(_normal(gen, N, N) * 0.3)
    x = _uniform(gen, T, B, N).requires_grad_(True)
    w = m.r_weight.detach().clone().requires_grad_(True)
    v, ref = torch.zeros(B, N, dtype=DTYPE), []
    for t in range(T):
        v = v + (x[t] + v @ w.T - v) / 2.0
        ref.append(v)
    ref = torch.stack(ref)
    g = _normal(gen, T, B, N)
    y = m(x)
    torch.testing.assert_close(y, ref, **TOL)
    got = torch.autograd.grad(y, (x, m.r_weight), g)
    want = torch.autograd.grad(ref, (x, w), g)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b, **TOL)


# -- the float32 product's precision ($FLEXSN_DSL_RECURRENT_PRECISION) -----------------

PRECISIONS = ["tf32x3", "ieee", "tf32"]


def _zoo_rlif_loop(x, w):
    """neurons/rlif.yaml by hand (tau 2, v_th 1, sigmoid surrogate with alpha 4) from rest: spikes
    [T, ...], the membranes h before the threshold [T, ...] and the final v."""
    v = prev = torch.zeros_like(x[0])
    out, hs = [], []
    for t in range(x.shape[0]):
        h = v + (x[t] + prev @ w.T - v) / 2.0
        s = zr.spike(h - 1.0, "sigmoid", alpha=4.0)
        v = h * (1 - s)
        prev = s
        out.append(s)
        hs.append(h.detach())
    return torch.stack(out), torch.stack(hs), v


def _float32_layer_error(precision: str, T: int, B: int, N: int, monkeypatch) -> float:
    """A float32 rlif layer (Triton) under ``precision`` against the hand loop in float64 on the same
    (float32) weight and input. Per batch row (rows are independent; a differing spike changes every
    later step of its row): the spike trains agree, or the first differing spikes have a float64
    membrane within ``tol`` of the threshold; rows that agree have the same final v, and the
    gradients of the input and the weight (upstream gradient zero on the other rows) are within
    ``tol`` of the reference's largest. ``tol``: 1e-4 (float32 accuracy), 1e-2 for tf32.
    Returns the weight gradient's error relative to its largest value."""
    monkeypatch.setenv("FLEXSN_DSL_RECURRENT_PRECISION", precision)
    tol, agreeing = (1e-2, 0.25) if precision == "tf32" else (1e-4, 0.9)
    gen = _gen(20)
    m = flexsn_dsl.load(NEURONS / "rlif.yaml", sizes={"N": N}, backend="triton")
    with torch.no_grad():  # nn.Linear's range, drawn on the CPU: the same numbers on every device
        m.r_weight.copy_((_uniform(gen, N, N, high=2.0, dtype=torch.float32) - 1.0) / math.sqrt(N))
    x = _uniform(gen, T, B, N, high=2.5, dtype=torch.float32).requires_grad_(True)
    y = m(x)
    x64 = x.detach().double().requires_grad_(True)
    w64 = m.r_weight.detach().double().requires_grad_(True)
    ref, h, v = _zoo_rlif_loop(x64, w64)
    assert 0.1 < float(ref.detach().mean()) < 0.6, "spike rate off the tested range: meaningless"
    differs = y.detach().double() != ref.detach()  # [T, B, N]
    same = ~differs.any(0).any(-1)  # [B]
    for b in torch.nonzero(~same).flatten().tolist():
        t0 = int(torch.nonzero(differs[:, b].any(-1))[0])
        margin = float((h[t0, b][differs[t0, b]] - 1.0).abs().max())
        assert margin < tol, f"row {b}, step {t0}: a spike differs {margin:.1e} from the threshold"
    assert float(same.double().mean()) >= agreeing, f"only {int(same.sum())} of {B} rows agree"
    torch.testing.assert_close(m.states["v"][same].double(), v.detach()[same], rtol=0, atol=tol)
    g = _normal(gen, T, B, N) * same[None, :, None]
    (g.float() * y).sum().backward()
    want = torch.autograd.grad((g * ref).sum(), (x64, w64))
    errors = []
    for got, ref_grad in zip((x.grad, m.r_weight.grad), want):
        errors.append(float((got.double() - ref_grad).abs().max() / ref_grad.abs().max()))
    assert max(errors) < tol, f"gradient errors of x and r_weight relative to their largest: {errors}"
    return errors[1]


@pytest.mark.skipif(not interpreting(), reason="Triton's interpreter (the GPU version is below)")
@pytest.mark.parametrize("precision", PRECISIONS)
def test_each_precision_runs_in_the_interpreter(precision, monkeypatch):
    """The interpreter takes every setting (it multiplies float32 exactly whatever the setting)."""
    _float32_layer_error(precision, 10, 20, 40, monkeypatch)


@pytest.mark.skipif(not torch.cuda.is_available() or interpreting(), reason="needs a GPU (real tensor cores)")
@pytest.mark.parametrize("precision", PRECISIONS)
def test_float32_precisions_on_the_gpu(precision, monkeypatch):
    """tf32x3 (the default) and ieee keep float32 accuracy; tf32 is within 1e-2, and measurably less
    accurate (so the setting reaches the kernel: plain float32 products err ~1e-7 here)."""
    error = _float32_layer_error(precision, 20, 33, 200, monkeypatch)
    if precision == "tf32":
        assert error > 1e-5, f"weight gradient error {error:.1e}: the product did not run in tf32"


@pytest.mark.parametrize("precision", [*PRECISIONS, " ieee ", ""])
def test_the_setting_sets_float32_products_only(precision, monkeypatch):
    """tl.dot's input_precision constexpr: the setting for float32 (unset or blank: tf32x3), IEEE for
    float64 (the only one tl.dot has) and for 16-bit operands."""
    from flexsn_dsl.triton_recurrent import _meta
    monkeypatch.setenv("FLEXSN_DSL_RECURRENT_PRECISION", precision)
    for dtype in (torch.float32, torch.float64, torch.bfloat16, torch.float16):
        want = (precision.strip() or "tf32x3") if dtype == torch.float32 else "ieee"
        assert _meta(torch.zeros(2, dtype=dtype), 3, 2, 5)["_PRECISION"] == want


@pytest.mark.parametrize("precision", ["", "tf32x3", "tf32", "ieee"])
def test_gpus_without_tf32_cores_multiply_in_ieee(precision, monkeypatch):
    """Before compute capability 8.0 there are no TF32 tensor cores: float32 products run in IEEE
    there whatever the setting (as torch's allow_tf32), and in the setting's precision on newer GPUs."""
    from flexsn_dsl import triton_recurrent
    monkeypatch.setenv("FLEXSN_DSL_RECURRENT_PRECISION", precision)
    on_gpu = types.SimpleNamespace(dtype=torch.float32, is_cuda=True, device=torch.device("cuda", 0))
    for cores, want in ((False, "ieee"), (True, precision or "tf32x3")):
        monkeypatch.setattr(triton_recurrent, "_tf32_cores", lambda index, cores=cores: cores)
        assert triton_recurrent._dot_precision(on_gpu) == want


@pytest.mark.parametrize("value", ["fp32", "TF32", "tf32x3,ieee", "3"])
def test_a_bad_precision_is_an_error_in_forward_and_backward(value, monkeypatch):
    """At each launch of the recurrent kernels (also when nothing runs, T = 0), naming the variable and
    the allowed values; the torch backend ignores the setting."""
    message = f"^FLEXSN_DSL_RECURRENT_PRECISION={value!r} is not one of tf32x3, ieee, tf32: set it to"
    m = flexsn_dsl.loads(RLIF, sizes={"N": 4}, backend="triton")
    x = _uniform(_gen(21), 3, 2, 4, high=2.5, dtype=torch.float32).requires_grad_(True)
    y = m(x)  # a good (default) setting for the forward, a bad one for the backward
    monkeypatch.setenv("FLEXSN_DSL_RECURRENT_PRECISION", value)
    with pytest.raises(ValueError, match=message):
        y.sum().backward()
    for T in (3, 0):
        m.reset()
        with pytest.raises(ValueError, match=message):
            m(torch.ones(T, 2, 4))
    flexsn_dsl.loads(RLIF, sizes={"N": 4}, backend="torch")(x)
