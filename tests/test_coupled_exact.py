"""Exact propagators of two states coupled both ways with learnable parameters (language v2, section 1:
"learnable parameters inside the propagator get correct gradients"): an adaptive LIF's membrane and
adaptation current, a resonator with a learnable frequency.

References are independent of the package's formulas: mpmath's matrix exponential of [[A dt, b dt], [0, 0]]
at 40 digits and its central differences (every regime of the eigenvalues: real, a complex pair, equal,
one or both at zero, at the borders of the series), and a torch loop through ``torch.linalg.matrix_exp``
with autograd (the adaptive LIF with spikes, resets and a shaped learnable parameter), on both backends.
"""
from __future__ import annotations

import sys
from pathlib import Path

import mpmath
import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl.compiler import compile_spec  # noqa: E402
from flexsn_dsl.parallel import verdict  # noqa: E402

F64 = torch.float64
DT = 0.5
PAIR = f"""
neuron: pair
inputs: [u1, u2]
parameters:
  a: {{value: -1.0, learnable: true}}
  b: {{value: 0.5, learnable: true}}
  c: {{value: 0.8, learnable: true}}
  d: {{value: -3.0, learnable: true}}
  dt: {DT}
states: {{x1: 0.3, x2: -0.7}}
equations:
  x1: a * x1 + b * x2 + u1
  x2: c * x1 + d * x2 + u2
method: exact
outputs: [x1, x2]
"""
X0, U = (0.3, -0.7), (0.9, -0.4)


def _q_of(target: float, a: float, d: float, b: float) -> float:
    """c such that q = ((a - d) dt / 2)**2 + b c dt**2 is ``target``."""
    return (target - ((a - d) * DT / 2) ** 2) / (b * DT * DT)


# (a, b, c, d): A's entries; M = A dt has half trace m and q = m**2 - det(M)
REGIMES = {
    "real": (-1.0, 0.5, 0.8, -3.0),
    "complex pair": (-0.2, -2.0, 2.0, -0.1),
    "equal eigenvalues": (-1.0, 1.0, -1.0, -3.0),                 # q = 0 exactly
    "nearly equal, real": (-1.0, 1.0, -0.99, -3.0),
    "nearly equal, complex": (-1.0, 1.0, -1.01, -3.0),
    "an eigenvalue at zero": (-1.0, 1.0, 1.0, -1.0),              # A singular: eigenvalues 0 and -1 (times dt)
    "both eigenvalues near zero": (-0.01, 0.02, -0.03, 0.005),
    "small, real": (0.1, 0.5, 0.5, -0.1),
    "small, complex": (0.1, -0.5, 0.5, -0.1),
    "q just above the series": (-1.0, 1.0, _q_of(0.0100001, -1.0, -1.0, 1.0), -1.0),
    "q just below the series": (-1.0, 1.0, _q_of(0.0099999, -1.0, -1.0, 1.0), -1.0),
    "-q just above the series": (-1.0, 1.0, _q_of(-0.0100001, -1.0, -1.0, 1.0), -1.0),
    "near zero, at its border": (-0.6, 1.0, _q_of(0.25 - 0.09 - 1e-7, -0.6, -0.6, 1.0), -0.6),  # m**2 + q = 0.25-
    "past it": (-0.6, 1.0, _q_of(0.25 - 0.09 + 1e-7, -0.6, -0.6, 1.0), -0.6),
    "an eigenvalue just past the series": (-0.0212, 1.0, 1e-12, -2.0),  # -0.0106 and -1 (times dt)
    "a fast rotation": (0.0, -60.0, 60.0, 0.0),  # det 900: the real branch's formulas overflow there, unused
    "growing": (0.8, 0.4, 0.3, 0.6),
    "stiff": (-200.0, 1.0, 50.0, -0.5),
}


def _reference(entries, x0=X0, u=U):
    """One step of the pair, by mpmath's exponential of the augmented matrix (40 digits)."""
    a, b, c, d = entries
    with mpmath.workdps(40):
        N = mpmath.matrix([[a, b, u[0]], [c, d, u[1]], [0, 0, 0]]) * mpmath.mpf(DT)
        return mpmath.expm(N) * mpmath.matrix([x0[0], x0[1], 1])


