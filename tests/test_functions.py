"""The functions of language v3 (cosh, sinh, tan, atan, erf, expm1, log1p) and v4 (sign, heaviside) on both
backends against torch's own functions: values over their whole range (tiny, huge, infinite arguments), and
gradients against torch's autograd in float64 (both backends) and finite differences (the derivative sympy
derives, on the torch backend); comparisons as values."""
from __future__ import annotations

import contextlib
import math

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # inf on purpose

WIDE = [0.0, 1e-30, -1e-30, 1e-9, -1e-9, 1e-4, -3e-4, 0.3, -0.7, 1.0, -1.0, 2.5, -4.0, 12.0, -30.0, 1e8, -1e30]
FUNCTIONS = {  # name -> (torch's function, arguments in its domain)
    "cosh": (torch.cosh, [x for x in WIDE if abs(x) < 80]),
    "sinh": (torch.sinh, [x for x in WIDE if abs(x) < 80]),
    "tan": (torch.tan, [x for x in WIDE if abs(x) < 1.5]),
    "atan": (torch.atan, WIDE + [math.inf, -math.inf, 0.2679491924311227, 0.27, 0.26]),
    "erf": (torch.erf, WIDE + [math.inf, -math.inf]),
    "expm1": (torch.expm1, WIDE + [88.0, 100.0, 750.0, -math.inf, math.inf]),
    "log1p": (torch.log1p, [x for x in WIDE if x > -1] + [-0.999999, -1.0, 1e300, math.inf]),
    "sign": (torch.sign, WIDE + [-0.0, math.inf, -math.inf]),
    "heaviside": (lambda x: torch.heaviside(x, torch.ones_like(x)),
                  WIDE + [-0.0, math.inf, -math.inf]),
}


def spec(name: str) -> str:
    return f"""\
neuron: f_{name}
inputs: [x]
states:
  v: 0.0
step:
  y: {name}(x)
  v: 0.5 * v + y
outputs: [y]
"""


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype, rtol", [(torch.float64, 1e-14), (torch.float32, 3e-6)])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_values_match_torch_over_the_whole_range(name, dtype, rtol, backend):
    fn, args = FUNCTIONS[name]
    x = torch.tensor(args, dtype=dtype)[None]  # [T=1, N], on the default device (the GPU on a GPU machine)
    y = flexsn_dsl.loads(spec(name), backend=backend).to(dtype)(x)
    want = fn(x)
    small = want.abs() < 1e-300  # (denormal results: absolute)
    torch.testing.assert_close(y[~small], want[~small], rtol=rtol, atol=0, equal_nan=True)
    torch.testing.assert_close(y[small], want[small], rtol=0, atol=1e-300)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_gradients_are_the_exact_derivatives(name, backend):
    fn, args = FUNCTIONS[name]
    finite = [a for a in args if math.isfinite(a) and abs(a) < 20 and a > -0.99]
    x = torch.tensor(finite, dtype=torch.float64).repeat(3, 1).requires_grad_()  # [T=3, N]
    m = flexsn_dsl.loads(spec(name), backend=backend).double()
    weights = torch.linspace(0.5, 1.5, x.numel(), dtype=torch.float64).reshape(x.shape)
    (grad,) = _grad(m(x), weights, x)
    x_ref = x.detach().clone().requires_grad_()
    with torch.no_grad() if name == "heaviside" else contextlib.nullcontext():  # (torch has no derivative of it)
        (want,) = _grad(fn(x_ref), weights, x_ref)
    torch.testing.assert_close(grad, want, rtol=1e-12, atol=1e-300)


def _grad(y: torch.Tensor, weights: torch.Tensor, x: torch.Tensor) -> tuple[torch.Tensor]:
    """d (y * weights).sum() / dx, zero where y does not depend on x differentiably (sign, heaviside)."""
    if not y.requires_grad:
        return (torch.zeros_like(x),)
    return torch.autograd.grad((y * weights).sum(), x)


@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_the_derived_gradient_passes_finite_differences(name):
    x = torch.tensor([[-0.61, 0.05, 0.4, 1.3]], dtype=torch.float64, device="cpu").repeat(2, 1).requires_grad_()
    m = flexsn_dsl.loads(spec(name), backend="torch").double()

    def run(t: torch.Tensor) -> torch.Tensor:
        m.reset()
        return m(t)
    assert torch.autograd.gradcheck(run, (x,), eps=1e-6, atol=1e-7)


