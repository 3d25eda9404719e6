"""PlasticLinear's fused Triton kernel (``backend="triton"``; Triton's interpreter on a CPU): against Brian2's
event-driven STDP, the hand-written loops of test_plasticity.py, and the torch backend in float64; and what it
refuses, loudly."""
from __future__ import annotations

import numpy as np
import pytest
import torch

import flexsn_dsl
from test_plasticity import HERE, SPECS, lif, pair_rule_by_hand, spikes_from

REWARD = """\
kind: synapse
name: reward_stdp
params: {tau_e: 20.0e-3, eta: 0.05, w_max: 1.0}
dt: 1.0e-3
inputs: [reward]
pre:
  elig: {decay: exp(-dt / tau_e)}
post:
  q: {decay: 0.9}
on_pre:
  - elig: elig + 1
  - w: w - 0.001 * q
on_post:
  - q: q + reward
  - w: clip(w + eta * reward * elig, 0, w_max)
"""


def test_brian2_triplet_rule_over_two_calls():
    """Every postsynaptic spike equal and the weights after each call within 1e-12 of Brian2's, the traces and the
    neuron's states carried from the first call to the second (the first two of the reference's calls)."""
    data = np.load(HERE / "data" / "brian2_stdp_triplet.npz")
    T, n_pre, n_post, chunk = (int(v) for v in data["shape"])
    x = spikes_from(data["pre_steps"], data["pre_indices"], T, n_pre)[:, None]
    layer = flexsn_dsl.PlasticLinear(flexsn_dsl.load(SPECS / "stdp_triplet.yaml"), n_pre, n_post, lif(),
                                     weight=torch.tensor(data["w0"]), backend="triton")
    outs = []
    for k in range(2):
        outs.append(layer(x[k * chunk:(k + 1) * chunk]))
        np.testing.assert_allclose(layer.weight.cpu().numpy(), data["weights"][k], rtol=0, atol=1e-12)
    post = torch.cat(outs)[:, 0]
    assert torch.equal(post.cpu(), spikes_from(data["post_steps"], data["post_indices"], T, n_post)[:2 * chunk].cpu())
    assert post.sum() > 3 and (data["weights"][1] != data["w0"]).mean() > 0.5


@pytest.mark.parametrize("shared", [True, False])
def test_pair_rule_against_loops(shared):
    """Per-sample weights (a batch of three) and shared ones (a batch of one) against plain loops."""
    torch.manual_seed(0)
    T, B, n_pre, n_post = 60, 1 if shared else 3, 7, 4
    x = (torch.rand(T, B, n_pre, dtype=torch.float64) < 0.3).double()
    w0 = torch.rand(n_post, n_pre, dtype=torch.float64) * 0.6
    layer = flexsn_dsl.load(SPECS / "stdp_pair.yaml")(n_pre, n_post, lif(), weight=w0, per_sample=not shared,
                                                        backend="triton")
    out = layer(x)
    ref_out, ref_w = pair_rule_by_hand(x.cpu().numpy(), w0.cpu().numpy(), shared)
    assert out.sum() > 5
    np.testing.assert_array_equal(out.cpu().numpy(), ref_out)
    np.testing.assert_allclose(layer.weight.cpu().numpy(), ref_w, rtol=0, atol=1e-12)


def run(backend: str, x: torch.Tensor, reward: torch.Tensor, n_post: int, calls: int):
    """The reward rule above on ``x`` in ``calls`` calls: spikes, weights, traces and the neuron's state."""
    neuron = lif()
    w0 = torch.rand(n_post, x.shape[-1], dtype=torch.float64, generator=torch.Generator().manual_seed(3),
                    device="cpu").to(x.device) * 0.05
    layer = flexsn_dsl.loads(REWARD)(x.shape[-1], n_post, neuron, weight=w0, per_sample=True, backend=backend)
    out = torch.cat([layer(a, r) for a, r in zip(x.chunk(calls), reward.chunk(calls))])
    return out, layer.weight, layer.traces, neuron.states["v"]