def _reference_gradient(entries, weights):
    """d (w . x after one step) / d (a, b, c, d, u1, u2), by central differences at 40 digits."""
    point = list(map(mpmath.mpf, entries)) + list(map(mpmath.mpf, U))
    grads = []
    with mpmath.workdps(40):
        h = mpmath.mpf(10) ** -15
        for k in range(6):
            plus, minus = list(point), list(point)
            plus[k] += h
            minus[k] -= h
            up, down = (_reference(p[:4], u=p[4:]) for p in (plus, minus))
            grads.append(float(sum(w * (up[i] - down[i]) for i, w in enumerate(weights)) / (2 * h)))
    return grads


@pytest.mark.parametrize("regime", REGIMES)
def test_one_step_and_its_gradient_in_every_regime(regime):
    entries = REGIMES[regime]
    m = flexsn_dsl.loads(PAIR, backend="torch", params=dict(zip("abcd", entries))).double()
    u1, u2 = (torch.tensor([[v]], dtype=F64, requires_grad=True) for v in U)
    x1, x2 = m(u1, u2)
    want = _reference(entries)
    scale = max(1.0, float(abs(want[0])), float(abs(want[1])))
    for got, expected in ((x1, want[0]), (x2, want[1])):
        assert abs(got.item() - float(expected)) <= 1e-13 * scale, (regime, got.item(), float(expected))
    weights = (0.7, -1.3)
    (weights[0] * x1 + weights[1] * x2).sum().backward()
    got = [getattr(m, n).grad.item() for n in "abcd"] + [u1.grad.item(), u2.grad.item()]
    for g, expected in zip(got, _reference_gradient(entries, weights)):
        assert abs(g - expected) <= 1e-10 * max(1.0, abs(expected)), (regime, got)


SHAPED = PAIR
for _name in "abcd":
    SHAPED = SHAPED.replace(f"  {_name}: {{value: ", f"  {_name}: {{shape: [N], value: ")
EVERY = {name: torch.tensor([REGIMES[r][k] for r in REGIMES], dtype=F64) for k, name in enumerate("abcd")}


def _every_regime(backend: str, dtype: torch.dtype, grad: bool):
    """One module whose neurons are the regimes side by side (a, b, c, d shaped): its outputs over a few
    steps, and with ``grad`` the gradients of its inputs and parameters."""
    g = torch.Generator().manual_seed(0)
    u = [torch.rand(4, 2, len(REGIMES), generator=g, dtype=F64, device="cpu").to(torch.get_default_device(), dtype)
         for _ in range(2)]
    m = flexsn_dsl.loads(SHAPED, backend=backend, sizes={"N": len(REGIMES)}, params=EVERY).to(dtype)
    inputs = [x.requires_grad_(grad) for x in u]
    x1, x2 = m(*inputs)
    if not grad:
        return [torch.stack([x1, x2]).double()]
    (x1 * 0.7 - x2 * 1.3).sum().backward()
    return [x1, x2, *(x.grad for x in inputs), *(getattr(m, n).grad for n in "abcd")]


def test_the_triton_kernels_take_every_branch():
    """Every regime at once on the Triton kernels against the torch backend, values and gradients."""
    for got, want in zip(_every_regime("triton", F64, True), _every_regime("torch", F64, True)):
        torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_float32_follows_float64_in_every_regime(backend):
    """The same lines in float32 (the series' thresholds chosen so that no branch cancels more than a few bits):
    within 1e-6 of float64 over a few steps, relative to each neuron's values."""
    (want,), (got,) = _every_regime("torch", F64, False), _every_regime(backend, torch.float32, False)
    scale = want.abs().amax(dim=(0, 1, 2)).clamp(min=1.0)
    assert ((got - want).abs().amax(dim=(0, 1, 2)) < 1e-6 * scale).all()


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_very_stiff_pair_in_float32_has_finite_gradients(backend):
    """dt / tau_u = 667: the series of the branches not taken hold m**16 with m = -333, which overflows float32,
    and an overflowing power's gradient times the zero that torch.where gives it is NaN (the series' arguments
    are 0 there now). The values stay within 1e-5 of float64."""
    text = (Path(__file__).parent / "specs" / "adlif_ct.yaml").read_text().replace("value: 2.0,", "value: 0.0015,")
    got = {}
    for dtype in (F64, torch.float32):
        m = flexsn_dsl.loads(text, backend=backend, sizes={"N": 2}).to(dtype)
        s, u = m(torch.full((3, 1, 2), 0.6, dtype=dtype))
        u.sum().backward()
        grads = [m.tau_u.grad, m.tau_w.grad, m.a.grad]
        assert all(torch.isfinite(g).all() for g in grads)
        got[dtype] = u.double()
    torch.testing.assert_close(got[torch.float32], got[F64], rtol=1e-5, atol=1e-6)


