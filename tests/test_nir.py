"""NIR import and export (flexsn_dsl.nir) against NIR's equations.

Graphs are built with the ``nir`` package (not by our exporter) and run by ``from_nir``; the
reference is a float64 torch simulation of the node equations written here (Euler steps, and
the closed-form solutions with the input held over a step). Spikes must be identical.
"""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

import flexsn_dsl  # noqa: E402
from flexsn_dsl.nir import NIRError, from_nir  # noqa: E402

DTYPE = torch.float64
BACKENDS = ["torch", "triton"]


@pytest.fixture(autouse=True)
def _float64_modules():
    """from_nir builds its layers in torch's default dtype, as nn.Linear does: float64 here, so that the
    graphs' float64 arrays arrive unrounded."""
    old = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    yield
    torch.set_default_dtype(old)


def _rand(*shape, seed=0, scale=1.0):
    """Random numbers drawn on the CPU (the same values on any machine), on the default device."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=DTYPE, device="cpu") * scale).to(torch.get_default_device())


def _np(*shape, seed=0, low=0.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


# -- the reference: NIR's node equations, stepped by hand ----------------------------------

def _t(a, like):
    return torch.as_tensor(np.asarray(a, dtype=np.float64), dtype=DTYPE, device=like.device)


def _leaky(v, drive, tau, dt, method):
    """One step of tau dv/dt = drive - v with the drive held."""
    if method == "euler":
        return v + dt / tau * (drive - v)
    return drive + (v - drive) * torch.exp(-dt / tau)


def simulate(node, x, dt, method):
    """NIR's equations for one neuron node over x [T, B, ...]: (outputs, v trace)."""
    kind = type(node).__name__
    p = {k: _t(getattr(node, k), x) for k in ("tau", "r", "v_leak", "v_threshold", "v_reset", "tau_syn",
                                               "tau_mem", "w_in") if hasattr(node, k)}
    v = torch.zeros_like(x[0]) + (p["v_leak"] if "v_leak" in p else 0.0)
    i = torch.zeros_like(x[0])
    outs, vs = [], []
    for xt in x:
        if kind in ("LIF", "LI"):
            v = _leaky(v, p["v_leak"] + p["r"] * xt, p["tau"], dt, method)
        elif kind in ("IF", "I"):
            v = v + dt * p["r"] * xt
        else:  # CubaLIF, CubaLI: tau_syn di/dt = -i + w_in x; tau_mem dv/dt = v_leak - v + r i
            inf = p["w_in"] * xt
            ts, tm, r = p["tau_syn"], p["tau_mem"], p["r"]
            if method == "euler":
                v, i = v + dt / tm * (p["v_leak"] - v + r * i), i + dt / ts * (inf - i)
            else:
                k = r * (i - inf) * ts / (ts - tm)
                base = p["v_leak"] + r * inf
                v = base + (v - base - k) * torch.exp(-dt / tm) + k * torch.exp(-dt / ts)
                i = inf + (i - inf) * torch.exp(-dt / ts)
        if "v_threshold" in p:
            s = (v > p["v_threshold"]).to(DTYPE)
            vs.append(v)
            v = torch.where(s > 0, p["v_reset"] + 0 * v, v)
            outs.append(s)
        else:
            vs.append(v)
            outs.append(v)
    return torch.stack(outs), torch.stack(vs)


def _run(graph, x, dt, method="exact", backend="torch"):
    net = from_nir(graph, dt=dt, method=method, backend=backend).to(DTYPE)
    return net, net(x)


N = 5


def _lif(per_neuron=False, v_reset=None):
    def arr(value, spread):
        return value + (_np(N, seed=int(value * 100) + 3, high=spread) if per_neuron else np.zeros(N))
    kwargs = {} if v_reset is None else {"v_reset": np.full(N, v_reset)}
    return nir.LIF(tau=arr(0.02, 0.02), r=arr(1.5, 1.0), v_leak=arr(0.1, 0.2), v_threshold=arr(0.8, 0.4), **kwargs)


def _nodes(per_neuron=False):
    """One node of each neuron kind, N neurons (per-neuron arrays or uniform ones)."""
    def arr(value, spread, seed):
        return value + (_np(N, seed=seed, high=spread) if per_neuron else np.zeros(N))
    return {
        "LIF": _lif(per_neuron),
        "CubaLIF": nir.CubaLIF(tau_syn=arr(0.005, 0.004, 1), tau_mem=arr(0.02, 0.01, 2), r=arr(2.0, 1.0, 3),
                               v_leak=arr(0.0, 0.2, 4), v_threshold=arr(0.5, 0.5, 5), w_in=arr(1.0, 0.5, 6)),
        "IF": nir.IF(r=arr(30.0, 20.0, 7), v_threshold=arr(1.0, 0.5, 8), v_reset=arr(-0.1, 0.1, 9)),
        "LI": nir.LI(tau=arr(0.01, 0.01, 10), r=arr(1.0, 1.0, 11), v_leak=arr(0.2, 0.3, 12)),
        "CubaLI": nir.CubaLI(tau_syn=arr(0.004, 0.002, 13), tau_mem=arr(0.01, 0.01, 14), r=arr(1.0, 1.0, 15),
                             v_leak=arr(0.0, 0.1, 16), w_in=arr(2.0, 1.0, 17)),
        "I": nir.I(r=arr(10.0, 5.0, 18)),
    }


