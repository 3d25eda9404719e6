"""Symbolic work bounded by size, and the numbers where rates meet (issue 30, classes 2 and 3).

Work is bounded by counting, never by a clock: sympy's ``expand``, ``Matrix.exp`` and
``jordan_form`` are made to fail if called, and mpmath's ``expm`` is counted. References are
independent: mpmath matrix exponentials at 50 digits, closed forms, hand-written loops.
`flexsn-dsl check` and `load` give the same error for every refused spec.
"""
from __future__ import annotations

import math

import mpmath
import pytest
import sympy
import torch

import flexsn_dsl
from flexsn_dsl.cli import main
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.propagators import (CLOSE_RATES_BELOW, MAX_CHAIN_RATES, MAX_EXACT_STATES, MAX_NUMERIC_SCALE_BITS,
                                    exp_divided_difference)
from flexsn_dsl.symbolic import nonlinear_term, real_symbol

BACKENDS = ["torch", "triton"]
F64 = torch.float64
TIGHT = dict(rtol=1e-12, atol=1e-13)


def _refuse(monkeypatch, *names: str) -> None:
    """Make these sympy functions fail if anything calls them."""
    def refuse(*args, **kwargs):
        raise AssertionError("unbounded sympy work was called")
    for name in names:
        owner, attr = (sympy.Matrix, name.split(".")[1]) if name.startswith("Matrix.") else (sympy, name)
        monkeypatch.setattr(owner, attr, refuse)


def _check_and_load_refuse(tmp_path, text: str, capsys) -> flexsn_dsl.SpecError:
    """The SpecError of `load`, after checking that `flexsn-dsl check` prints the same one."""
    path = tmp_path / "spec.yaml"
    path.write_text(text)
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.load(path, backend="torch")
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:{info.value.line}:{info.value.col}: error: {info.value.message}" in err
    assert "Traceback" not in err and "internal error" not in err
    return info.value


# ---------------------------------------------------------------------------------------------
# nonlinearity decided structurally: no expand of a power
# ---------------------------------------------------------------------------------------------

POWER = """
neuron: power
inputs: [x]
parameters: {{dt: 0.5}}
states: {{v: 0.0}}
equations:
  v: {rhs}
{method}outputs: [v]
"""


def test_a_huge_power_is_nonlinear_without_expanding_it(monkeypatch, tmp_path, capsys):
    _refuse(monkeypatch, "expand", "expand_mul", "Matrix.exp")
    text = POWER.format(rhs="(v + x + 1)**100000", method="method: exact\n")
    err = _check_and_load_refuse(tmp_path, text, capsys)
    assert "(v + x + 1)**100000" in err.message and (err.line, err.col) == (7, 6) and "rk4" in err.hint
    with pytest.warns(flexsn_dsl.errors.SpecWarning, match=r"the term \(v \+ x \+ 1\)\*\*100000"):
        compiled = compile_spec(text=POWER.format(rhs="(v + x + 1)**100000", method=""))
    (_, step), = compiled.ir.assignments  # euler: v + dt (v + x + 1)**100000, the power kept whole
    assert step.has(sympy.Pow(real_symbol("v") + real_symbol("x") + 1, 100000))


def test_a_huge_power_runs_on_both_backends(monkeypatch):
    """(v + x + 1)**100000 at v + x + 1 = 0 and 1: 0 and 1 (the power is never multiplied out)."""
    text = POWER.format(rhs="(v + x + 1)**100000", method="method: euler\n")
    x = torch.tensor([[-1.0], [-0.5]], dtype=F64)  # v stays 0, then v = 0.5 * 0.5**100000 = 0
    for backend in BACKENDS:
        v = flexsn_dsl.loads(text, backend=backend).double()(x)
        torch.testing.assert_close(v, torch.tensor([[0.0], [0.0]], dtype=F64), rtol=0, atol=0)


def test_the_nonlinear_term_is_found_structurally(monkeypatch):
    _refuse(monkeypatch, "expand")
    v, w, x, tau = (real_symbol(n) for n in ("v", "w", "x", "tau"))
    assert nonlinear_term((x - v * v) / tau, [v]) == -v ** 2 / tau  # a constant factor distributed
    assert nonlinear_term(x / tau * (w + (v - x) ** 50000), [v, w]) == x / tau * (v - x) ** 50000
    assert nonlinear_term((v + 1) ** 2 - v ** 2, [v]) is None  # affine after all: 2 v + 1
    assert nonlinear_term(x * (v + 2 * w) / tau, [v, w]) is None