def test_blocks_of_rows_chunks_of_columns_and_inputs_against_torch():
    """Three blocks of 16 rows (n_post = 33), two chunks of columns (n_pre = 300), an input read in both blocks,
    a post trace read by an on_pre line, in two calls: equal to the torch backend to 1e-12 in float64."""
    torch.manual_seed(4)
    T, B, n_pre, n_post = 24, 2, 300, 33
    x = (torch.rand(T, B, n_pre, dtype=torch.float64) < 0.1).double()
    reward = torch.randn(T, B, dtype=torch.float64)
    fused, loop = run("triton", x, reward, n_post, 2), run("torch", x, reward, n_post, 2)
    assert torch.equal(fused[0], loop[0]) and 0.05 < loop[0].mean() < 0.5
    for a, b in zip((fused[1], *fused[2].values(), fused[3]), (loop[1], *loop[2].values(), loop[3])):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-12)
    assert set(fused[2]) == {"elig", "q"} and (fused[1] != run("torch", x, 0 * reward, n_post, 1)[1]).any()


def test_what_the_fused_kernel_refuses_it_says():
    spec = flexsn_dsl.load(SPECS / "stdp_pair.yaml")
    x = torch.zeros(3, 2, 4, dtype=torch.float64)
    with pytest.raises(flexsn_dsl.SpecError, match="per_sample=True or a batch of one"):
        spec(4, 2, lif(), weight=0.5, backend="triton")(x)
    two_inputs = flexsn_dsl.loads("neuron: two\ninputs: [x, y]\nstates: {v: 0.0}\nstep:\n  s: spike(v + x + y - 1)\n"
                                  "  v: v + x + y - s\n", backend="torch")
    with pytest.raises(flexsn_dsl.SpecError, match="one input"):
        spec(4, 2, two_inputs, weight=0.5, per_sample=True, backend="triton")(x)
    with pytest.raises(flexsn_dsl.SpecError, match="not a flexsn-dsl neuron module"):
        spec(4, 2, torch.nn.ReLU(), weight=0.5, per_sample=True, backend="triton")(x)
    with pytest.raises(ValueError, match="backend"):
        spec(4, 2, lif(), backend="cuda")
    assert "backend='auto'" in repr(spec(4, 2, lif()))


def test_show_prints_the_fused_kernel_that_runs(tmp_path, capsys):
    """``flexsn-dsl show SYN --kernel plastic --neuron NEURON`` prints the very kernel PlasticLinear runs (the text
    the module imports, which runs as above); a neuron it cannot drive, or a missing half, is an error that says so."""
    from flexsn_dsl.cli import main
    from flexsn_dsl.compiler import compile_spec
    import inspect
    from flexsn_dsl.plastic_kernels import plastic_module
    syn, neuron = SPECS / "stdp_pair.yaml", HERE.parent / "neurons" / "lif.yaml"
    assert main(["show", str(syn), "--kernel", "plastic", "--neuron", str(neuron)]) == 0
    text = capsys.readouterr().out
    kernel = plastic_module(flexsn_dsl.load(syn).model, compile_spec(neuron))
    assert inspect.getsource(kernel.fn) in text and "def lif_forward_core(" in text
    assert main(["show", str(syn), "--kernel", "plastic", "--neuron", str(HERE.parent / "neurons" / "rlif.yaml")]) == 1
    assert "cannot drive neuron rlif in a fused kernel: the fused kernel does not drive neurons with `recurrent`" in \
        capsys.readouterr().err
    for args in (["--kernel", "plastic"], ["--neuron", str(neuron)]):
        assert main(["show", str(syn), *args]) == 1
        assert "give both: flexsn-dsl show SYNAPSE.yaml --kernel plastic --neuron NEURON.yaml" in capsys.readouterr().err


def test_kernel_built_once_per_neuron_code_and_layers_copy(monkeypatch):
    """The kernel's text is printed once for a layer's post neuron, not at every call; a deep copy (which cannot
    copy a Triton function) builds its own and goes on exactly as the original does."""
    import copy
    import pickle
    from flexsn_dsl import plastic_kernels
    printed = []
    source = plastic_kernels.plastic_source
    monkeypatch.setattr(plastic_kernels, "plastic_source", lambda *a: printed.append(a) or source(*a))
    torch.manual_seed(5)
    x = (torch.rand(30, 1, 7, dtype=torch.float64) < 0.3).double()
    layer = flexsn_dsl.load(SPECS / "stdp_pair.yaml")(7, 4, lif(), weight=0.4, backend="triton")
    layer(x[:10])
    layer(x[10:20])
    assert len(printed) == 1
    twin, saved = copy.deepcopy(layer), pickle.loads(pickle.dumps(layer))
    out = layer(x[20:])
    for other in (twin, saved):
        assert torch.equal(other(x[20:]), out) and torch.equal(other.weight, layer.weight)
    assert len(printed) == 3 and layer.weight.std() > 0