def _check_node(node, method, backend="torch", T=40, dt=1e-3):
    x = _rand(T, 3, N, seed=1, scale=1.5)
    graph = nir.NIRGraph.from_list(node)
    _, out = _run(graph, x, dt, method, backend)
    want, v = simulate(node, x, dt, method)
    if hasattr(node, "v_threshold"):
        assert want.sum() > 0 and (want == 0).sum() > 0  # the inputs make some neurons spike, not all
        assert torch.equal(out, want)
    else:
        torch.testing.assert_close(out, want, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("method", ["exact", "euler"])
@pytest.mark.parametrize("kind", ["LIF", "CubaLIF", "IF", "LI", "CubaLI", "I"])
def test_each_neuron_node_follows_nir_equations(kind, method):
    _check_node(_nodes()[kind], method)


@pytest.mark.parametrize("method", ["exact", "euler"])
@pytest.mark.parametrize("kind", ["LIF", "CubaLIF", "IF", "LI", "CubaLI", "I"])
def test_per_neuron_parameter_arrays(kind, method):
    node = _nodes(per_neuron=True)[kind]
    net = from_nir(nir.NIRGraph.from_list(node), dt=1e-3)
    neuron = next(m for m in net.modules() if isinstance(m, flexsn_dsl.FlexSN))
    assert neuron.spec.shaped  # the arrays differ per neuron: parameters with a shape, not numbers
    _check_node(node, method)


def test_per_neuron_equal_time_constants_are_refused_for_exact():
    """The exact per-neuron CUBA propagator divides by tau_syn - tau_mem: a neuron with the two equal is refused
    (with the way out), not run into NaN."""
    node = nir.CubaLIF(tau_syn=np.array([0.005, 0.01, 0.02]), tau_mem=np.full(3, 0.01), r=np.ones(3),
                       v_leak=np.zeros(3), v_threshold=np.ones(3))
    with pytest.raises(NIRError, match=r"tau_syn equals tau_mem for 1 neuron.*method='rk4'"):
        from_nir(nir.NIRGraph.from_list(node), dt=1e-3)
    x = _rand(10, 2, 3, seed=24)
    out = from_nir(nir.NIRGraph.from_list(node), dt=1e-3, method="rk4", backend="torch").to(DTYPE)(x)
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("backend", BACKENDS)
def test_lif_on_both_backends(backend):
    _check_node(_nodes()["LIF"], "exact", backend, T=8, dt=5e-3)


@pytest.mark.parametrize("v_reset", [None, -0.3])
def test_v_reset_absent_means_zero(v_reset):
    node = _lif(v_reset=v_reset)
    assert np.all(node.v_reset == (0.0 if v_reset is None else v_reset))  # as the nir package fills it in
    x = _rand(60, 2, N, seed=4, scale=2.0)
    _, out = _run(nir.NIRGraph.from_list(node), x, 1e-3, "euler")
    want, v = simulate(node, x, 1e-3, "euler")
    assert torch.equal(out, want)
    # after a spike the membrane restarts from v_reset: the step after a spike shows it
    net = from_nir(nir.NIRGraph.from_list(node), dt=1e-3, method="euler", backend="torch").to(DTYPE)
    lif = net.node("lif")
    lif.store_state_seqs = True
    net(x)
    spiked = want[:-1] > 0
    expected = _leaky(torch.full_like(x[1:][spiked], 0.0) + (v_reset or 0.0),
                      _t(node.v_leak, x).expand_as(x[1:])[spiked] + _t(node.r, x).expand_as(x[1:])[spiked]
                      * x[1:][spiked], _t(node.tau, x).expand_as(x[1:])[spiked], 1e-3, "euler")
    torch.testing.assert_close(lif.state_seqs["v"][1:][spiked], expected)


def test_affine_with_bias_then_lif():
    w, b = _np(N, 3, seed=5, low=-1, high=1), _np(N, seed=6, low=0, high=0.5)
    lif = _lif()
    graph = nir.NIRGraph.from_list(nir.Affine(weight=w, bias=b), lif)
    x = _rand(30, 4, 3, seed=7, scale=2.0)
    _, out = _run(graph, x, 1e-3)
    want, _ = simulate(lif, x @ _t(w, x).T + _t(b, x), 1e-3, "exact")
    assert want.sum() > 0
    assert torch.equal(out, want)


def test_conv2d_graph():
    """Conv2d (stride, padding) -> per-pixel LIF -> SumPool2d -> Flatten -> Linear -> CubaLIF."""
    C, H, W = 2, 6, 6
    conv_w, conv_b = _np(3, C, 3, 3, seed=8, low=-0.5, high=1.0), _np(3, seed=9, low=0, high=0.2)
    shape = (3, 6, 6)
    lif = nir.LIF(tau=np.full(shape, 0.01), r=np.full(shape, 1.0), v_leak=np.zeros(shape),
                  v_threshold=np.full(shape, 0.7))
    pool = nir.SumPool2d(kernel_size=np.array([2, 2]), stride=np.array([2, 2]), padding=np.array([0, 0]))
    lin_w = _np(4, 27, seed=11, low=-0.5, high=1.0)
    cuba = nir.CubaLIF(tau_syn=np.full(4, 0.005), tau_mem=np.full(4, 0.01), r=np.full(4, 1.0),
                       v_leak=np.zeros(4), v_threshold=np.full(4, 0.3))
    graph = nir.NIRGraph(nodes={
        "in": nir.Input(input_type=np.array([C, H, W])),
        "conv": nir.Conv2d(input_shape=(H, W), weight=conv_w, stride=1, padding=1, dilation=1, groups=1,
                           bias=conv_b),
        "lif": lif, "pool": pool, "flat": nir.Flatten(input_type=np.array([3, 3, 3]), start_dim=0),
        "lin": nir.Linear(weight=lin_w), "cuba": cuba, "out": nir.Output(output_type=np.array([4])),
    }, edges=[("in", "conv"), ("conv", "lif"), ("lif", "pool"), ("pool", "flat"), ("flat", "lin"), ("lin", "cuba"),
              ("cuba", "out")])
    T, B = 12, 2
    x = _rand(T, B, C, H, W, seed=12, scale=1.0)
    _, out = _run(graph, x, 1e-3, "exact")
    y = torch.nn.functional.conv2d(x.flatten(0, 1), _t(conv_w, x), _t(conv_b, x), padding=1).unflatten(0, (T, B))
    s1, _ = simulate(lif, y, 1e-3, "exact")
    pooled = s1.reshape(T, B, 3, 3, 2, 3, 2).sum(dim=(4, 6))
    want, _ = simulate(cuba, pooled.flatten(2) @ _t(lin_w, x).T, 1e-3, "exact")
    assert s1.sum() > 0 and want.sum() > 0
    assert torch.equal(out, want)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("fused", [True, False])
def test_recurrent_graph(fused, backend):
    """snnTorch's RLeaky pattern: lif -> w_rec -> lif; the recurrent edge carries the last step's spikes.
    A Linear on the loop runs inside the neuron's kernel (its rec_weight); an Affine (here with zero bias)
    is not folded, and the cycle runs step by step."""
    lif = _lif()
    w_rec = _np(N, N, seed=13, low=-0.5, high=0.5)
    loop = nir.Linear(weight=w_rec) if fused else nir.Affine(weight=w_rec, bias=np.zeros(N))
    graph = nir.NIRGraph(nodes={"input": nir.Input(input_type=np.array([N])), "lif": lif,
                                "w_rec": loop, "output": nir.Output(output_type=np.array([N]))},
                         edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")])
    x = _rand(25, 2, N, seed=14, scale=2.0)
    net, out = _run(graph, x, 1e-3, "euler", backend)
    assert (net.folded == {"lif": "w_rec"}) == fused
    assert bool(net.node("lif").spec.recurrent) == fused
    # the reference: one LIF step at a time, fed x_t + W s_{t-1}
    spikes = []
    p = {k: _t(getattr(lif, k), x) for k in ("tau", "r", "v_leak", "v_threshold", "v_reset")}
    v, s = p["v_leak"] + torch.zeros_like(x[0]), torch.zeros_like(x[0])
    for t in range(x.shape[0]):
        v = _leaky(v, p["v_leak"] + p["r"] * (x[t] + s @ _t(w_rec, x).T), p["tau"], 1e-3, "euler")
        s = (v > p["v_threshold"]).to(DTYPE)
        v = torch.where(s > 0, p["v_reset"] + 0 * v, v)
        spikes.append(s)
    want = torch.stack(spikes)
    assert want.sum() > 0
    assert torch.equal(out, want)
    net.reset()
    assert torch.equal(net(x), want)  # reset() forgets the neurons' states and the recurrent edge
    exported = to_nir(net, x)  # the loop comes back as it was written
    assert {("lif", "w_rec"), ("w_rec", "lif")} <= set(exported.edges)
    assert type(exported.nodes["w_rec"]) is type(loop) and np.array_equal(exported.nodes["w_rec"].weight, w_rec)


@pytest.mark.parametrize("rec_first", [False, True])
def test_a_recurrent_edge_gives_its_bias_at_the_first_step(rec_first):
    """NIR's equations (and snnTorch) apply the recurrent Affine to the zero starting spikes: its bias reaches the
    neuron at the first step, whichever node of the cycle the graph lists first (w_rec first once raised)."""
    lif = _lif()
    w_rec, b_rec = _np(N, N, seed=44, low=-0.5, high=0.5), _np(N, seed=45, low=0.3, high=0.8)
    nodes = {"input": nir.Input(input_type=np.array([N])), "lif": lif, "w_rec": nir.Affine(weight=w_rec, bias=b_rec),
             "output": nir.Output(output_type=np.array([N]))}
    if rec_first:
        nodes = {k: nodes[k] for k in ("input", "w_rec", "lif", "output")}
    graph = nir.NIRGraph(nodes=nodes, edges=[("input", "lif"), ("lif", "w_rec"), ("w_rec", "lif"), ("lif", "output")])
    x = _rand(20, 2, N, seed=46, scale=1.0)
    p = {k: _t(getattr(lif, k), x) for k in ("tau", "r", "v_leak", "v_threshold", "v_reset")}

    def loop(first_bias):
        v, s, spikes = p["v_leak"] + torch.zeros_like(x[0]), torch.zeros_like(x[0]), []
        for t in range(x.shape[0]):
            rec = s @ _t(w_rec, x).T + (_t(b_rec, x) if t or first_bias else 0.0)
            v = _leaky(v, p["v_leak"] + p["r"] * (x[t] + rec), p["tau"], 1e-3, "euler")
            s = (v > p["v_threshold"]).to(DTYPE)
            v = torch.where(s > 0, p["v_reset"] + 0 * v, v)
            spikes.append(s)
        return torch.stack(spikes)
    want = loop(first_bias=True)
    net, out = _run(graph, x, 1e-3, "euler")
    assert not torch.equal(want, loop(first_bias=False))  # the first step's bias shows in the spikes
    assert torch.equal(out, want)
    net.reset()
    assert torch.equal(net(x), want)


def _delayed(x, steps):
    """x [T, B, N] with feature j delayed by steps[j] steps (zeros before the first step)."""
    return torch.stack([torch.cat([torch.zeros_like(x[:k, :, j]), x[:len(x) - k, :, j]])
                        for j, k in enumerate(steps)], dim=-1)


def test_delay_scale_threshold():
    d = np.array([0.0, 1e-3, 2e-3, 3e-3, 1e-3])
    graph = nir.NIRGraph.from_list(nir.Scale(scale=np.arange(1.0, N + 1)), nir.Delay(delay=d),
                                   nir.Threshold(threshold=np.full(N, 2.5)))
    x = _rand(7, 2, N, seed=15, scale=2.0)
    net, out = _run(graph, x, 1e-3)
    scaled = x * torch.arange(1.0, N + 1, dtype=DTYPE, device=x.device)
    assert torch.equal(out, (_delayed(scaled, [0, 1, 2, 3, 1]) > 2.5).to(DTYPE))
    # the next call continues the delay line
    out2 = net(x)
    assert torch.equal(out2[0, :, 3], (scaled[-3, :, 3] > 2.5).to(DTYPE))


def test_delay_reads_nothing_back_from_the_device():
    """A Delay's call works on meta tensors (no data: int(steps.max()) or any other read of a value
    raises there), so it does no host sync on a GPU; its output has the reference's shape."""
    delay = from_nir(nir.NIRGraph.from_list(nir.Delay(delay=np.array([0.0, 2.0, 1.0]))), dt=1.0).to("meta")
    x = torch.zeros(5, 2, 3, device="meta")
    assert delay(x).shape == x.shape and delay(x).shape == x.shape  # a second call continues the line


def test_delay_load_state_dict_rereads_the_delays():
    """Delays loaded with load_state_dict (a longer one than the module was built with) take effect,
    against the reference delay line."""
    def graph(steps):
        return nir.NIRGraph.from_list(nir.Delay(delay=np.array(steps, dtype=np.float64) * 1e-3))
    net = from_nir(graph([0, 1, 0, 1, 0]), dt=1e-3).to(DTYPE)
    x = _rand(9, 2, N, seed=33)
    net(x)  # a delay line of one step, carried: dropped when the loaded delays are longer
    net.load_state_dict(from_nir(graph([4, 0, 2, 3, 1]), dt=1e-3).state_dict())
    assert torch.equal(net(x), _delayed(x, [4, 0, 2, 3, 1]))


def test_export_leaves_the_carried_state_as_it_was():
    """to_nir runs the network once for the shapes; the neurons' states, the delay line and the cycle's last
    outputs are put back, so the next call continues as that of a twin that was not exported does."""
    w_rec = _np(N, N, seed=40, low=-0.5, high=0.5)
    graph = nir.NIRGraph(nodes={"input": nir.Input(input_type=np.array([N])),
                                "delay": nir.Delay(delay=np.array([0.0, 1e-3, 2e-3, 3e-3, 1e-3])), "lif": _lif(),
                                "w_rec": nir.Affine(weight=w_rec, bias=np.zeros(N)),
                                "output": nir.Output(output_type=np.array([N]))},
                         edges=[("input", "delay"), ("delay", "lif"), ("lif", "w_rec"), ("w_rec", "lif"),
                                ("lif", "output")])
    net, twin, fresh = (from_nir(graph, dt=1e-3, method="euler").to(DTYPE) for _ in range(3))
    x = _rand(8, 2, N, seed=41, scale=2.0)
    assert torch.equal(net(x), twin(x))
    to_nir(net, _rand(8, 2, N, seed=42, scale=2.0), dt=1e-3)
    want = twin(x)
    assert not torch.equal(want, fresh(x))  # the carried state matters to this call
    assert torch.equal(net(x), want)


def test_file_round_trip(tmp_path):
    node = _lif()
    path = tmp_path / "lif.nir"
    nir.write(path, nir.NIRGraph.from_list(nir.Affine(weight=_np(N, 3, seed=16), bias=_np(N, seed=17)), node))
    x = _rand(20, 2, 3, seed=18, scale=2.0)
    a = from_nir(path, dt=1e-3).to(DTYPE)(x)
    b = from_nir(nir.read(path), dt=1e-3).to(DTYPE)(x)
    assert a.sum() > 0 and torch.equal(a, b)


def test_errors_name_the_node():
    class Odd:  # a node kind from_nir does not know
        pass
    graph = nir.NIRGraph.from_list(_lif())
    graph.nodes["weird node"] = Odd()
    with pytest.raises(NIRError, match="'weird node' is a Odd"):
        from_nir(graph, dt=1e-3)
    with pytest.raises(NIRError, match="whole multiples of dt"):
        from_nir(nir.NIRGraph.from_list(nir.Delay(delay=np.array([1.5e-3]))), dt=1e-3)
    with pytest.raises(ValueError, match="method must be one of"):
        from_nir(nir.NIRGraph.from_list(_lif()), dt=1e-3, method="midpoint")
    with pytest.raises(ValueError, match="dt must be a positive number"):
        from_nir(nir.NIRGraph.from_list(_lif()), dt=0.0)


def test_node_names_never_reach_code():
    """A hostile node name is a dictionary key only: the modules live under fixed keys."""
    name = "x'); import os; os.system('echo pwned') #\n"
    graph = nir.NIRGraph(nodes={"input": nir.Input(input_type=np.array([N])), name: _lif(),
                                "output": nir.Output(output_type=np.array([N]))},
                         edges=[("input", name), (name, "output")])
    net = from_nir(graph, dt=1e-3)
    assert list(net.nodes) == ["node1"] and net.names[name] == "node1"
    assert "pwned" not in net.node(name).spec.text


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # snnTorch calls nirtorch's deprecated extract_nir_graph
def test_a_graph_exported_by_snntorch():
    """snnTorch exports Leaky (v <- beta v + x) as an LIF with dt = 1e-4, tau = dt / (1 - beta), r = tau / dt:
    an Euler step of that LIF at dt = 1e-4 is snnTorch's step. Imported with method="euler" the graph runs as
    its nodes say; it agrees with snnTorch itself until a neuron first spikes (snnTorch then subtracts the
    threshold, one step late, where the LIF node resets to v_reset)."""
    snn = pytest.importorskip("snntorch")
    from snntorch.export_nir import export_to_nir
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(3, N), snn.Leaky(beta=torch.full((N,), 0.9),
                                                                   threshold=torch.ones(N), init_hidden=True,
                                                                   output=True))
        graph = export_to_nir(net, torch.randn(1, 3), ignore_dims=[0])
        x = torch.rand(30, 2, 3, generator=torch.Generator().manual_seed(19)) * 0.6
        net[1].reset_hidden()
        theirs_v, theirs_s = [], []
        with torch.no_grad():
            for xt in x:
                s, v = net(xt)
                theirs_s.append(s)
                theirs_v.append(v.clone())
    theirs_s, theirs_v = torch.stack(theirs_s), torch.stack(theirs_v)
    ours = from_nir(graph, dt=1e-4, method="euler", backend="torch").to(DTYPE)
    lif = ours.node("1")
    lif.store_state_seqs = True
    x = x.to(DTYPE).to(torch.get_default_device())
    out = ours(x)
    affine, node = graph.nodes["0"], graph.nodes["1"]
    want, v = simulate(node, x @ _t(affine.weight, x).T + _t(affine.bias, x), 1e-4, "euler")
    assert torch.equal(out, want)  # the node's equations
    first = (want.cumsum(0) == 0) | ((want.cumsum(0) == 1) & (want == 1))  # up to and including the first spike
    assert want.sum() > 0 and (~first).sum() > 0
    assert torch.equal(out[first].cpu(), theirs_s.to(DTYPE)[first.cpu()])
    before = (want.cumsum(0) == 0).cpu()  # the membrane before the first spike (then ours is reset, theirs not yet)
    torch.testing.assert_close(lif.state_seqs["v"].cpu()[before], theirs_v.to(DTYPE)[before], rtol=1e-4, atol=1e-5)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")
def test_snntorch_with_zero_reset_and_no_delay_spikes_as_the_import():
    """docs/nir.md's setting: snnTorch's Leaky(reset_mechanism="zero", reset_delay=False) resets to 0 in the step
    that spikes, as the exported LIF node says: imported with method="euler", spike for spike the same."""
    snn = pytest.importorskip("snntorch")
    from snntorch.export_nir import export_to_nir
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(3, N), snn.Leaky(beta=torch.full((N,), 0.9), threshold=torch.ones(N),
                                                                   init_hidden=True, output=True,
                                                                   reset_mechanism="zero", reset_delay=False))
        graph = export_to_nir(net, torch.randn(1, 3), ignore_dims=[0])
        x = torch.rand(60, 2, 3, generator=torch.Generator().manual_seed(19)) * 0.6
        net[1].reset_hidden()
        with torch.no_grad():
            theirs = torch.stack([net(xt)[0] for xt in x])
    ours = from_nir(graph, dt=1e-4, method="euler", backend="torch").to(DTYPE)
    out = ours(x.to(DTYPE).to(torch.get_default_device())).cpu()
    assert theirs.sum() > 10 and torch.equal(out, theirs.to(DTYPE))


