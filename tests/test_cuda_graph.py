"""A whole training step (forward, backward, optimizer step) of a conv SNN with our neurons,
captured in one CUDA graph and replayed, trains exactly as the same steps run eagerly
(examples/cuda_graph_step.py); bench's CUDA-graph timer replays what it captured. GPU only."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

from flexsn_dsl.bench import graph_replay_ms
from flexsn_dsl.cli import main
from flexsn_dsl.triton_runtime import interpreting

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "cuda_graph_step.py"

pytestmark = pytest.mark.skipif(not torch.cuda.is_available() or interpreting(),
                                reason="CUDA graphs need a CUDA GPU and compiled Triton kernels (not the interpreter)")


def _example():
    spec = importlib.util.spec_from_file_location("example_cuda_graph_step", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_a_captured_training_step_replays_the_eager_steps():
    result = _example().run(steps=12, batch=16, size=16, width=8, T=4)
    eager, graphed = result["eager_losses"], result["graph_losses"]
    assert len(eager) == len(graphed) == 12
    # the replays are real steps: the loss moves, and each replay computes the eager step's loss
    assert len(set(graphed[3:])) > 1
    torch.testing.assert_close(torch.tensor(graphed), torch.tensor(eager), rtol=1e-4, atol=1e-5)
    assert result["max_param_diff"] < 1e-4


def test_the_captured_step_starts_every_replay_from_reset_states():
    """Replaying one batch twice gives the same loss when nothing learns (lr 0): no state leaks between replays."""
    module = _example()
    model = module.ConvSNN(8, 4).cuda()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    x, y = module.batches(1, 16, 16, torch.device("cuda"))[0]
    model.eval()  # BatchNorm with running statistics: a step changes nothing
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        expected = module.train_step(model, optimizer, x, y).item()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        loss = module.train_step(model, optimizer, x, y)
    losses = []
    for _ in range(3):
        graph.replay()
        losses.append(loss.item())
    assert losses == pytest.approx([expected] * 3, rel=1e-6)


def test_graph_replay_ms_times_replays_of_the_captured_call():
    """bench.graph_replay_ms, the CUDA-graph timer of `flexsn-dsl bench` and of the benchmarks: the call runs
    3 times to warm up, once captured (a capture runs nothing), then 1 + rounds * replays replays."""
    counter = torch.zeros((), device="cuda")
    ms = graph_replay_ms(lambda: counter.add_(1), replays=5, rounds=3)
    assert counter.item() == 3 + 1 + 3 * 5 and ms > 0


def test_bench_times_our_rows_from_graph_replays(tmp_path):
    """`flexsn-dsl bench` on CUDA fills the graph column of our rows, in inference and in training."""
    out = tmp_path / "bench.json"
    spec = Path(__file__).resolve().parents[1] / "neurons" / "lif.yaml"
    assert main(["bench", str(spec), "-T", "4", "-n", "4096", "--peers", "--device", "cuda", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())[0]["results"]
    assert sorted((r["mode"], bool(r["graph_ms"])) for r in rows) == [("inference", True), ("training", True)]


NOISY = """
neuron: noisy_graph
inputs: [x]
parameters: {tau: 2.0, sigma: {value: 0.4, learnable: true}}
states: {v: 0.0}
step:
  n: randn()
  h: v + (x - v) / tau + sigma * n
  s: spike(h - 1.0)
  v: h * (1 - s)
outputs: [s, n]
"""


def test_a_captured_noisy_step_draws_fresh_numbers_at_each_replay_and_its_backward_sees_them():
    """As torch's own random ops under capture: each replay draws new numbers (the seed is drawn inside
    the graph), and the captured backward uses the replay's own draws."""
    import flexsn_dsl
    m = flexsn_dsl.loads(NOISY, backend="triton")
    x = torch.rand(16, 4096, device="cuda", requires_grad=True)

    def step():
        m.reset()
        x.grad, m.sigma.grad = None, None
        s, n = m(x)
        (s * 0 + s).sum().backward()
        return n
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        n = step()
    draws, grads = [], []
    for _ in range(2):
        graph.replay()
        draws.append(n.detach().clone())  # (n is an output of the autograd graph the replay ran)
        grads.append(m.sigma.grad.clone())
    assert not torch.equal(draws[0], draws[1]) and abs(draws[0].std().item() - 1) < 0.05
    fed = flexsn_dsl.loads(NOISY.replace("  n: randn()\n", "").replace("inputs: [x]", "inputs: [x, n]")
                           .replace("outputs: [s, n]", "outputs: [s]"), backend="torch").cuda()
    fed(x.detach(), draws[1]).sum().backward()
    torch.testing.assert_close(grads[1], fed.sigma.grad, rtol=1e-4, atol=1e-4)