# ---------------------------------------------------------------------------------------------
# symbolic exact propagators: bounded chains, no Jordan form
# ---------------------------------------------------------------------------------------------

CHAIN3 = """
neuron: chain3
inputs: [x]
parameters:
  ta: {value: 1.0, learnable: true}
  tb: {value: 2.0, learnable: true}
  tc: {value: 3.0, learnable: true}
  dt: 0.5
states: {u: 0.0, v: 0.0, w: 0.0}
equations:
  u: -u * exp(x) / ta + x
  v: -v * x / tb + u * x / ta + tc
  w: -w / (tc + x*x) + v * x / ta + u * x * tb
method: exact
outputs: [w]
"""


@pytest.mark.parametrize("case", ["chain of 3 with an input", "cyclic", "5 states"])
def test_symbolic_exact_beyond_the_bound_is_refused_without_sympy_exponentials(case, monkeypatch, tmp_path, capsys):
    _refuse(monkeypatch, "Matrix.exp", "Matrix.jordan_form", "simplify", "expand")
    if case == "cyclic":  # the example: learnable rates and an input in a coupled (cyclic) A
        text = CHAIN3.replace("u: -u * exp(x) / ta + x", "u: -u * exp(x) / ta + w * x")
        expected = "triangular"
    elif case == "5 states":
        text = CHAIN3.replace("w: 0.0}", "w: 0.0, y: 0.0, z: 0.0}") \
            .replace("method: exact", "  y: -y / ta\n  z: -z / tb + y\nmethod: exact")
        expected = "up to 4 states"
    else:
        text = CHAIN3
        expected = f"the input -> u -> v -> w has 4 rates, and symbolic propagators are derived for chains of " \
                   f"at most {MAX_CHAIN_RATES}"
    err = _check_and_load_refuse(tmp_path, text, capsys)
    assert expected in err.message and err.message.startswith("cannot derive the exact propagator")
    assert (err.line, err.col) == (text.splitlines().index("method: exact") + 1, 9)
    assert "learnable: false" in err.hint and "rk4" in err.hint


def test_a_constant_chain_of_3_is_numeric_and_exact(monkeypatch):
    """With the parameters constant the same chain has a matrix of numbers: mpmath, no sympy exponential."""
    _refuse(monkeypatch, "Matrix.exp", "Matrix.jordan_form")
    text = """
neuron: chain3_constant
inputs: [x]
parameters: {dt: 0.5}
states: {u: 0.0, v: 0.0, w: 0.0}
equations:
  u: -1.5 * u + x
  v: -0.5 * v + 0.5 * u + 3.0
  w: -w / 7 + 0.25 * v + u
method: exact
outputs: [w]
"""
    xs = [0.3, 1.2, 2.0]
    v = flexsn_dsl.loads(text, backend="torch").double()(torch.tensor(xs, dtype=F64)[:, None])
    with mpmath.workdps(50):
        A = mpmath.matrix([[-1.5, 0, 0, 0, 1], [0.5, -0.5, 0, 3, 0], [1.0, 0.25, -1 / 7, 0, 0],
                           [0, 0, 0, 0, 0], [0, 0, 0, 0, 0]])
        state, expected = mpmath.matrix([0, 0, 0, 1, 0]), []
        for x in xs:
            A[0, 4] = x
            state = mpmath.expm(A * 0.5) * mpmath.matrix([state[0], state[1], state[2], 1, 1])
            expected.append(float(state[2]))
    torch.testing.assert_close(v[:, 0], torch.tensor(expected, dtype=F64), **TIGHT)


# ---------------------------------------------------------------------------------------------
# numeric propagators: bounded in states and in the scale of A dt
# ---------------------------------------------------------------------------------------------

def _chain(n: int, rate: str) -> str:
    eqs = "\n".join(f"  s{k}: {rate} * ({'x' if k == 0 else f's{k - 1}'} - s{k})" for k in range(n))
    states = ", ".join(f"s{k}: {1.0 if k == 0 else 0.0}" for k in range(n))
    return f"neuron: chain\ninputs: [x]\nparameters: {{dt: 0.5}}\nstates: {{{states}}}\nequations:\n{eqs}\n" \
           f"method: exact\noutputs: [s{n - 1}]\n"