def test_nir_is_imported_only_when_used(monkeypatch):
    import subprocess
    import sys
    code = "import sys, flexsn_dsl; assert 'nir' not in sys.modules and 'flexsn_dsl.nir' not in sys.modules; " \
           "flexsn_dsl.from_nir; assert 'flexsn_dsl.nir' in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)
    monkeypatch.setitem(sys.modules, "nir", None)  # as if it were not installed
    with pytest.raises(flexsn_dsl.MissingDependency, match=r"pip install flexsn-dsl\[nir\]"):
        from_nir("graph.nir", dt=1e-3)


# -- export -----------------------------------------------------------------------------------

from flexsn_dsl.nir import match_neuron, to_nir  # noqa: E402


def _zoo(name, **kwargs):
    return flexsn_dsl.load(f"neurons/{name}.yaml", backend="torch", **kwargs)


@pytest.mark.parametrize("name, dt, kind, want", [
    # lif_ct: tau dv/dt = v_rest - v + R I, tau = 2, R = 1, v_rest = 0, v_th = 1, v_reset = 0
    ("lif_ct", None, "LIF", {"tau": 2.0, "r": 1.0, "v_leak": 0.0, "v_threshold": 1.0, "v_reset": 0.0}),
    # cuba_lif_ct: tau_syn = 1, tau_mem = 2, R = 2 (docs of the spec)
    ("cuba_lif_ct", None, "CubaLIF", {"tau_syn": 1.0, "tau_mem": 2.0, "r": 2.0, "w_in": 1.0, "v_leak": 0.0,
                                      "v_threshold": 1.0, "v_reset": 0.0}),
    # lif (step): v + (x - v)/2 is an Euler step of length dt of dt dv/dt ... with tau = 2 dt, r = 1
    ("lif", 0.25, "LIF", {"tau": 0.5, "r": 1.0, "v_leak": 0.0, "v_threshold": 1.0, "v_reset": 0.0}),
    # if (step): v + x is an Euler step of dv/dt = x / dt
    ("if", 0.5, "IF", {"r": 2.0, "v_threshold": 1.0, "v_reset": 0.0}),
])
def test_specs_are_recognised_symbolically(name, dt, kind, want):
    found, values, convention = match_neuron(_zoo(name), dt)
    assert found.kind == kind
    assert {k: float(v) for k, v in values.items()} == pytest.approx(want, rel=1e-12, abs=1e-15)
    assert ("Euler" in convention) == (dt is not None)


