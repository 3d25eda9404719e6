"""Synapse specs (``kind: synapse``) and ``PlasticLinear``: against Brian2's event-driven STDP (references made by
tests/make_brian2_stdp_references.py), against hand-written loops, and their errors (file:line:col)."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch

import flexsn_dsl
from flexsn_dsl.plastic import SynapseSpec

HERE = Path(__file__).resolve().parent
SPECS = HERE / "specs"
PAIR = (SPECS / "stdp_pair.yaml").read_text()


def lif(**kw):
    return flexsn_dsl.load(SPECS / "lif_brian2.yaml", backend="torch", **kw)


def spikes_from(steps, indices, T: int, n: int) -> torch.Tensor:
    out = torch.zeros(T, n, dtype=torch.float64)
    out[torch.as_tensor(steps, dtype=torch.long), torch.as_tensor(indices, dtype=torch.long)] = 1
    return out


@pytest.mark.parametrize("rule,spec", [("pair", "stdp_pair"), ("multiplicative", "stdp_multiplicative"),
                                       ("triplet", "stdp_triplet")])
def test_brian2_event_driven_stdp(rule, spec):
    """Every postsynaptic spike equal and every weight (after each of several calls) within 1e-12 of Brian2's."""
    data = np.load(HERE / "data" / f"brian2_stdp_{rule}.npz")
    T, n_pre, n_post, chunk = (int(v) for v in data["shape"])
    x = spikes_from(data["pre_steps"], data["pre_indices"], T, n_pre)[:, None]
    layer = flexsn_dsl.PlasticLinear(flexsn_dsl.load(SPECS / f"{spec}.yaml"), n_pre, n_post, lif(),
                                     weight=torch.tensor(data["w0"]))
    outs = []
    for k in range(T // chunk):  # traces and the neuron's states carry over between calls
        outs.append(layer(x[k * chunk:(k + 1) * chunk]))
        assert layer.weight.dtype == torch.float64
        np.testing.assert_allclose(layer.weight.cpu().numpy(), data["weights"][k], rtol=0, atol=1e-12)
    post = torch.cat(outs)[:, 0]
    assert torch.equal(post.cpu(), spikes_from(data["post_steps"], data["post_indices"], T, n_post).cpu())
    assert 0 < len(data["post_steps"]) < T * n_post / 4  # the reference is neither silent nor saturated
    assert (data["weights"][-1] != data["w0"]).mean() > 0.5


def pair_rule_by_hand(x: np.ndarray, w0: np.ndarray, shared: bool) -> tuple[np.ndarray, np.ndarray]:
    """The pair rule of stdp_pair.yaml and lif_brian2.yaml in plain loops: x [T, B, n_pre]; w0 [n_post, n_pre]."""
    T, B, n_pre = x.shape
    n_post = w0.shape[0]
    d_pre, d_post, d_v = np.exp(-1e-3 / 20e-3), np.exp(-1e-3 / 20e-3), np.exp(-1e-3 / 10e-3)
    w = np.array(w0, dtype=float) if shared else np.repeat(w0[None], B, 0).astype(float)
    apre, apost, v = np.zeros((B, n_pre)), np.zeros((B, n_post)), np.zeros((B, n_post))
    out = np.zeros((T, B, n_post))
    for t in range(T):
        apre, apost = apre * d_pre, apost * d_post
        before = w.copy()
        new = w.copy() if shared else w
        for b in range(B):
            wb = before if shared else w[b]
            h = v[b] * d_v + wb @ x[t, b]
            s = h >= 1.0
            v[b] = np.where(s, 0.0, h)
            out[t, b] = s
        for b in range(B):  # on_pre, then on_post; shared: each batch entry's changes added up
            wb = before.copy() if shared else w[b]
            for i in np.nonzero(x[t, b])[0]:
                apre[b, i] += 0.01
                wb[:, i] = np.clip(wb[:, i] + apost[b], 0, 1)
            if shared:
                new += wb - before
        if shared:
            w, before = new, new.copy()
            new = w.copy()
        for b in range(B):
            wb = before.copy() if shared else w[b]
            for j in np.nonzero(out[t, b])[0]:
                apost[b, j] -= 0.0105
                wb[j] = np.clip(wb[j] + apre[b], 0, 1)
            if shared:
                new += wb - before
        if shared:
            w = new
    return out, w


@pytest.mark.parametrize("shared", [True, False])
def test_shared_and_per_sample_weights_against_loops(shared):
    torch.manual_seed(0)
    T, B, n_pre, n_post = 60, 3, 7, 4
    x = (torch.rand(T, B, n_pre, dtype=torch.float64) < 0.3).double()
    w0 = torch.rand(n_post, n_pre, dtype=torch.float64) * 0.6
    layer = flexsn_dsl.load(SPECS / "stdp_pair.yaml")(n_pre, n_post, lif(), weight=w0, per_sample=not shared)
    out = layer(x)
    ref_out, ref_w = pair_rule_by_hand(x.cpu().numpy(), w0.cpu().numpy(), shared)
    assert out.sum() > 5
    np.testing.assert_array_equal(out.cpu().numpy(), ref_out)
    assert layer.weight.shape == ((n_post, n_pre) if shared else (B, n_post, n_pre))
    np.testing.assert_allclose(layer.weight.cpu().numpy(), ref_w, rtol=0, atol=1e-12)


def test_per_sample_entries_are_independent_copies():
    """Each batch entry of a per_sample layer learns as a layer of its own with that entry alone."""
    torch.manual_seed(1)
    x = (torch.rand(80, 3, 6, dtype=torch.float64) < 0.3).double()
    w0 = torch.full((2, 6), 0.3, dtype=torch.float64)
    spec = flexsn_dsl.load(SPECS / "stdp_triplet.yaml")
    batch = spec(6, 2, lif(), weight=w0, per_sample=True)
    out = batch(x)
    for b in range(3):
        alone = spec(6, 2, lif(), weight=w0)
        assert torch.equal(alone(x[:, b:b + 1])[:, 0], out[:, b])
        assert torch.equal(alone.weight, batch.weight[b])


def test_load_factory_params_reset_and_no_autograd():
    spec = flexsn_dsl.loads(PAIR, params={"a_plus": 0.5})
    assert isinstance(spec, SynapseSpec) and spec.model.params["a_plus"] == 0.5
    neuron = flexsn_dsl.loads("neuron: n\nparameters: {g: {value: 1.0, learnable: true}}\nstates: {v: 0.0}\n"
                              "step:\n  s: spike(v + g * x - 1.0)\n  v: (v + g * x) * (1 - s)\n", backend="torch")
    layer = spec(3, 2, neuron, weight=1.0)
    x = torch.tensor([[[1.0, 0.0, 0.0]], [[0.0, 0.0, 0.0]], [[0.0, 1.0, 1.0]]])
    with torch.enable_grad():
        out = layer(x)
    assert not out.requires_grad and not layer.weight.requires_grad
    assert out[:, 0].tolist() == [[1.0, 1.0], [0.0, 0.0], [1.0, 1.0]]
    # step 0: apre[0] = 0.5, both posts spike: apost = -0.0105, w[:, 0] = clip(1 + 0.5, 0, 1) = 1;
    # step 2: inputs 1, 2 spike: apre[1:] = 0.5, w[:, 1:] = 1 + apost (decayed twice), then the posts spike again:
    # apost -= 0.0105, w[:, 1:] = clip(w + 0.5, 0, 1) = 1
    d = np.exp(-1e-3 / 20e-3)
    np.testing.assert_allclose(layer.traces["apre"].cpu().numpy(), [[0.5 * d * d, 0.5, 0.5]], rtol=1e-6)
    np.testing.assert_allclose(layer.traces["apost"].cpu().numpy(), [[-0.0105 * (d * d + 1)] * 2], rtol=1e-6)
    assert layer.weight.tolist() == [[1.0] * 3] * 2
    layer.reset()
    assert layer.traces == {} and neuron.states == {}
    with pytest.raises(flexsn_dsl.ShapeError, match="n_pre"):
        layer(torch.zeros(4, 1, 5))


def test_a_three_factor_rule_learns_which_pattern_is_rewarded():
    """An input ``reward`` read in a line: the pre trace (eligibility) times the reward at each post spike. The
    neuron answers both input patterns at first; rewarded for pattern A and punished for B, it keeps A only."""
    text = """\
kind: synapse
name: reward_stdp
params: {tau_e: 20.0e-3, eta: 0.05, w_max: 1.0}
dt: 1.0e-3
inputs: [reward]
pre:
  elig: {decay: exp(-dt / tau_e)}
on_pre:
  - elig: elig + 1
on_post:
  - w: clip(w + eta * reward * elig, 0, w_max)
"""
    torch.manual_seed(2)
    epochs, length, n = 40, 50, 20  # each epoch: one pattern for `length` steps, then as many silent ones
    pattern = torch.arange(epochs) % 2  # 0: pattern A (inputs 0..9), 1: pattern B (inputs 10..19)
    active = torch.zeros(epochs, 2 * length, n, dtype=torch.bool)
    active[pattern == 0, :length, :10], active[pattern == 1, :length, 10:] = True, True
    x = ((torch.rand(epochs, 2 * length, n, dtype=torch.float64) < 0.1) & active).double().reshape(-1, 1, n)
    reward = (1.0 - 2.0 * pattern.double()).repeat_interleave(2 * length)  # +1 during A, -1 during B
    layer = flexsn_dsl.loads(text)(n, 1, lif(), weight=torch.full((1, n), 0.5, dtype=torch.float64))
    out = layer(x, reward).reshape(epochs, -1).sum(1)
    assert out[0] > 10 and out[1] > 5  # both patterns drive the neuron at first
    assert out[-10:][1::2].sum() * 5 < out[-10:][0::2].sum()  # then mostly the rewarded one
    assert layer.weight[0, 10:].max() < layer.weight[0, :10].min()


def error_of(text: str) -> flexsn_dsl.SpecError:
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="syn.yaml")
    return info.value


