"""Language v4 section 1: min, max, clip, abs, relu, sign, heaviside, where and comparisons (as conditions and
as values) nested anywhere an expression may stand (step lines, spike arguments, `equations`, `threshold`, `reset`, refractory `condition`, a spike
argument with a learnable parameter) build and run forward and backward on both backends, which agree;
random specs from the grammar (seeded), and hand-written cases against hand-written torch steps."""
from __future__ import annotations

import os
import random
import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402
from flexsn_dsl.cli import main  # noqa: E402
from flexsn_dsl.compiler import compile_spec  # noqa: E402
from flexsn_dsl.errors import SpecError  # noqa: E402

SPECS = int(os.environ.get("FLEXSN_NESTED_SPECS", "20"))  # random specs per kind (raise it to explore)
# inputs on a grid of dyadic numbers: sums and products with the parameters below are exact in float64, so
# comparisons meet exact ties (x == 0.5, h == v), and both backends must take the same branch there
GRID = [-2.0, -1.5, -1.0, -0.5, -0.25, 0.0, 0.25, 0.5, 0.75, 1.0, 1.5, 2.0]
NUMBERS = ["0", "0.5", "-1", "1.5", "0.25", "-0.5", "2"]
CONDITIONAL = ["min", "max", "clip", "abs", "relu", "where", "sign", "heaviside", "compare"]
COMPARISONS = ["<", "<=", ">", ">=", "==", "!="]


class Grammar:
    """Random expressions of the language over ``names``: mostly the conditional functions, nested."""

    def __init__(self, rng: random.Random, names: list[str]):
        self.rng = rng
        self.names = names

    def leaf(self) -> str:
        return self.rng.choice(self.names) if self.rng.random() < 0.8 else self.rng.choice(NUMBERS)

    def expr(self, depth: int) -> str:
        rng = self.rng
        if depth == 0 or rng.random() < 0.2:
            return self.leaf()
        kind = rng.choice(CONDITIONAL + ["+", "-", "*", "tanh"])
        e = lambda: self.expr(depth - 1)  # noqa: E731
        if kind in ("min", "max"):
            return f"{kind}({e()}, {e()})"
        if kind == "clip":
            lo = rng.choice(["-1", "-0.5", "0", "c"])
            return f"clip({e()}, {lo}, {rng.choice(['1', '1.5', '2'])})"
        if kind in ("abs", "relu", "tanh", "sign"):
            return f"{kind}({e()})"
        if kind == "heaviside":  # 1 at 0, or numpy's value h0 there
            return f"heaviside({e()})" if rng.random() < 0.5 else f"heaviside({e()}, {rng.choice(['0.5', '0', 'a'])})"
        if kind == "compare":  # a comparison as a value: 1 or 0
            return f"({self.condition(depth - 1)})"
        if kind == "where":
            return f"where({self.condition(depth - 1)}, {e()}, {e()})"
        if kind == "*":
            return f"{e()} * {rng.choice(['0.5', '-1.5', 'a', 'c'])}"
        return f"({e()} {kind} {e()})"

    def comparison(self, depth: int, operators=COMPARISONS) -> str:
        return f"{self.expr(depth)} {self.rng.choice(operators)} {self.expr(depth)}"

    def condition(self, depth: int, operators=COMPARISONS) -> str:
        parts = [f"({self.comparison(depth, operators)})" for _ in range(self.rng.choice([1, 1, 2]))]
        return f" {self.rng.choice(['&', '|'])} ".join(parts)


def step_spec(seed: int) -> str:
    """A discrete-time spec with nested functions in every line and in the spike's argument."""
    rng = random.Random(seed)
    g = Grammar(rng, ["x", "v", "w", "a", "c"])
    h = g.expr(3)
    g.names = ["h", "x", "v", "a"]
    u = g.expr(3)
    g.names = ["h", "s", "v", "w", "c"]
    return f"""\
neuron: nest_{seed}
inputs: [x]
parameters: {{a: {{value: 0.25, learnable: true}}, c: 0.75}}
states: {{v: 0.0, w: 0.5}}
step:
  h: {h}
  s: spike({u})
  v: {g.expr(2)} * (1 - s) + {g.leaf()} * s
  w: {g.expr(2)}
outputs: [s, h, v]
"""