@pytest.mark.parametrize("name, dt, message", [
    ("lif_soft", 1.0, r"closest is LIF, but the reset v: v - 1\.0; NIR LIF resets v to a constant"),
    ("adex_ct", None, r"closest is CubaLIF, but dv/dt has the term .*exp"),
    ("lif_refractory", None, "refractory period, which no NIR neuron has"),
    ("lif", None, r"discrete-time \(`step`\) spec.*to_nir\(\.\.\., dt=\.\.\.\)"),
    ("leaky", 1.0, r"leaky gives 2 outputs \['spk', 'mem'\]; NIR neurons give one"),
])
def test_specs_without_a_nir_node_are_refused(name, dt, message):
    with pytest.raises(NIRError, match=message):
        match_neuron(_zoo(name), dt)


class _Lambda(torch.nn.Module):
    """A module whose forward is ``fn(self, x)``; ``layers`` are its children."""

    def __init__(self, fn, *layers):
        super().__init__()
        self.fn, self.layers = fn, torch.nn.ModuleList(layers)

    def forward(self, x):
        return self.fn(self, x)


@pytest.mark.parametrize("make, shapes, message", [
    (lambda: torch.nn.ReLU(), [(N,)],
     r"^call_module '0': ReLU has no NIR node \(to_nir exports Linear, Conv1d, Conv2d, AvgPool2d, flatten/reshape, "
     r"addition and flexsn-dsl neurons\)$"),
    (lambda: flexsn_dsl.PerStep(torch.nn.Conv1d(3, 3, 1, padding_mode="reflect")), [(3, 4)],
     r"^call_module '0': padding_mode='reflect'; NIR convolutions pad with zeros$"),
    (lambda: flexsn_dsl.PerStep(torch.nn.AvgPool2d(2, ceil_mode=True)), [(1, 4, 4)],
     r"^call_module '0': AvgPool2d\(.*\) has options NIR's pooling nodes do not \(ceil_mode, count_include_pad=False, "
     r"a divisor other than 1\)$"),
    (lambda: _Lambda(lambda self, x: x * 2), [(N,)], r"^call_function <built-in function mul>: this operation has no NIR "
     r"node$"),
    (lambda: _Lambda(lambda self, x: (x, x)), [(N,)], r"^the module must return one tensor$"),
    (lambda: _Lambda(lambda self, x: x + 1.0), [(N,)], r"^call_function <built-in function add>: only the sum of two "
     r"layers' outputs is exported \(a sum is two edges into the next node\)$"),
    (lambda: _Lambda(lambda self, x: x.transpose(1, 2)), [(N,)], r"^call_method transpose: this operation has no NIR "
     r"node$"),
    (lambda: _Lambda(lambda self, x: x.reshape(2, 2, 3, 2).flatten(2, 3).reshape(2, 2, 2, 3)), [(3, 2)],
     r"^call_method reshape: reshapes one sample from \[6\] to \[2, 3\], which is not a flatten$"),
    (lambda: _Lambda(lambda self, x: self.layers[0](x, x), torch.nn.Bilinear(N, N, N)), [(N,)],
     r"^call_module 'layers.0' takes 2 tensors; NIR nodes take one$"),
])
def test_export_errors_name_the_operation(make, shapes, message):
    """to_nir refuses what has no NIR node, naming the fx operation (or layer) and what it would take."""
    with torch.device("cpu"):  # the module and its inputs on one device, whatever the default
        module = make().to(DTYPE)
        xs = [_rand(2, 2, *shape, seed=43) for shape in shapes]
    with pytest.raises(NIRError, match=message):
        to_nir(module, *xs)