@pytest.fixture
def expm_calls(monkeypatch):
    """The sizes of the matrices mpmath.expm is called with."""
    sizes: list[int] = []
    real = mpmath.expm

    def counted(A, *args, **kwargs):
        sizes.append(A.rows)
        return real(A, *args, **kwargs)
    monkeypatch.setattr(mpmath, "expm", counted)
    return sizes


@pytest.mark.parametrize("n, rate, expected", [
    (40, "1e300", f"the system has 40 states, and exact propagators are derived for at most {MAX_EXACT_STATES}"),
    (300, "1.0", f"the system has 300 states, and exact propagators are derived for at most {MAX_EXACT_STATES}"),
    (3, "1e300", "the rates times dt reach 1e+300"),
    (2, "5e12", "the rates times dt reach 5e+12"),
])
def test_numeric_propagators_are_bounded(n, rate, expected, expm_calls, monkeypatch, tmp_path, capsys):
    diffs = []
    real_diff = sympy.diff
    monkeypatch.setattr(sympy, "diff", lambda *a, **k: diffs.append(1) or real_diff(*a, **k))
    err = _check_and_load_refuse(tmp_path, _chain(n, rate), capsys)
    assert expected in err.message and (err.line, err.col) == (6 + n, 9)
    assert expm_calls == []  # refused before any exponential
    # check and load: the nonlinearity test differentiates each equation by the states in it, and
    # the refusal comes before the n x n matrix of derivatives
    assert len(diffs) <= 2 * (2 * n + MAX_EXACT_STATES ** 2)
    assert "rk4" in err.hint or "exponential_euler" in err.hint


def test_the_largest_numeric_propagator_is_exact(expm_calls):
    """16 chained states of rate 1 from s0 = 1: s_k(t) = e^{-t} t^k / k! (no input), one 32 x 32 exponential."""
    n, T, dt = MAX_EXACT_STATES, 6, 0.5
    assert 2.0 ** MAX_NUMERIC_SCALE_BITS > 1e12
    out = flexsn_dsl.loads(_chain(n, "1.0").replace(f"outputs: [s{n - 1}]", "outputs: [s3, s15]"),
                           backend="torch").double()(torch.zeros(T, 1, dtype=F64))
    assert expm_calls == [2 * n]
    t = torch.arange(1, T + 1, dtype=F64) * dt
    for k, s in zip((3, 15), out):
        torch.testing.assert_close(s[:, 0], torch.exp(-t) * t ** k / math.factorial(k), rtol=1e-12, atol=1e-30)


# ---------------------------------------------------------------------------------------------
# exact propagators where an input or a shaped parameter makes two rates equal
# ---------------------------------------------------------------------------------------------

CONFLUENT = """
neuron: confluent
inputs: [g, x]
parameters: {dt: 1.0}
states: {v: 0.0, i: 0.0}
equations:
  i: -g * i + x
  v: -v + i
method: exact
outputs: [v, i]
"""


def _confluent_reference(g: float, x: float, T: int) -> list[float]:
    """v after each step: e^{M} of [[-g, 0, x], [1, -1, 0], [0, 0, 0]] at 50 digits."""
    with mpmath.workdps(50):
        E = mpmath.expm(mpmath.matrix([[-mpmath.mpf(g), 0, x], [1, -1, 0], [0, 0, 0]]))
        state, out = mpmath.matrix([0, 0, 1]), []
        for _ in range(T):
            state = E * state
            out.append(float(state[1]))
    return out


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("g", [1.0, 1 - 1e-9, 1 + 1e-3, 1 - 2e-2, 0.0, 2.5])
def test_an_input_that_makes_two_rates_equal(g, backend):
    T = 4
    m = flexsn_dsl.loads(CONFLUENT, backend=backend).double()
    gs = torch.full((T, 1), g, dtype=F64, requires_grad=True)
    v, _ = m(gs, torch.ones(T, 1, dtype=F64))
    torch.testing.assert_close(v[:, 0].detach(), torch.tensor(_confluent_reference(g, 1.0, T), dtype=F64), **TIGHT)
    v[0, 0].backward()  # d v_1 / d g against central differences of the reference
    h = 1e-6
    slope = (_confluent_reference(g + h, 1.0, 1)[0] - _confluent_reference(g - h, 1.0, 1)[0]) / (2 * h)
    assert abs(gs.grad[0, 0].item() - slope) < 1e-9


