"""Language v3 section 2: a refractory `condition` (Brian2's order) on both backends, against a
hand-written torch loop; carried across calls, cleared by reset(); every error also from
`flexsn-dsl check` (tests/test_brian2.py runs the zoo's hh against Brian2 spike for spike)."""
from __future__ import annotations

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.cli import main

# a neuron whose voltage stays above threshold for a while after it crosses it (no reset of v)
SPEC = """\
neuron: plateau
inputs: [x]
parameters: {tau: 3.0, v_th: 1.0, v_off: 0.8, dt: 1.0}
states: {v: 0.0, w: 0.0}
equations:
  v: (x - v - w) / tau
  w: (0.3 * v - w) / 20.0
method: euler
threshold: v >= v_th
refractory:
  condition: (v > v_off) | (w > 2)
  hold: [w]
surrogate: {name: sigmoid, alpha: 4.0}
outputs: [s, v]
"""


def loop(x: torch.Tensor, v: torch.Tensor, w: torch.Tensor, r: torch.Tensor):
    """The step of SPEC written out: returns (s, v trace) and the final (v, w, r)."""
    ss, vs = [], []
    for xt in x:
        r = torch.where((v > 0.8) | (w > 2), r, torch.zeros_like(r))  # 1. still refractory?
        resting = r > 0.5
        v_new = v + (xt - v - w) / 3.0                                # 2. integrate (Euler), w held
        w_new = torch.where(resting, w, w + (0.3 * v - w) / 20.0)
        h = v_new - 1.0
        s = torch.where(resting, torch.zeros_like(h), (h >= 0).to(h.dtype) + 0 * h)  # 3. threshold
        r = torch.where(s > 0, torch.ones_like(r), r)                 # 4. a spike starts it
        v, w = v_new, w_new
        ss.append(s), vs.append(v)
    return torch.stack(ss), torch.stack(vs), (v, w, r)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_refractory_while_the_condition_holds(backend):
    g = torch.Generator().manual_seed(5)
    x = (torch.rand(120, 4, generator=g, dtype=torch.float64, device="cpu") * 3.0).to(torch.get_default_device())
    m = flexsn_dsl.loads(SPEC, backend=backend, store_state_seqs=True).double()
    zeros = torch.zeros(4, dtype=torch.float64)
    s_ref, v_ref, carried = loop(x[:60], zeros, zeros, zeros)
    s, v = m(x[:60])
    s2_ref, v2_ref, _ = loop(x[60:], *carried)
    s2, v2 = m(x[60:])  # the flag is carried across calls
    torch.testing.assert_close(torch.cat([s, s2]), torch.cat([s_ref, s2_ref]), rtol=0, atol=0)
    torch.testing.assert_close(torch.cat([v, v2]), torch.cat([v_ref, v2_ref]), rtol=1e-13, atol=1e-13)
    assert 0 < s_ref.sum() and (v_ref >= 1.0).sum() > s_ref.sum()  # spikes, and steps above threshold without one
    assert set(m.state_seqs["refractory"].unique().tolist()) == {0.0, 1.0}
    m.reset()
    assert m.states == {}
    torch.testing.assert_close(m(x[:60])[0], s_ref, rtol=0, atol=0)  # reset() clears the flag


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_equality_and_inequality_in_a_condition(backend):
    """`==` and `!=` are comparisons too (language v4): `x != 0` holds where `(x < 0) | (x > 0)` does, and
    `x == 0` where `(x <= 0) & (x >= 0)` does, on inputs with exact zeros."""
    g = torch.Generator().manual_seed(2)
    x = torch.rand(80, 4, generator=g, dtype=torch.float64, device="cpu") * 3.0
    x[torch.rand(80, 4, generator=g, device="cpu") < 0.4] = 0.0
    x = x.to(torch.get_default_device())
    for written, spelled in (("(v > v_off) | (x != 0)", "(v > v_off) | (x < 0) | (x > 0)"),
                             ("(v > v_off) & (x == 0)", "(v > v_off) & (x <= 0) & (x >= 0)")):
        got, want = (flexsn_dsl.loads(SPEC.replace("(v > v_off) | (w > 2)", c), backend=backend).double()(x)
                     for c in (written, spelled))
        torch.testing.assert_close(got, want, rtol=0, atol=0)
        assert 0 < got[0].sum() < (got[1] >= 1.0).sum()  # spikes, and steps above threshold without one


@pytest.mark.parametrize("text, line, col, message", [
    ("refractory:\n  period: 2.0\n  condition: v > 0.8\n", 12, 3, "`refractory` has both `period` and `condition`"),
    ("refractory:\n  condition: v - 0.8\n", 11, 14, "the refractory condition must be a comparison"),
    ("refractory:\n  condition: v * (w > 2)\n", 11, 14, "the refractory condition must be a comparison"),
    ("refractory:\n  condition: tau > 1\n", 11, 14, "does not depend on a state: it cannot end"),
    ("refractory:\n  conditon: v > 1\n", 11, 3, "unknown key 'conditon' in `refractory`"),
])
def test_errors_name_the_place_in_load_and_check(text, line, col, message, tmp_path, capsys):
    bad = SPEC.replace("refractory:\n  condition: (v > v_off) | (w > 2)\n  hold: [w]\n", text)
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(bad, filename="spec.yaml")
    assert (info.value.line, info.value.col) == (line, col) and message in info.value.message
    (tmp_path / "spec.yaml").write_text(bad)
    assert main(["check", str(tmp_path / "spec.yaml")]) == 1
    assert f"spec.yaml:{line}:{col}: error: " in capsys.readouterr().err