def test_export_of_a_delay_needs_dt():
    net = from_nir(nir.NIRGraph.from_list(nir.Delay(delay=np.array([1.0, 2.0]))), dt=1.0)
    with pytest.raises(NIRError, match=r"^node 'delay': a Delay counts steps; give to_nir\(..., dt=...\) to write"):
        to_nir(net, torch.zeros(3, 1, 2))


class _Net(torch.nn.Module):
    """Conv2d over every step (time folded into the batch) -> LIF -> sum pooling -> Linear -> CUBA LIF."""

    def __init__(self, backend):
        super().__init__()
        self.conv = torch.nn.Conv2d(2, 3, 3, padding=1)
        self.lif = flexsn_dsl.load("neurons/lif_ct.yaml", backend=backend)
        self.pool = torch.nn.AvgPool2d(2, divisor_override=1)
        self.fc = torch.nn.Linear(12, 4)
        self.cuba = flexsn_dsl.load("neurons/cuba_lif_ct.yaml", backend=backend)

    def forward(self, x):
        T, B = x.shape[:2]
        s = self.lif(self.conv(x.flatten(0, 1)).unflatten(0, (T, B)))
        p = self.pool(s.flatten(0, 1)).flatten(1)
        return self.cuba(self.fc(p).unflatten(0, (T, B)))