def test_the_step_stays_small_and_runs_step_by_step():
    """The pair's quantities are lines computed once, not expressions repeated in each use: the module
    stays under 100 kB (497 kB when written inline). Substituted into the coefficients of a chunk's composed
    map they would take thousands of operations per step, so the spec runs sequentially and says why."""
    compiled = compile_spec(text=PAIR)
    assert verdict(compiled.ir).startswith("sequential: the step's coefficients take")
    assert len(compiled.triton_source) < 100_000
    names = ("m", "p", "q", "r", "w", "l1", "l2", "q_equal", "m_near", "p_near", "g0", "g1", "g2")
    assert [s.name for s, _ in compiled.ir.assignments[:len(names)]] == [f"x1__{n}" for n in names]


ADLIF = (Path(__file__).parent / "specs" / "adlif_ct.yaml").read_text()  # also compiled by the sm_90 guard


def adlif_loop(x, tau_u, tau_w, a, b=0.3, v_th=1.0, dt=1.0):
    """The adaptive LIF step by step: [u, w] advanced by matrix_exp of [[A dt, b dt], [0, 0]] per element."""
    T, B, N = x.shape
    u, w, spikes, us = x.new_zeros(B, N), x.new_zeros(B, N), [], []
    zero = x.new_zeros(B, N)
    for xt in x:
        rows = [[-1 / tau_u + zero, -1 / tau_u + zero, xt / tau_u], [a / tau_w + zero, -1 / tau_w + zero, zero],
                [zero, zero, zero]]
        E = torch.linalg.matrix_exp(torch.stack([torch.stack(r, -1) for r in rows], -2) * dt)
        state = torch.stack([u, w, torch.ones_like(u)], -1)[..., None]
        u_int, w_int = (E @ state)[..., 0, 0], (E @ state)[..., 1, 0]
        s = zr.spike(u_int - v_th, "sigmoid", alpha=4.0)
        u, w = (1 - s) * u_int, s * (w_int + b) + (1 - s) * w_int
        spikes.append(s), us.append(u)
    return torch.stack(spikes), torch.stack(us)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_adaptive_lif_against_a_matrix_exponential_loop(backend):
    """Spikes, membrane and the gradients of the input and of all three learnable parameters; the neurons'
    a puts them in different regimes (q > 0, q = 0 exactly at a = 0.5625, q < 0)."""
    a = torch.tensor([-1.0, 0.0, 0.5625, 2.0], dtype=F64)
    g = torch.Generator().manual_seed(1)
    x = (torch.rand(24, 2, 4, generator=g, dtype=F64, device="cpu") * 3.0).to(torch.get_default_device())
    x.requires_grad_(True)
    m = flexsn_dsl.loads(ADLIF, backend=backend, sizes={"N": 4}, params={"a": a}).double()
    s, u = m(x)
    params = [m.tau_u, m.tau_w, m.a]
    want_s, want_u = adlif_loop(x, *params)
    torch.testing.assert_close(s, want_s, rtol=0, atol=0)
    torch.testing.assert_close(u, want_u, rtol=1e-12, atol=1e-12)
    assert 0 < want_s.sum() < want_s.numel() / 2
    weights = torch.linspace(-1.0, 1.0, u.numel(), dtype=F64).reshape(u.shape)
    got = torch.autograd.grad((u * weights).sum() + (s * weights.flip(0)).sum(), [x, *params])
    expected = torch.autograd.grad((want_u * weights).sum() + (want_s * weights.flip(0)).sum(), [x, *params])
    for name, gg, ee in zip(["x", "tau_u", "tau_w", "a"], got, expected):
        assert ee.abs().max() > 0, name
        torch.testing.assert_close(gg, ee, rtol=1e-10, atol=1e-11, msg=name)


def test_a_cycle_through_three_states_is_still_refused():
    text = """
neuron: cycle3
parameters: {k: {value: 0.5, learnable: true}, dt: 0.1}
states: {x1: 1.0, x2: 0.0, x3: 0.0}
equations:
  x1: -k * x3
  x2: k * x1
  x3: k * x2
method: exact
"""
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="c.yaml", backend="torch")
    assert "two states coupled both ways" in info.value.message and "rk4" in info.value.hint