@pytest.mark.parametrize("written, hint", [("step", "did you mean 'spike'? (the language's name for it) (spike(u) "
                                                    "is the step whose gradient is the surrogate; heaviside(u) the "
                                                    "step with none)"),
                                           ("Heaviside", "did you mean 'heaviside'?"), ("sgn", "did you mean 'sign'?"),
                                           ("arctan", "did you mean 'atan'?"), ("clamp", "did you mean 'clip'?"),
                                           ("coshh", "did you mean 'cosh'?"),
                                           ("arcsin", "arcsin() is not in the language: functions: abs, atan"),
                                           ("expit", "did you mean 'sigmoid'?"), ("cosine", "did you mean 'cos'?"),
                                           ("absolute", "did you mean 'abs'?"), ("pow", "write a ** b"),
                                           ("log10", "write log(a) / log(10)"),
                                           ("arcsinh", "arcsinh() is not in the language")])
def test_an_unknown_function_points_at_the_one_meant(written, hint, tmp_path, capsys):
    text = spec("cosh").replace("cosh(x)", f"{written}(x)")
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text)
    assert info.value.message == f"unknown function {written!r}" and info.value.hint.startswith(hint)
    assert (info.value.line, info.value.col) == (6, 6)
    (tmp_path / "f.yaml").write_text(text)
    assert main(["check", str(tmp_path / "f.yaml")]) == 1  # check says the same
    err = capsys.readouterr().err
    assert f"f.yaml:6:6: error: unknown function {written!r}" in err and f"hint: {hint}" in err


VALUES = """\
neuron: f_values
inputs: [x]
parameters: {a: {value: 0.5, learnable: true}}
states:
  v: 0.0
step:
  y: (x < a) + 2 * (x <= 0.1) + 4 * (x > 0.3) + 8 * (x >= a) + 16 * (x == 0.1) + 32 * (a != x) + 64 * (0 < x < 1)
  z: heaviside(x - 0.1, a) * x + sign(x - a) * a + ((x > 0.3) | (x < -0.5)) * x + heaviside(x - 0.3)
  v: 0.5 * v + y
outputs: [y, z]
"""


def values_loop(x, a):
    y = sum(2 ** k * c.to(x.dtype) for k, c in enumerate([x < a, x <= 0.1, x > 0.3, x >= a, x == 0.1, a != x,
                                                           (0 < x) & (x < 1)]))
    step = torch.where(x < 0.1, 0.0, torch.where(x > 0.1, 1.0, a)).to(x.dtype)
    z = step * x + torch.sign(x - a).detach() * a + ((x > 0.3) | (x < -0.5)).to(x.dtype) * x + (x >= 0.3).to(x.dtype)
    return torch.stack([y, z])


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("dtype, tol", [(torch.float64, 1e-12), (torch.float32, 1e-5)])
def test_comparisons_are_values_and_heaviside_takes_its_value_at_zero(backend, dtype, tol):
    """A comparison is 1.0 where it holds, else 0.0, with no gradient; heaviside(a, h0) is numpy's (h0 at 0, its
    gradient flowing to h0 there), heaviside(a) is 1 at 0; sign is torch.sign with no gradient: against torch,
    ties (x == a, x == 0.1, x == 0.3: exact in both dtypes) included."""
    m = flexsn_dsl.loads(VALUES, backend=backend).to(dtype)
    x = torch.tensor([[-1.0, -0.5, 0.0, 0.1, 0.2, 0.3, 0.5, 0.75, 1.0, 2.0]], dtype=dtype).repeat(2, 1)
    x = x.requires_grad_()
    y = torch.stack(m(x))
    a = m.a.detach().clone().requires_grad_()
    want = values_loop(x, a)
    torch.testing.assert_close(y, want, rtol=tol, atol=tol)
    weights = torch.linspace(0.5, 1.5, y.numel(), dtype=dtype).reshape(y.shape)
    got = torch.autograd.grad((y * weights).sum(), [x, m.a])
    expected = torch.autograd.grad((want * weights).sum(), [x, a])
    for g, e in zip(got, expected):
        torch.testing.assert_close(g, e, rtol=tol, atol=tol)