@pytest.mark.parametrize("backend", BACKENDS)
def test_round_trip_through_a_file(backend, tmp_path):
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = _Net(backend).to(DTYPE)
        with torch.no_grad():  # weights that make both layers spike, some neurons not always
            net.conv.weight.uniform_(-0.1, 0.4)
            net.fc.weight.uniform_(-0.3, 0.3)
    net = net.to(torch.get_default_device())
    x = _rand(6, 2, 2, 4, 4, seed=20, scale=3.0)
    graph = to_nir(net, x)
    assert [type(n).__name__ for n in graph.nodes.values()] == ["Input", "Conv2d", "LIF", "SumPool2d", "Flatten",
                                                                "Affine", "CubaLIF", "Output"]
    nir.write(tmp_path / "net.nir", graph)
    back = from_nir(tmp_path / "net.nir", dt=1.0, backend=backend).to(DTYPE)
    want = net(x)
    assert want.sum() > 0 and (want == 0).sum() > 0
    assert torch.equal(back(x), want)


def test_per_step_layers_export_as_their_nodes(tmp_path):
    """flexsn_dsl.PerStep of one layer is that layer's node; of several layers, a node each (fx traces into it)."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        conv, pool = torch.nn.Conv2d(2, 3, 3, padding=1), torch.nn.AvgPool2d(2, divisor_override=1)
        with torch.no_grad():
            conv.weight.uniform_(-0.2, 0.2)  # some neurons spike, some never
        net = torch.nn.Sequential(flexsn_dsl.PerStep(conv, pool), flexsn_dsl.load("neurons/lif_ct.yaml"),
                                  flexsn_dsl.PerStep(torch.nn.Conv2d(3, 2, 1))).to(DTYPE)
    net = net.to(torch.get_default_device())
    x = _rand(6, 2, 2, 4, 4, seed=21, scale=3.0)
    graph = to_nir(net, x)
    assert {name: type(n).__name__ for name, n in graph.nodes.items()} == {
        "input": "Input", "0.layer.0": "Conv2d", "0.layer.1": "SumPool2d", "1": "LIF", "2": "Conv2d",
        "output": "Output"}
    nir.write(tmp_path / "net.nir", graph)
    back = from_nir(tmp_path / "net.nir", dt=1.0, backend="torch").to(DTYPE)
    spikes = net[:2](x)
    assert spikes.sum() > 0 and (spikes == 0).sum() > 0
    net[1].reset()
    assert torch.equal(back(x), net(x))


def test_per_step_flatten_and_dropout_export_as_bare_ones_do():
    """PerStep(nn.Flatten()) is NIR's Flatten and PerStep(nn.Dropout()) passes through (in eval mode), as
    without PerStep; the graph read back runs as the network."""
    torch.manual_seed(1)
    with torch.device("cpu"):
        fc = torch.nn.Linear(2 * 4 * 4, 3)
        net = torch.nn.Sequential(flexsn_dsl.PerStep(torch.nn.Dropout(0.5)), flexsn_dsl.load("neurons/lif_ct.yaml"),
                                  flexsn_dsl.PerStep(torch.nn.Flatten()), flexsn_dsl.PerStep(fc)).to(DTYPE).eval()
    net = net.to(torch.get_default_device())
    x = _rand(5, 2, 2, 4, 4, seed=22, scale=3.0)
    graph = to_nir(net, x)
    assert [type(n).__name__ for n in graph.nodes.values()] == ["Input", "LIF", "Flatten", "Affine", "Output"]
    back = from_nir(graph, dt=1.0, backend="torch").to(DTYPE)
    want = net(x)
    assert net[1](x).sum() > 0 and want.abs().sum() > 0
    net[1].reset()
    assert torch.equal(back(x), net(x))


def test_cli_nir_honours_plugins(tmp_path, capsys):
    """`flexsn-dsl nir --plugin P export SPEC`: the spec's surrogate comes from the plugin."""
    from flexsn_dsl.cli import main
    plugin = tmp_path / "tri.py"
    plugin.write_text("import flexsn_dsl\n\n\n@flexsn_dsl.hookimpl\ndef flexsn_dsl_register_surrogates(registry):\n"
                      "    registry.register('nir_tri', gradient='Max(0, 1 - Abs(x))')\n")
    spec = tmp_path / "tri.yaml"
    spec.write_text(open("neurons/lif.yaml").read().replace("{name: sigmoid, alpha: 4.0}", "nir_tri"))
    options = ["export", str(spec), "--shape", "3", "--dt", "1", "-o", str(tmp_path / "tri.nir")]
    assert main(["nir", *options]) == 1  # the spec needs the plugin
    assert "nir_tri" in capsys.readouterr().err
    assert main(["nir", "--plugin", str(plugin), *options]) == 0
    assert "is NIR LIF" in capsys.readouterr().out