def continuous_spec(seed: int) -> str:
    """A continuous-time spec with nested functions in `equations`, `threshold`, `reset` and a refractory
    condition (or period)."""
    rng = random.Random(seed)
    g = Grammar(rng, ["x", "v", "w", "a", "c"])
    threshold = f"v {rng.choice(['>=', '>'])} {g.expr(2)}" if rng.random() < 0.5 else f"v - {g.expr(2)}"  # (on v)
    refractory = rng.choice(["", "refractory: {period: 1.0}\n",
                             f"refractory:\n  condition: {g.condition(2, ['<', '<=', '>', '>='])}\n  hold: [w]\n"])
    return f"""\
neuron: nest_ct_{seed}
inputs: [x]
parameters: {{a: {{value: 0.25, learnable: true}}, c: 0.75, dt: 0.5}}
states: {{v: 0.0, w: 0.5}}
equations:
  v: {g.expr(3)} - v
  w: {g.expr(2)} - 0.5 * w
method: {rng.choice(['euler', 'rk2'])}
threshold: {threshold}
reset:
  v: {g.expr(2)}
{refractory}outputs: [s, v]
"""


def run(text: str, backend: str, x: torch.Tensor):
    """Outputs of two calls (states carried), and the gradients of a weighted sum of them by x and a."""
    m = flexsn_dsl.loads(text, backend=backend).double()
    x = x.clone().requires_grad_()
    outputs = [torch.stack(o) if isinstance(o, (list, tuple)) else o[None] for o in (m(x[:3]), m(x[3:]))]
    y = torch.cat(outputs, 1)
    weights = torch.linspace(0.5, 1.5, y.numel(), dtype=torch.float64).reshape(y.shape)
    grads = torch.autograd.grad((y * weights).sum(), [x, m.a], allow_unused=True) if y.requires_grad else (None, None)
    return y.detach(), [torch.zeros_like(p) if g is None else g for g, p in zip(grads, (x, m.a))]


def agree(text: str) -> None:
    """The spec (if `check` accepts it) gives the same outputs and gradients on both backends in float64."""
    try:
        compile_spec(text=text)
    except SpecError:
        return
    rng = random.Random(text)
    x = torch.tensor([[rng.choice(GRID) for _ in range(6)] for _ in range(5)], dtype=torch.float64)
    (y_torch, g_torch), (y_triton, g_triton) = (run(text, b, x) for b in ("torch", "triton"))
    torch.testing.assert_close(y_triton[0], y_torch[0], rtol=0, atol=0, msg=lambda m: f"spikes differ\n{text}\n{m}")
    torch.testing.assert_close(y_triton, y_torch, rtol=1e-12, atol=1e-12, msg=lambda m: f"{text}\n{m}")
    for a, b in zip(g_triton, g_torch):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12, msg=lambda m: f"gradients\n{text}\n{m}")


@pytest.mark.parametrize("seed", range(SPECS))
def test_random_step_specs_agree_on_both_backends(seed):
    agree(step_spec(seed))


