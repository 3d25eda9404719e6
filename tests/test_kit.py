"""The newcomer's kit: flexsn_dsl.encode, Monitor, summary and the repr of a neuron module, against
hand-written loops and direct calls of the same modules."""
from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import encode

ROOT = Path(__file__).resolve().parents[1]
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


# -- encoders --------------------------------------------------------------------------------

def test_rate_is_bernoulli_with_the_clipped_probability():
    x = torch.tensor([-0.5, 0.0, 0.3, 0.9, 1.0, 2.0], device="cpu")
    torch.manual_seed(3)
    spikes = encode.rate(x, 4000)
    assert spikes.shape == (4000, 6) and set(spikes.unique().tolist()) <= {0.0, 1.0}
    p = x.clamp(0, 1)
    mean = spikes.mean(0)
    bound = 5 * torch.sqrt(p * (1 - p) / 4000)  # five standard errors of a Bernoulli mean
    assert torch.all((mean - p).abs() <= bound + 1e-12), (mean, p)
    assert mean[0] == 0 and mean[1] == 0 and mean[4] == 1 and mean[5] == 1  # clipped: never / always
    torch.manual_seed(3)
    assert torch.equal(encode.rate(x, 4000), spikes)  # torch's generator: a seed reproduces it
    g1, g2 = torch.Generator().manual_seed(7), torch.Generator().manual_seed(7)
    assert torch.equal(encode.rate(x, 50, generator=g1), encode.rate(x, 50, generator=g2))


def test_rate_draws_are_independent_across_steps_and_elements():
    torch.manual_seed(0)
    s = encode.rate(torch.full((2000,), 0.5, device="cpu"), 2)
    agree = (s[0] == s[1]).float().mean()  # independent fair coins agree half of the time
    assert abs(float(agree) - 0.5) < 5 * math.sqrt(0.25 / 2000)


def test_latency_fires_once_at_the_rounded_time():
    x = torch.tensor([[0.0, 0.1, 0.25, 0.5], [0.75, 1.0, 1.7, -0.2]], dtype=torch.float64, device="cpu")
    T = 9
    out = encode.latency(x, T)
    assert out.shape == (T, 2, 4) and out.dtype == x.dtype
    for i in range(2):
        for j in range(4):
            v = float(x[i, j])
            column = out[:, i, j]
            if v <= 0:
                assert column.sum() == 0
            else:
                assert column.sum() == 1 and int(column.argmax()) == round((1 - min(v, 1.0)) * (T - 1))
    assert int(out[:, 1, 1].argmax()) == 0 and int(out[:, 0, 1].argmax()) == 7  # larger inputs fire earlier


def test_delta_fires_where_the_signal_rises_by_the_threshold():
    seq = torch.tensor([[0.5, 0.0], [0.6, 0.3], [1.2, 0.2], [0.0, 0.6], [0.5, 0.9]], device="cpu")
    out = encode.delta(seq, 0.3)
    want = torch.zeros_like(seq)
    for t in range(seq.shape[0]):
        prev = seq[t - 1] if t else torch.zeros_like(seq[0])
        want[t] = (seq[t] - prev >= 0.3).float()
    assert torch.equal(out, want) and want.sum() > 0
    assert out[0, 0] == 1  # seq[-1] is taken as 0


@pytest.mark.parametrize("call", [lambda: encode.rate(torch.ones(2), 0), lambda: encode.latency(torch.ones(2), -1),
                                  lambda: encode.delta(torch.tensor(1.0), 0.1)])
def test_encoders_refuse_bad_arguments(call):
    with pytest.raises(ValueError):
        call()


# -- Monitor ---------------------------------------------------------------------------------

def _rand(*shape: int, seed: int = 1) -> torch.Tensor:
    """Drawn on the CPU (the same numbers on any machine), on the default device (the GPU on a GPU machine)."""
    return torch.rand(*shape, generator=torch.Generator().manual_seed(seed), device="cpu").to(torch.get_default_device())


def _net(backend: str = "torch") -> torch.nn.Sequential:
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(3, 6), flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend=backend),
                                  torch.nn.Linear(6, 4), flexsn_dsl.load(ROOT / "neurons" / "alif.yaml", backend=backend))
    with torch.no_grad():
        net[2].weight.abs_().mul_(4)  # excitatory: the second layer spikes too
    return net.to(torch.get_default_device())


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_monitor_records_outputs_and_states_as_direct_calls_give_them(backend):
    net = _net(backend)
    x = _rand(12, 2, 3) * 4
    with flexsn_dsl.Monitor(net) as mon:
        y = net(x)
    flexsn_dsl.reset_net(net)
    h = net[0](x)  # the same layers called by hand, each storing its state sequences
    net[1].store_state_seqs = net[3].store_state_seqs = True
    s1 = net[1](h)
    s3 = net[3](net[2](s1))
    assert torch.equal(y, s3) and s1.sum() > 0 and s3.sum() > 0
    assert set(mon.outputs) == {"1", "3"}
    assert torch.equal(mon.outputs["1"], s1) and torch.equal(mon.outputs["3"], s3)
    assert torch.equal(mon.states["1"]["v"], net[1].state_seqs["v"])
    assert {k: v.shape for k, v in mon.states["3"].items()} == {"v": (12, 2, 4), "b": (12, 2, 4)}
    torch.testing.assert_close(mon.states["3"]["b"], net[3].state_seqs["b"], rtol=0, atol=0)
    assert mon.spike_counts() == {"1": int(s1.sum()), "3": int(s3.sum())}