def test_cli_export_show_import(tmp_path, capsys):
    from flexsn_dsl.cli import main
    path = tmp_path / "cuba.nir"
    assert main(["nir", "export", "neurons/cuba_lif_ct.yaml", "--shape", "3", "-o", str(path)]) == 0
    assert "cuba_lif_ct is NIR CubaLIF" in capsys.readouterr().out
    node = next(n for n in nir.read(path).nodes.values() if isinstance(n, nir.CubaLIF))
    assert node.tau_syn.tolist() == [1.0] * 3 and node.tau_mem.tolist() == [2.0] * 3 and node.r.tolist() == [2.0] * 3
    assert main(["nir", "show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "CubaLIF" in out and "tau_mem=2" in out and "input -> 0, 0 -> output" in out
    assert main(["nir", "import", str(path), "--dt", "0.5", "--steps", "3"]) == 0
    assert "output shape [3, 1, 3]" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["nir", "export", "neurons/lif_soft.yaml", "--shape", "3", "-o", "{tmp}/x.nir", "--dt", "1"],
     "error: lif_soft matches no NIR neuron; the closest is LIF, but the reset v: v - 1.0"),
    (["nir", "show", "{tmp}/missing.nir"], "missing.nir': cannot read it (No such file or directory)"),
    (["nir", "show", "{tmp}/garbage.nir"], "garbage.nir' is not an HDF5 file h5py can read (OSError: "),
])
def test_cli_errors_are_one_line(argv, message, tmp_path, capsys):
    from flexsn_dsl.cli import main
    (tmp_path / "garbage.nir").write_text("not a NIR file")
    assert main([a.replace("{tmp}", str(tmp_path)) for a in argv]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err


def test_an_imported_network_exports_again_after_training(tmp_path):
    """from_nir -> a training step (the Affine weights change) -> to_nir: the graph holds the trained weights
    and the same neurons, and runs as the trained module does."""
    lif = _lif()
    graph = nir.NIRGraph.from_list(nir.Affine(weight=_np(N, 3, seed=21), bias=_np(N, seed=22)), lif)
    net = from_nir(graph, dt=1e-3, backend="torch").to(DTYPE)
    x = _rand(20, 2, 3, seed=23, scale=2.0)
    net.reset()
    ((net(x).mean() - 0.5) ** 2).backward()  # surrogate gradients reach the Affine layer
    before = net.node("affine").weight.detach().clone()
    with torch.no_grad():
        for p in net.parameters():
            p -= 0.5 * p.grad
    assert not torch.equal(net.node("affine").weight, before)
    net.reset()
    exported = to_nir(net, x)
    assert isinstance(exported.nodes["lif"], nir.LIF) and np.allclose(exported.nodes["lif"].tau, lif.tau)
    assert np.array_equal(exported.nodes["affine"].weight, net.node("affine").weight.detach().cpu().numpy())
    nir.write(tmp_path / "trained.nir", exported)
    again = from_nir(tmp_path / "trained.nir", dt=1e-3, backend="torch").to(DTYPE)
    want = net(x)
    assert want.sum() > 0 and torch.equal(again(x), want)


RLIF_SCALED = """
neuron: rlif_scaled
parameters: {tau: 2.0, v_th: 1.0}
states: {v: 0.0}
recurrent:
  r: {from: s}
step:
  h: v + (x + 2 * r - v) / tau
  s: spike(h - v_th)
  v: h * (1 - s)
"""


def test_a_recurrent_spec_exports_as_an_edge_back_and_runs_the_same(tmp_path):
    """rlif (r = r_weight s[t-1] added to x) -> LIF plus a Linear node on an edge back to it; imported
    with method="euler" at the same dt, the cycle runs step by step to the same spikes."""
    torch.manual_seed(0)
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(3, N), _zoo("rlif", sizes={"N": N})).to(DTYPE)
    net = net.to(torch.get_default_device())
    x = _rand(12, 2, 3, seed=25, scale=3.0)
    graph = to_nir(net, x, dt=1.0)
    assert sorted(graph.edges) == sorted([("input", "0"), ("0", "1"), ("1", "1.r_weight"), ("1.r_weight", "1"),
                                          ("1", "output")])
    assert np.array_equal(graph.nodes["1.r_weight"].weight, net[1].r_weight.detach().cpu().numpy())
    nir.write(tmp_path / "rec.nir", graph)
    back = from_nir(tmp_path / "rec.nir", dt=1.0, method="euler", backend="torch").to(DTYPE)
    want = net(x)
    assert want.sum() > 0
    assert torch.equal(back(x), want)