@pytest.mark.parametrize("seed", range(SPECS // 3))
def test_random_continuous_specs_agree_on_both_backends(seed):
    agree(continuous_spec(seed))


def pick(cond, a, b):
    """where(cond, a, b) with number branches."""
    a, b = (t if isinstance(t, torch.Tensor) else torch.tensor(t, dtype=torch.float64) for t in (a, b))
    return torch.where(cond, a, b)


def maximum(a, b):
    """max(a, b): a on ties (torch.maximum splits the gradient there)."""
    return pick(a >= b, a, b)


def minimum(a, b):
    return pick(a <= b, a, b)


def clip(a, lo, hi):
    return pick(a < lo, lo, pick(a > hi, hi, a))


def relu(a):
    return pick(a > 0, a, 0.0)


STATE_LINE = """\
neuron: nest_state
states: {v: 0.0}
step:
  h: clip(x, -1, 1.5)
  s: spike(h + max(h, 0.5))
  g: v + abs(max(x, -0.5))
  v: where((x > 0.5) | (v == 0), max(g, v) * 0.5, -abs(min(x, g)))
outputs: [s, h, g, v]
"""


def state_line_loop(x, th):
    v, out = torch.zeros_like(x[0]), []
    for xt in x:
        h = clip(xt, -1.0, 1.5)
        s = zr.spike(h + maximum(h, 0.5), "sigmoid", alpha=4.0)
        g = v + maximum(xt, -0.5).abs()
        v = pick((xt > 0.5) | (v == 0), maximum(g, v) * 0.5, -minimum(xt, g).abs())
        out.append(torch.stack([s, h, g, v]))
    return torch.stack(out, 1)


CONTINUOUS = """\
neuron: nest_ct
inputs: [x]
parameters: {tau: 2.0, dt: 1.0, th: {value: 0.5, learnable: true}}
states: {v: 0.0}
equations:
  v: (clip(x, -1, 2) - max(v, -0.5)) / tau
method: euler
threshold: max(v, 0) >= th + abs(min(x, 0))
reset:
  v: min(v - 1, relu(x) * 0.5)
refractory:
  condition: max(v, 0.25) > 0.5
  hold: [v]
outputs: [s, v]
"""


def continuous_loop(x, th):
    v, r, out = torch.zeros_like(x[0]), torch.zeros_like(x[0]), []
    for xt in x:
        r = pick(maximum(v, 0.25) > 0.5, r, 0.0)  # still refractory?
        resting = r > 0.5
        v_int = pick(resting, v, v + 1.0 * (clip(xt, -1.0, 2.0) - maximum(v, -0.5)) / 2.0)
        s = pick(resting, 0.0, zr.spike(maximum(v_int, 0.0) - (th + minimum(xt, 0.0).abs()), "sigmoid", alpha=4.0))
        v = s * minimum(v_int - 1, relu(xt) * 0.5) + (1 - s) * v_int
        r = pick(s > 0, 1.0, r)
        out.append(torch.stack([s, v]))
    return torch.stack(out, 1)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("text, loop", [(STATE_LINE, state_line_loop), (CONTINUOUS, continuous_loop)],
                         ids=["step", "continuous"])
def test_nested_functions_match_a_hand_written_step(text, loop, backend):
    """State lines, a spike's argument, `equations`, `threshold` with a learnable parameter, `reset` and a
    refractory condition, each with nested functions, against the step written out in torch (exact ties of
    the grid included: the spikes are equal)."""
    rng = random.Random(7)
    x = torch.tensor([[rng.choice(GRID) for _ in range(8)] for _ in range(6)], dtype=torch.float64,
                     requires_grad=True)
    m = flexsn_dsl.loads(text, backend=backend).double()
    y = torch.stack(m(x))
    th = getattr(m, "th", torch.tensor(0.5, dtype=torch.float64, requires_grad=True))
    want = loop(x, th)
    torch.testing.assert_close(y[0], want[0], rtol=0, atol=0)
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-13)
    assert 0 < want[0].sum() < want[0].numel()
    weights = torch.linspace(0.5, 1.5, y.numel(), dtype=torch.float64).reshape(y.shape)
    got = torch.autograd.grad((y * weights).sum(), [x, th], allow_unused=True)
    expected = torch.autograd.grad((want * weights).sum(), [x, th], allow_unused=True)
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


NESTED_LEARNABLE = """\
neuron: nest_learnable
parameters: {a: {value: 0.75, learnable: true}, v_th: 1.0}
states: {v: 0.0}
step:
  h: v + clip(clip(clip(v + x, -a, a), -1, 1), -0.5, 0.5) + clip(clip(relu(v), abs(v), a - 0.5), relu(x), 1)
  s: spike(h - v_th)
  v: h * (1 - s)
outputs: [s, h]
"""


def nested_learnable_loop(x, a):
    v, out = torch.zeros_like(x[0]), []
    for xt in x:
        h = v + clip(clip(clip(v + xt, -a, a), -1.0, 1.0), -0.5, 0.5) + \
            clip(clip(relu(v), v.abs(), a - 0.5), relu(xt), 1.0)
        s = zr.spike(h - 1.0, "sigmoid", alpha=4.0)
        v = h * (1 - s)
        out.append(torch.stack([s, h]))
    return torch.stack(out, 1)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_a_learnable_parameter_inside_nested_clips(backend):
    """The parameter's gradient through clips nested three deep: each branch's derivative under its own
    condition. sympy's derivative of a Piecewise rewrites the conditions into normal form, exponential in their
    size: this module was 1.7 MB, ten times the same spec's with the parameter fixed (itself 177 kB), and a
    spec like it had a backward the interpreter could not run; now 51 kB against 34 kB."""
    fixed = NESTED_LEARNABLE.replace("learnable: true", "learnable: false")
    assert len(compile_spec(text=NESTED_LEARNABLE).triton_source) < 2 * len(compile_spec(text=fixed).triton_source)
    g = torch.Generator().manual_seed(3)
    x = torch.randn(6, 2, 4, dtype=torch.float64, generator=g, device="cpu").to(torch.get_default_device())
    x.requires_grad_(True)
    m = flexsn_dsl.loads(NESTED_LEARNABLE, backend=backend).double()
    y = torch.stack(m(x))
    want = nested_learnable_loop(x, m.a)
    torch.testing.assert_close(y, want, rtol=1e-13, atol=1e-13)
    assert 0 < want[0].sum() < want[0].numel()
    weights = torch.linspace(0.5, 1.5, y.numel(), dtype=torch.float64).reshape(y.shape)
    got = torch.autograd.grad((y * weights).sum(), [x, m.a])
    expected = torch.autograd.grad((want * weights).sum(), [x, m.a])
    assert expected[1] != 0
    for a, b in zip(got, expected):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", range(4))
def test_float32_agrees_on_both_backends(seed):
    text = step_spec(seed + 1000)
    x = torch.tensor([[random.Random(seed).choice(GRID) for _ in range(6)] for _ in range(5)], dtype=torch.float32)
    y_torch, y_triton = (torch.stack(flexsn_dsl.loads(text, backend=b)(x)) for b in ("torch", "triton"))
    torch.testing.assert_close(y_triton[0], y_torch[0], rtol=0, atol=0)
    torch.testing.assert_close(y_triton, y_torch, rtol=1e-5, atol=1e-5)


LOOPING = """\
neuron: nest_loop
parameters: {a: {value: 0.25, learnable: true}, c: 0.75}
states: {v: 0.0}
step:
  h: x + 0.25
  s: spike(min(tanh(a) - h, (v + h) * c))
  v: h * (1 - s)
"""


def test_a_comparison_sympy_rewrites_forever_is_an_error_at_its_line(tmp_path, capsys):
    """sympy 1.14 turns `tanh(a) - h <= 0.75 * (v + h)` into its mirror image and back without end (once c is
    a number): `check` reports the line."""
    path = tmp_path / "loop.yaml"
    path.write_text(LOOPING)
    assert main(["check", str(path)]) == 1
    assert f"{path}:6:3: error: step 's': sympy cannot put a comparison" in capsys.readouterr().err


def test_check_reports_a_printing_failure_at_the_line_that_causes_it(tmp_path, capsys, monkeypatch):
    """`check` prints both backends' code: a function a printer lacks is an error at the `equations` line that
    uses it (not at `threshold`, nor an internal error)."""
    import sympy

    from flexsn_dsl.printer import TRITON
    monkeypatch.delitem(TRITON.functions, sympy.tanh)
    path = tmp_path / "ct.yaml"
    path.write_text(CONTINUOUS.replace("neuron: nest_ct", "neuron: nest_ct_tanh").replace("max(v, -0.5)) / tau",
                                                                                          "tanh(v)) / tau"))
    assert main(["check", str(path)]) == 1
    err = capsys.readouterr().err
    assert f"{path}:6:6: error: cannot compile neuron 'nest_ct_tanh': cannot print tanh" in err, err


def test_a_neuron_name_is_not_an_expression_name():
    """`xi_<suffix>` is white noise in expressions, not a reserved neuron name."""
    text = STATE_LINE.replace("neuron: nest_state", "neuron: xi_step")
    assert flexsn_dsl.loads(text, backend="triton").spec.name == "xi_step"