SHAPED = """
neuron: shaped_confluent
inputs: [x]
parameters:
  tau_mem: 2.0
  tau_syn: {value: 1.0, learnable: true, shape: [N]}
  dt: 0.5
states: {v: 0.0, i: 0.0}
equations:
  v: (i - v) / tau_mem
  i: (x - i) / tau_syn
method: exact
outputs: [v]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_shaped_parameter_that_makes_two_rates_equal(backend):
    """Per neuron tau_syn equal to tau_mem, 1e-9 from it, close, and far: against mpmath per neuron."""
    taus = [2.0, 2.0 - 1e-9, 2.0 + 2e-3, 0.7]
    T = 5
    m = flexsn_dsl.loads(SHAPED, backend=backend, params={"tau_syn": torch.tensor(taus, dtype=F64)}).double()
    xs = torch.linspace(0.5, 2.0, T, dtype=F64)[:, None].expand(T, len(taus))
    v = m(xs)
    expected = []
    with mpmath.workdps(50):
        for ts in taus:
            state, column = mpmath.matrix([0, 0, 1]), []
            for x in xs[:, 0].tolist():
                A = mpmath.matrix([[-0.5, 0.5, 0], [0, -1 / mpmath.mpf(ts), x / mpmath.mpf(ts)], [0, 0, 0]])
                state = mpmath.expm(A * 0.5) * state
                column.append(float(state[0]))
            expected.append(column)
    torch.testing.assert_close(v, torch.tensor(expected, dtype=F64).T, **TIGHT)
    v.sum().backward()
    assert torch.isfinite(m.tau_syn.grad).all() and bool((m.tau_syn.grad != 0).all())


@pytest.mark.parametrize("points", [[0.3, 0.3, 0.3], [0.3, 0.3 + 1e-9, -0.2], [-1.0, -1.004, -1.0 + 3e-3],
                                    [0.0, -0.5, -0.5 + 1e-7], [2.0, -3.0, 0.5]])
def test_divided_differences_of_exp(points):
    """exp[z0, z1, z2] against the same at 60 digits (mpmath's own divided difference of exp)."""
    z = [sympy.Float(p) for p in points]
    with mpmath.workdps(60):
        zs = [mpmath.mpf(p) for p in points]
        expected = mpmath.quad(lambda s: mpmath.quad(lambda t: mpmath.exp(zs[0] + s * (zs[1] - zs[0])
                                                                           + t * (zs[2] - zs[1])), [0, s]), [0, 1])
    assert abs(float(exp_divided_difference(z)) - float(expected)) <= 1e-14 * abs(float(expected))
    assert CLOSE_RATES_BELOW < 0.1


# ---------------------------------------------------------------------------------------------
# exponential Euler where a rate is 0
# ---------------------------------------------------------------------------------------------

EXP_EULER = """
neuron: ee
inputs: [x]
parameters: {dt: 0.5}
states: {v: 1.0}
equations:
  v: -x * v + 1
method: exponential_euler
outputs: [v]
"""


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("x", [0.0, 1e-12, 1e-7, 1e-4, 2e-3, 0.3])
def test_exponential_euler_at_and_near_a_zero_rate(x, backend):
    """v = 1/x + (1 - 1/x) e^{-x dt} (at 50 digits), the Euler step 1 + dt at x = 0; the gradient
    against d/dx of the same."""
    m = flexsn_dsl.loads(EXP_EULER, backend=backend).double()
    xs = torch.full((1, 1), x, dtype=F64, requires_grad=True)
    v = m(xs)
    v.sum().backward()
    with mpmath.workdps(50):
        def exact(a):
            return 1 + 0.5 if a == 0 else 1 / a + (1 - 1 / a) * mpmath.exp(-a * 0.5)
        value = exact(mpmath.mpf(x))
        slope = mpmath.diff(exact, mpmath.mpf(x) if x else mpmath.mpf("1e-30"))
    assert abs(v.item() - float(value)) < 1e-14
    assert abs(xs.grad.item() - float(slope)) < 1e-9


@pytest.mark.parametrize("backend", BACKENDS)
def test_exponential_euler_with_a_state_dependent_rate_that_is_zero(backend):
    """dv/dt = -w v + x, dw/dt = x - 1: with x = 1, w stays 0 and v takes Euler steps; then w
    moves and v follows the exponential formula (a hand-written loop)."""
    text = """
neuron: ee2
inputs: [x]
parameters: {dt: 0.25}
states: {v: 1.0, w: 0.0}
equations:
  v: -w * v + x
  w: x - 1
method: exponential_euler
outputs: [v, w]
"""
    xs = torch.tensor([1.0, 1.0, 3.0, 1.0, 0.2], dtype=F64)[:, None]
    v, w = flexsn_dsl.loads(text, backend=backend).double()(xs)
    vr, wr, expected = 1.0, 0.0, []
    for x in xs[:, 0].tolist():
        if wr == 0:
            vr_next = vr + 0.25 * x
        else:
            vr_next = x / wr + (vr - x / wr) * math.exp(-wr * 0.25)
        vr, wr = vr_next, wr + 0.25 * (x - 1)
        expected.append((vr, wr))
    torch.testing.assert_close(torch.stack([v[:, 0], w[:, 0]], 1), torch.tensor(expected, dtype=F64), **TIGHT)


# ---------------------------------------------------------------------------------------------
# power towers: check agrees with the Triton code generation
# ---------------------------------------------------------------------------------------------

TOWER = """
neuron: tower
inputs: [x]
states: {{v: 0.5}}
step:
  v: {rhs}
outputs: [v]
"""


@pytest.mark.parametrize("rhs, reference", [
    ("v**v**v**x", lambda v, x: v ** (v ** (v ** x))),
    ("(x + v)**(v**x) / (1 + v**(x**v))", lambda v, x: (x + v) ** (v ** x) / (1 + v ** (x ** v))),
])
def test_a_power_tower_prints_on_both_backends(rhs, reference, tmp_path):
    text = TOWER.format(rhs=rhs)
    (tmp_path / "tower.yaml").write_text(text)
    assert main(["check", str(tmp_path / "tower.yaml")]) == 0
    assert "_pow(" in compile_spec(text=text).triton_source  # what check accepts, Triton prints
    x0 = torch.tensor([[0.7, 1.3], [0.2, 0.9], [1.1, 0.4]], dtype=F64)
    results = []
    for backend in BACKENDS:
        x = x0.clone().requires_grad_()
        v = flexsn_dsl.loads(text, backend=backend).double()(x)
        v.sum().backward()
        results.append((v.detach(), x.grad))
    x = x0.clone().requires_grad_()
    state, out = torch.full_like(x0[0], 0.5), []
    for t in range(x0.shape[0]):
        state = reference(state, x[t])
        out.append(state)
    expected = torch.stack(out)
    (grad,) = torch.autograd.grad(expected.sum(), x)
    for v, g in results:
        torch.testing.assert_close(v, expected.detach(), **TIGHT)
        torch.testing.assert_close(g, grad, rtol=1e-10, atol=1e-12)


# ---------------------------------------------------------------------------------------------
# a threshold must depend on a state or an input
# ---------------------------------------------------------------------------------------------

THRESHOLD = """
neuron: thr
inputs: [x]
parameters: {{tau: 2.0, v_th: 1.0, dt: 0.5}}
states: {{v: 0.0}}
equations:
  v: (x - v) / tau
threshold: {threshold}
reset: {{v: 0.0}}
"""


@pytest.mark.parametrize("threshold", ["tau >= 1", "dt * tau - v_th", "v_th < tau"])
def test_a_threshold_on_parameters_only_is_refused(threshold, tmp_path, capsys):
    err = _check_and_load_refuse(tmp_path, THRESHOLD.format(threshold=threshold), capsys)
    assert "`threshold` depends on no state or input" in err.message
    assert (err.line, err.col) == (8, 12) and "v >= v_th" in err.hint


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_threshold_on_an_input_is_accepted(backend):
    m = flexsn_dsl.loads(THRESHOLD.format(threshold="x >= v_th"), backend=backend).double()
    s = m(torch.tensor([[0.5], [1.0], [2.0]], dtype=F64))
    torch.testing.assert_close(s[:, 0], torch.tensor([0.0, 1.0, 1.0], dtype=F64), rtol=0, atol=0)