def test_a_recurrent_input_that_is_not_added_is_refused():
    m = flexsn_dsl.loads(RLIF_SCALED, sizes={"N": N}, backend="torch")
    with pytest.raises(NIRError, match="recurrent input 'r' is not added to its input 'x'"):
        match_neuron(m, dt=1.0)


def test_per_neuron_parameters_round_trip(tmp_path):
    """lif_hetero (a step spec, one learnable tau per neuron) -> to_nir at dt = 1 (an LIF with one tau per
    neuron, tau_nir = dt / (1 - exp(-dt / tau))) -> file -> from_nir with Euler steps: the same spikes. The weights
    are set, not drawn from the global generator (which depends on the tests run before), so that every neuron
    spikes, each at its own rate."""
    with torch.device("cpu"):
        net = torch.nn.Sequential(torch.nn.Linear(3, N), _zoo("lif_hetero", params={
            "tau": torch.tensor([1.5, 2.0, 3.0, 5.0, 8.0], dtype=DTYPE)})).to(DTYPE)
        with torch.no_grad():
            net[0].weight.copy_(0.3 + 0.3 * torch.rand(N, 3, generator=torch.Generator().manual_seed(27)))
            net[0].bias.zero_()
    net = net.to(torch.get_default_device())
    x = _rand(15, 2, 3, seed=26, scale=3.0)
    graph = to_nir(net, x, dt=1.0)
    tau = np.array([1.5, 2.0, 3.0, 5.0, 8.0])
    np.testing.assert_allclose(graph.nodes["1"].tau, 1.0 / (1.0 - np.exp(-1.0 / tau)), rtol=1e-12)
    nir.write(tmp_path / "hetero.nir", graph)
    back = from_nir(tmp_path / "hetero.nir", dt=1.0, method="euler", backend="torch")
    assert back.node("1").spec.shaped == ["tau"]
    want = net(x)
    assert (want.sum((0, 1)) > 0).all() and (want == 0).sum() > 0
    assert torch.equal(back(x), want)