P = pytest.param
ERRORS = [
    P(PAIR.replace("clip(w + apost, 0, w_max)", "clip(w + apsot, 0, w_max)"), 12, 17, "unknown name 'apsot'",
      id="unknown-name"),
    P(PAIR.replace("  - apre: apre + a_plus", "  - apost: apost + a_plus"), 11, 5, "wrong side", id="post-trace-in-on_pre"),
    P(PAIR.replace("  - apost: apost + a_minus", "  - apre: apre + a_minus"), 14, 5, "wrong side",
      id="pre-trace-in-on_post"),
    P(PAIR + "w: w + 1\n", 16, 1, "outside `on_pre`/`on_post`", id="w-top-level"),
    P(PAIR.replace("  apre: {decay", "  w: {decay: 1.0}\n  apre: {decay"), 7, 3, "outside `on_pre`/`on_post`",
      id="w-in-pre"),
    P(PAIR.replace("  - apre: apre + a_plus", "  - apre: apre + w"), 11, 18, "may not use the weight w",
      id="trace-line-reads-w"),
    P(PAIR.replace("  - apre: apre + a_plus", "  - apre: apre + apost"), 11, 18, "one number per pre",
      id="trace-line-reads-other-side"),
    P(PAIR.replace("exp(-dt / tau_pre)", "exp(-dt / tau_pre) * apost"), 7, 38, "unknown name 'apost'",
      id="decay-reads-a-later-trace"),
    P(PAIR.replace("  - apre: apre + a_plus", "  - tau_pre: 1.0"), 11, 5, "cannot assign the parameter",
      id="assign-a-parameter"),
    P(PAIR.replace("  - apre: apre + a_plus", "  - apre: apre + a_plus\n    w: 1.0"), 11, 5, "one `name: expression`",
      id="two-keys-in-a-line"),
    P(PAIR.replace("dt: 1.0e-3", "dt: 1.0e-3\npost_traces: {}"), 6, 1, "unknown key", id="unknown-key"),
    P(PAIR.replace("name: stdp\n", ""), 1, 1, "missing required key 'name'", id="no-name"),
    P(PAIR.replace("clip(w + apre, 0, w_max)", "clip(w + spike(apre), 0, w_max)"), 15, 8, "spike()",
      id="spike-in-a-line"),
]


@pytest.mark.parametrize("text,line,col,fragment", ERRORS)
def test_errors_name_file_line_and_column(text, line, col, fragment):
    error = error_of(text)
    assert (error.file, error.line, error.col) == ("syn.yaml", line, col), str(error)
    assert fragment in error.message and error.hint
