"""Powers on both backends against a hand-written torch step (float64): negative, zero and
positive bases; integer exponents small and large, negative, non-integral and learnable
ones; ``0.0 ** x``. Forward values and gradients (of the input and of the learnable
exponent) must match torch's, NaN and inf included, where torch gives them."""
from __future__ import annotations

import pytest
import torch

import flexsn_dsl

pytestmark = pytest.mark.filterwarnings("ignore:.*encountered in:RuntimeWarning")  # NaN and inf on purpose

# bases: negative, zero and positive, integral and not, inside and outside [-1, 1]
BASES = [-2.0, -1.5, -1.0, -0.7, -0.25, 0.0, 0.25, 0.7, 1.0, 1.5, 2.0]


def spec(expr: str, k: float = 2.0) -> str:
    """A neuron whose output y is ``expr`` of the input x (and the learnable k); the state
    accumulates y so that the multi-step kernels carry something."""
    params = f"parameters:\n  k: {{value: {k}, learnable: true}}\n" if "k" in expr else ""
    return f"""\
neuron: power
inputs: [x]
{params}states:
  v: 0.0
step:
  y: {expr}
  v: 0.5 * v + y
outputs: [y, v]
"""


def reference(fn, x: torch.Tensor, k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The hand-written torch step over time: y_t = fn(x_t, k), v_t = 0.5 v_{t-1} + y_t."""
    v = torch.zeros_like(x[0])
    ys, vs = [], []
    for t in range(x.shape[0]):
        y = fn(x[t], k)
        v = 0.5 * v + y
        ys.append(y)
        vs.append(v)
    return torch.stack(ys), torch.stack(vs)


def _run(module_or_fn, x, k, backend):
    x = x.clone().requires_grad_()
    if backend == "reference":
        k = None if k is None else k.clone().requires_grad_()
        y, v = reference(module_or_fn, x, k)
    else:
        module_or_fn.reset()
        y, v = module_or_fn(x)
        k = getattr(module_or_fn, "k", None)
    # positive weights: an infinite gradient keeps its sign through the sum
    w = torch.linspace(0.5, 1.5, y.numel(), dtype=y.dtype).reshape(y.shape)
    loss = (y * w).sum() + (v * w.flip(0)).sum()
    if k is None:
        return y.detach(), v.detach(), torch.autograd.grad(loss, x)[0], None
    gx, gk = torch.autograd.grad(loss, [x, k])
    return y.detach(), v.detach(), gx, gk


def compare(expr: str, fn, bases, k: float = 2.0, check_k_grad: bool = True) -> None:
    x = torch.tensor(bases, dtype=torch.float64).repeat(3, 1)  # [T=3, N]
    kt = torch.tensor(k, dtype=torch.float64) if "k" in expr else None
    want = _run(fn, x, kt, "reference")
    for backend in ("torch", "triton"):
        module = flexsn_dsl.loads(spec(expr, k), backend=backend).double()
        got = _run(module, x, kt, backend)
        for name, g, w in zip(("y", "v", "grad x", "grad k"), got, want):
            if name == "grad k" and (not check_k_grad or kt is None):
                continue
            assert g is not None and w is not None, (backend, name)
            torch.testing.assert_close(g, w, rtol=1e-10, atol=1e-12, equal_nan=True,
                                       msg=lambda m: f"{backend} {expr} {name}: {m}")


INTEGER = [
    ("x ** 2", lambda x, k: x ** 2),
    ("x ** 3", lambda x, k: x ** 3),
    ("x ** 17", lambda x, k: x ** 17),
    ("x ** 20", lambda x, k: x ** 20),
    ("x ** 2.0", lambda x, k: x ** 2.0),
    ("x ** 33", lambda x, k: x ** 33),
    ("x ** -1", lambda x, k: x ** -1),
    ("x ** -2", lambda x, k: x ** -2),
    ("x ** -17", lambda x, k: x ** -17),
    ("3.0 * x ** -20 - x ** 5", lambda x, k: 3.0 * x ** -20 - x ** 5),
    ("(x - 0.5) ** 7", lambda x, k: (x - 0.5) ** 7),
]


@pytest.mark.parametrize("expr, fn", INTEGER, ids=[e for e, _ in INTEGER])
def test_integer_exponents_of_every_base(expr, fn):
    compare(expr, fn, BASES)


@pytest.mark.parametrize("expr, fn", [("x ** 2.5", lambda x, k: x ** 2.5), ("x ** -1.5", lambda x, k: x ** -1.5),
                                      ("x ** 0.5", lambda x, k: x ** 0.5)], ids=["2.5", "-1.5", "0.5"])
def test_non_integral_constant_exponents(expr, fn):
    compare(expr, fn, BASES)  # NaN for negative bases, 0 or inf at zero, as torch


@pytest.mark.parametrize("k", [3.0, 2.0, 2.5, 0.0, -1.0, -2.0, -0.5])
def test_learnable_exponent(k):
    # negative bases: the sign of an odd power, NaN for a non-integral one; the exponent's
    # gradient b ** k * log(b) is NaN there (torch's too), so it is compared on bases >= 0
    compare("x ** k", lambda x, k: x ** k, BASES, k, check_k_grad=False)
    compare("x ** k", lambda x, k: x ** k, [b for b in BASES if b >= 0], k)


@pytest.mark.parametrize("base", [-2.0, -0.5, 0.0, 2.0])
def test_learnable_exponent_of_a_constant_base(base):
    # the exponents a spec may start from with this base (check refuses 0 ** -1 and (-2) ** 0.5)
    exponents = [3.0, 0.0, -1.0, 0.5] if base > 0 else [3.0, 2.0, -1.0] if base < 0 else [3.0, 0.0, 0.5]
    for k in exponents:  # d/dk is NaN for a negative base (log), 0 for 0 ** k with k >= 0, as torch
        compare(f"({base}) ** k + x", lambda x, k: torch.pow(torch.tensor(base, dtype=torch.float64), k) + x,
                [1.0, 2.0], k)


def test_zero_to_the_power_of_the_input():
    # 0 ** x: 1 at x = 0, 0 for x > 0, inf for x < 0; d/dx is 0 for x >= 0, -inf for x < 0
    compare("0.0 ** x", lambda x, k: 0.0 ** x, BASES)
    compare("2.0 ** x + (-2.0) ** x", lambda x, k: 2.0 ** x + (-2.0) ** x, BASES)


def test_power_of_powers_and_inputs():
    compare("(x * x) ** k", lambda x, k: (x * x) ** k, BASES, 1.5)
    compare("abs(x) ** x", lambda x, k: x.abs() ** x, [b for b in BASES if b != 0])


def test_helpers_are_emitted_once_in_a_fixed_order():
    from flexsn_dsl.compiler import compile_spec

    cores = compile_spec(text=spec("x ** 20 + x ** 3 + x ** 20 * x ** k")).cores.source
    names = [line.split("(")[0][4:] for line in cores.splitlines() if line.startswith("def _pow")]
    assert names == sorted(set(names), key=names.index)  # each once
    squares = [int(n[5:]) for n in names if n[5:].isdigit()]
    assert squares == sorted(squares) and {3, 20} <= set(squares)
    assert "_pow" in names and names.index("_pow") > names.index(f"_pow_{squares[-1]}")
    assert "tl.log(x)" not in cores  # no exp(e * log(b)) for a symbolic exponent


def test_a_spec_without_powers_has_no_helpers():
    from flexsn_dsl.compiler import compile_spec

    assert "def _pow" not in compile_spec(text=spec("sigmoid(x) - x")).cores.source