def test_monitor_leaves_no_trace_outside_and_restores_after_an_exception():
    net = _net()
    before = [(m.store_state_seqs, len(m._forward_hooks)) for m in (net[1], net[3])]
    x = _rand(5, 1, 3) * 4
    with pytest.raises(RuntimeError, match="boom"):
        with flexsn_dsl.Monitor(net) as mon:
            net(x)
            raise RuntimeError("boom")
    assert [(m.store_state_seqs, len(m._forward_hooks)) for m in (net[1], net[3])] == before
    recorded = mon.outputs["1"].clone()
    flexsn_dsl.reset_net(net)
    net(x)  # outside: nothing more is recorded
    assert torch.equal(mon.outputs["1"], recorded) and mon.outputs["1"].shape[0] == 5
    mon.clear()
    assert mon.outputs == {} and mon.states == {}


def test_monitor_stacks_single_steps_along_time():
    with torch.device("cpu"):
        lif = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="torch", step_mode="s")
        ref = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", backend="torch", store_state_seqs=True)
    x = torch.rand(7, 3, device="cpu") * 3
    with flexsn_dsl.Monitor(lif) as mon:
        for xt in x:
            lif(xt)
    want = ref(x)
    assert torch.equal(mon.outputs[""], want)  # the module itself: its name is ""
    assert torch.equal(mon.states[""]["v"], ref.state_seqs["v"])


def test_monitor_plot_writes_a_png(tmp_path):
    pytest.importorskip("matplotlib")  # the plot extra
    net = _net()
    with flexsn_dsl.Monitor(net) as mon:
        net(_rand(6, 2, 3) * 4)
    mon.plot(tmp_path / "net.png")
    assert (tmp_path / "net.png").read_bytes().startswith(PNG_MAGIC)
    with pytest.raises(ValueError, match="nothing was recorded"):
        flexsn_dsl.Monitor(net).plot(tmp_path / "empty.png")


# -- summary and repr ------------------------------------------------------------------------

def test_summary_has_a_row_per_neuron_layer_with_its_rate():
    net = _net()
    net.append(flexsn_dsl.load(ROOT / "neurons" / "lif_hetero.yaml", backend="torch", sizes={"N": 4}))
    x = _rand(10, 2, 3, seed=2) * 4
    text = flexsn_dsl.summary(net, x)
    assert all(not m.states for m in (net[1], net[3], net[4]))  # reset after the sample
    with torch.no_grad():
        s1 = net[1](net[0](x))
        s3 = net[3](net[2](s1))
        s4 = net[4](s3)
    lines = text.splitlines()
    assert lines[0].split() == ["layer", "neuron", "backend", "neurons/step", "step", "shape", "states", "parameters",
                                "spike", "rate"]
    rows = {line.split()[0]: line for line in lines[2:]}
    assert set(rows) == {"1", "3", "4"}
    assert rows["1"].split()[1:5] == ["lif", "torch", "12", "[2,"]
    assert f"{float(s1.mean()):.4f}" == rows["1"].split()[-1] and f"{float(s3.mean()):.4f}" == rows["3"].split()[-1]
    assert f"{float(s4.mean()):.4f}" == rows["4"].split()[-1]
    assert "tau=[4] all 20 (learnable)" in rows["4"] and "beta=0.5 (learnable)" in rows["3"] and "v, b" in rows["3"]


def test_repr_shows_parameter_values_and_shapes():
    with torch.device("cpu"):
        m = flexsn_dsl.load(ROOT / "neurons" / "plif_channel.yaml", backend="torch", sizes={"C": 3},
                            params={"init_tau": 3.0})
    with torch.no_grad():
        m.w[1] = 0.25
    text = repr(m)
    w = -math.log(3.0 - 1)
    assert f"w=[3, 1, 1] in [{w:.4g}, 0.25] (learnable)" in text
    assert "init_tau=3" in text and "v_th=1" in text and "neuron='plif_channel'" in text


def test_a_monitor_is_not_entered_twice():
    net = _net()
    mon = flexsn_dsl.Monitor(net)
    with mon:
        with pytest.raises(RuntimeError, match="already recording"):
            mon.__enter__()
    assert not net[1].store_state_seqs and not net[1]._forward_hooks

