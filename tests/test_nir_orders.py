"""NIR round three (issue 43): the order of a CubaLIF/CubaLI step (NIR's reference, or snnTorch's and
Norse's: the current first), and the NIR paper's graphs (Pedersen et al. 2024: an LIF network, a
Sinabs-style CNN, the Braille CubaLIF RNN with and without a bias on its recurrent edge), built here
with seeded weights and run against NIR's equations stepped by hand in each order, and against
snnTorch's (and Norse's) own modules. Spikes must be identical."""
from __future__ import annotations

import numpy as np
import pytest
import torch

nir = pytest.importorskip("nir")

from flexsn_dsl.nir import NIRError, from_nir, to_nir  # noqa: E402

DTYPE = torch.float64
ORDERS = ["nir", "current_first"]


@pytest.fixture(autouse=True)
def _float64_modules():
    old = torch.get_default_dtype()
    torch.set_default_dtype(DTYPE)
    yield
    torch.set_default_dtype(old)


@pytest.fixture
def on_cpu():
    """The peers' modules (and so ours, compared with them) on the CPU, wherever the default device is."""
    with torch.device("cpu"):
        yield


def _rand(*shape, seed, scale=1.0):
    """Random numbers drawn on the CPU (the same values on any machine), on the default device."""
    g = torch.Generator().manual_seed(seed)
    return (torch.rand(*shape, generator=g, dtype=DTYPE, device="cpu") * scale).to(torch.get_default_device())


def _np(*shape, seed, low=0.0, high=1.0):
    return np.random.default_rng(seed).uniform(low, high, size=shape)


class Reference:
    """One NIR neuron node stepped by hand, as NIR's equations say, in ``order``."""

    def __init__(self, node, dt, method, order="nir"):
        self.kind, self.dt, self.method, self.order = type(node).__name__, dt, method, order
        self.p = {k: torch.as_tensor(np.asarray(getattr(node, k), dtype=np.float64)) for k in
                  ("tau", "r", "v_leak", "v_threshold", "v_reset", "tau_syn", "tau_mem", "w_in") if hasattr(node, k)}
        self.v = self.i = None

    def _leak(self, v, drive, tau):  # tau dv/dt = drive - v, the drive held over the step
        if self.method == "euler":
            return v + self.dt / tau * (drive - v)
        return drive + (v - drive) * torch.exp(-self.dt / tau)

    def step(self, x):
        p, dt = self.p, self.dt
        if self.v is None:
            self.v = torch.zeros_like(x) + p.get("v_leak", 0.0)
            self.i = torch.zeros_like(x)
        if self.kind == "LIF":
            self.v = self._leak(self.v, p["v_leak"] + p["r"] * x, p["tau"])
        elif self.kind == "IF":
            self.v = self.v + dt * p["r"] * x
        elif self.order == "current_first":  # the current takes the input, the voltage the new current
            self.i = self._leak(self.i, p["w_in"] * x, p["tau_syn"])
            self.v = self._leak(self.v, p["v_leak"] + p["r"] * self.i, p["tau_mem"])
        else:  # NIR's: both from the values at the start of the step, as one linear system
            ts, tm, r, inf = p["tau_syn"], p["tau_mem"], p["r"], p["w_in"] * x
            if self.method == "euler":
                self.v, self.i = self.v + dt / tm * (p["v_leak"] - self.v + r * self.i), self.i + dt / ts * (inf - self.i)
            else:
                k = r * (self.i - inf) * ts / (ts - tm)
                base = p["v_leak"] + r * inf
                self.v = base + (self.v - base - k) * torch.exp(-dt / tm) + k * torch.exp(-dt / ts)
                self.i = inf + (self.i - inf) * torch.exp(-dt / ts)
        if "v_threshold" not in p:
            return self.v
        s = (self.v > p["v_threshold"]).to(DTYPE)
        self.v = torch.where(s > 0, p["v_reset"] + 0 * self.v, self.v)
        return s


def _t(a):
    return torch.as_tensor(np.asarray(a, dtype=np.float64))


N = 5


def _cuba(kind):
    def arr(value, spread, seed):
        return value + _np(N, seed=seed, high=spread)
    common = dict(tau_syn=arr(0.004, 0.003, 1), tau_mem=arr(0.012, 0.01, 2), r=arr(1.5, 1.0, 3), v_leak=arr(0.0, 0.1, 4),
                  w_in=arr(1.0, 0.5, 6))
    return nir.CubaLIF(v_threshold=arr(0.4, 0.3, 5), **common) if kind == "CubaLIF" else nir.CubaLI(**common)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("method", ["exact", "euler"])
@pytest.mark.parametrize("kind", ["CubaLIF", "CubaLI"])
def test_each_order_follows_its_equations(kind, method, backend):
    """order="nir" (NIR's reference) and order="current_first" (snnTorch, Norse) each give their own hand loop; the
    two differ."""
    node, dt = _cuba(kind), 1e-3
    x = _rand(30, 2, N, seed=7, scale=1.5)
    outs = {}
    for order in ORDERS if backend == "torch" else ["current_first"]:
        ref = Reference(node, dt, method, order)
        want = torch.stack([ref.step(xt) for xt in x])
        outs[order] = from_nir(nir.NIRGraph.from_list(node), dt=dt, method=method, backend=backend, order=order)(x)
        if kind == "CubaLIF":
            assert want.sum() > 0 and (want == 0).sum() > 0
            assert torch.equal(outs[order], want)
        else:
            torch.testing.assert_close(outs[order], want, rtol=1e-10, atol=1e-12)
    if len(outs) == 2:
        assert not torch.equal(outs["nir"], outs["current_first"])


def test_the_order_survives_to_nir_and_a_file(tmp_path):
    """to_nir records a current-first order in the node's metadata ("step_order"); from_nir reads it back when
    no order is given, and an order given explicitly wins."""
    graph = nir.NIRGraph.from_list(nir.Affine(weight=_np(N, 3, seed=8, low=-1), bias=np.zeros(N)), _cuba("CubaLIF"))
    net = from_nir(graph, dt=1e-3, method="euler", order="current_first")
    x = _rand(25, 2, 3, seed=9, scale=3.0)
    want = net(x)
    exported = to_nir(net, x)
    assert exported.nodes["cubalif"].metadata == {"step_order": "current_first"}
    nir.write(tmp_path / "cf.nir", exported)
    assert torch.equal(from_nir(tmp_path / "cf.nir", dt=1e-3, method="euler")(x), want)
    assert not torch.equal(from_nir(tmp_path / "cf.nir", dt=1e-3, method="euler", order="nir")(x), want)
    assert to_nir(from_nir(graph, dt=1e-3, method="euler"), x).nodes["cubalif"].metadata == {}  # NIR's: nothing
    exported.nodes["cubalif"].metadata["step_order"] = "voltage_first"
    with pytest.raises(NIRError, match=r"^node 'cubalif': metadata 'step_order' is 'voltage_first', not one of"):
        from_nir(exported, dt=1e-3, method="euler")
    with pytest.raises(ValueError, match="order='current_first' integrates with method 'exact' or 'euler'"):
        from_nir(graph, dt=1e-3, method="rk4", order="current_first")


# -- the peers -------------------------------------------------------------------------------------

def _synaptic(snn, n, seed):
    """snnTorch's Synaptic with per-neuron decays, resetting to 0 in the step that spikes (as NIR's CubaLIF)."""
    rng = np.random.default_rng(seed)
    return snn.Synaptic(alpha=torch.tensor(rng.uniform(0.5, 0.9, n)), beta=torch.tensor(rng.uniform(0.7, 0.95, n)),
                        threshold=torch.ones(n), reset_mechanism="zero", reset_delay=False)


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # snnTorch calls nirtorch's deprecated extract_nir_graph
def test_a_synaptic_network_exported_by_snntorch_spikes_as_in_snntorch(on_cpu):
    snn = pytest.importorskip("snntorch")
    from snntorch.export_nir import export_to_nir
    torch.manual_seed(0)
    fc, lif = torch.nn.Linear(3, N), _synaptic(snn, N, seed=10)
    net = torch.nn.Sequential(fc, snn.Synaptic(alpha=lif.alpha, beta=lif.beta, threshold=lif.threshold,
                                               init_hidden=True, reset_mechanism="zero", reset_delay=False))
    graph = export_to_nir(net, torch.randn(1, 3), ignore_dims=[0])
    assert isinstance(graph.nodes["1"], nir.CubaLIF)
    x = _rand(60, 2, 3, seed=11, scale=0.8)
    syn = mem = None
    theirs = []
    with torch.no_grad():
        for xt in x:
            s, syn, mem = lif(fc(xt), *(() if syn is None else (syn, mem)))
            theirs.append(s)
    theirs = torch.stack(theirs)
    ours = {order: from_nir(graph, dt=1e-4, method="euler", order=order)(x) for order in ORDERS}
    assert theirs.sum() > 10 and torch.equal(ours["current_first"], theirs)
    assert not torch.equal(ours["nir"], theirs)  # NIR's order is not the network that snnTorch trained


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # Norse calls nirtorch's deprecated load
def test_a_cubalif_graph_spikes_as_norse_runs_it(on_cpu):
    """Norse runs a CubaLIF node (norse.torch.from_nir) as a synapse stepped first, then the membrane, with Euler."""
    norse = pytest.importorskip("norse.torch")
    node = nir.CubaLIF(tau_syn=np.full(N, 5e-3), tau_mem=np.full(N, 1e-2), r=_np(N, seed=12, low=1, high=2),
                       v_leak=np.zeros(N), v_threshold=np.full(N, 0.1), w_in=_np(N, seed=13, low=0.5, high=1.5))
    graph = nir.NIRGraph.from_list(nir.Affine(weight=_np(N, 3, seed=14, low=-1), bias=_np(N, seed=15)), node)
    x = _rand(50, 2, 3, seed=16, scale=2.0)
    theirs, state = [], None
    module = norse.from_nir(graph, dt=1e-3)
    with torch.no_grad():
        for xt in x.float():
            s, state = module(xt, state)
            theirs.append(s)
    theirs = torch.stack(theirs).to(DTYPE)
    ours = from_nir(graph, dt=1e-3, method="euler", order="current_first")(x)
    assert theirs.sum() > 10 and torch.equal(ours, theirs)


# -- the NIR paper's graphs, with seeded weights and inputs ---------------------------------------

def _graph(nodes, edges):
    return nir.NIRGraph(nodes=nodes, edges=edges)


@pytest.mark.parametrize("method", ["exact", "euler"])
def test_paper_lif_network(method):
    """Input 6 -> Affine -> LIF 10 -> Affine -> LIF 3: the order changes nothing without a synaptic current."""
    lifs = [nir.LIF(tau=_np(n, seed=20 + n, low=0.01, high=0.03), r=np.full(n, 1.0), v_leak=np.zeros(n),
                    v_threshold=np.full(n, 0.3), v_reset=np.zeros(n)) for n in (10, 3)]
    w1, b1 = _np(10, 6, seed=24, low=-1), _np(10, seed=25, high=0.3)
    w2, b2 = _np(3, 10, seed=26, low=-0.5, high=3.0), np.zeros(3)
    graph = _graph({"input": nir.Input(np.array([6])), "fc1": nir.Affine(weight=w1, bias=b1), "lif1": lifs[0],
                    "fc2": nir.Affine(weight=w2, bias=b2), "lif2": lifs[1], "output": nir.Output(np.array([3]))},
                   [("input", "fc1"), ("fc1", "lif1"), ("lif1", "fc2"), ("fc2", "lif2"), ("lif2", "output")])
    x = _rand(40, 2, 6, seed=27, scale=2.0)
    r1, r2 = Reference(lifs[0], 1e-3, method), Reference(lifs[1], 1e-3, method)
    want = torch.stack([r2.step(r1.step(xt @ _t(w1).T + _t(b1)) @ _t(w2).T) for xt in x])
    assert want.sum() > 0
    for order in ORDERS:
        assert torch.equal(from_nir(graph, dt=1e-3, method=method, order=order)(x), want)


def test_paper_sinabs_cnn():
    """Sinabs-style: Conv2d -> IF -> SumPool2d -> Conv2d -> IF -> SumPool2d -> Flatten -> Affine -> IF."""
    c1, c2 = _np(4, 2, 3, 3, seed=30, low=-0.3, high=0.6), _np(4, 4, 3, 3, seed=31, low=-0.3, high=0.5)
    fc = _np(3, 16, seed=32, low=-0.2, high=0.6)
    ifs = [nir.IF(r=np.ones(s), v_threshold=np.ones(s), v_reset=np.zeros(s)) for s in ((4, 8, 8), (4, 4, 4), (3,))]
    pool = dict(kernel_size=np.array([2, 2]), stride=np.array([2, 2]), padding=np.array([0, 0]))
    graph = _graph({
        "input": nir.Input(np.array([2, 8, 8])), "conv1": nir.Conv2d((8, 8), c1, 1, 1, 1, 1, np.zeros(4)),
        "if1": ifs[0], "pool1": nir.SumPool2d(**pool), "conv2": nir.Conv2d((4, 4), c2, 1, 1, 1, 1, np.zeros(4)),
        "if2": ifs[1], "pool2": nir.SumPool2d(**pool), "flat": nir.Flatten(np.array([4, 2, 2]), 0, -1),
        "fc": nir.Affine(weight=fc, bias=np.zeros(3)), "if3": ifs[2], "output": nir.Output(np.array([3]))},
        [("input", "conv1"), ("conv1", "if1"), ("if1", "pool1"), ("pool1", "conv2"), ("conv2", "if2"),
         ("if2", "pool2"), ("pool2", "flat"), ("flat", "fc"), ("fc", "if3"), ("if3", "output")])
    x = (_rand(12, 2, 2, 8, 8, seed=33) > 0.6).to(DTYPE)
    refs = [Reference(n, 1.0, "euler") for n in ifs]
    conv = torch.nn.functional.conv2d
    spikes = []
    for xt in x:
        s1 = torch.nn.functional.avg_pool2d(refs[0].step(conv(xt, _t(c1), padding=1)), 2) * 4
        s2 = torch.nn.functional.avg_pool2d(refs[1].step(conv(s1, _t(c2), padding=1)), 2) * 4
        spikes.append(refs[2].step(s2.flatten(1) @ _t(fc).T))
    want = torch.stack(spikes)
    assert want.sum() > 0
    assert torch.equal(from_nir(graph, dt=1.0, method="euler")(x), want)


DT = 1e-4  # snnTorch's export: tau = dt / (1 - decay), an Euler step of dt is its step


def _braille(bias, seed=40, inputs=12, hidden=16, classes=7):
    """The Braille RNN's structure (Input -> fc1 -> lif1 <-> lif1.w_rec, -> fc2 -> lif2), its CubaLIFs written as
    snnTorch exports Synaptic(alpha, beta): tau_syn = dt/(1 - alpha), tau_mem = dt/(1 - beta), r = tau_mem/dt,
    w_in = tau_syn/dt. ``bias``: the recurrent edge an Affine with a bias, else a Linear."""
    rng = np.random.default_rng(seed)

    def cuba(n):
        alpha, beta = rng.uniform(0.6, 0.9, n), rng.uniform(0.8, 0.95, n)
        tau_syn, tau_mem = DT / (1 - alpha), DT / (1 - beta)
        return nir.CubaLIF(tau_syn=tau_syn, tau_mem=tau_mem, r=tau_mem / DT, v_leak=np.zeros(n),
                           v_threshold=np.ones(n), v_reset=np.zeros(n), w_in=tau_syn / DT), alpha, beta
    (lif1, a1, b1), (lif2, a2, b2) = cuba(hidden), cuba(classes)
    w_rec = rng.uniform(-0.3, 0.3, (hidden, hidden))
    rec = nir.Affine(weight=w_rec, bias=rng.uniform(0.1, 0.3, hidden)) if bias else nir.Linear(weight=w_rec)
    graph = _graph({"input": nir.Input(np.array([inputs])),
                    "fc1": nir.Affine(weight=rng.uniform(-0.2, 0.6, (hidden, inputs)), bias=np.zeros(hidden)),
                    "lif1.lif": lif1, "lif1.w_rec": rec,
                    "fc2": nir.Affine(weight=rng.uniform(-0.3, 0.6, (classes, hidden)), bias=np.zeros(classes)),
                    "lif2": lif2, "output": nir.Output(np.array([classes]))},
                   [("input", "fc1"), ("fc1", "lif1.lif"), ("lif1.lif", "lif1.w_rec"), ("lif1.w_rec", "lif1.lif"),
                    ("lif1.lif", "fc2"), ("fc2", "lif2"), ("lif2", "output")])
    return graph, (a1, b1, a2, b2)


def _braille_by_hand(graph, x, method, order):
    n = graph.nodes
    lif1, lif2 = Reference(n["lif1.lif"], DT, method, order), Reference(n["lif2"], DT, method, order)
    w_rec, b_rec = _t(n["lif1.w_rec"].weight), _t(getattr(n["lif1.w_rec"], "bias", 0.0))
    s1, out = torch.zeros(x.shape[1], w_rec.shape[0]), []
    for xt in x:  # the recurrent edge applied to the zero starting spikes at the first step: its bias
        s1 = lif1.step(xt @ _t(n["fc1"].weight).T + _t(n["fc1"].bias) + s1 @ w_rec.T + b_rec)
        out.append(lif2.step(s1 @ _t(n["fc2"].weight).T + _t(n["fc2"].bias)))
    return torch.stack(out)


@pytest.mark.parametrize("method", ["euler", "exact"])
@pytest.mark.parametrize("bias", [True, False])
def test_paper_braille_rnn_in_each_order(bias, method):
    graph, _ = _braille(bias)
    x = (_rand(40, 3, 12, seed=41) > 0.5).to(DTYPE)
    outs = {}
    for order in ORDERS:
        want = _braille_by_hand(graph, x, method, order)
        outs[order] = from_nir(graph, dt=DT, method=method, order=order)(x)
        assert want.sum() > 0 and (want == 0).sum() > 0
        assert torch.equal(outs[order], want)
    assert not torch.equal(outs["nir"], outs["current_first"])


@pytest.mark.parametrize("bias", [True, False])
def test_paper_braille_rnn_spikes_as_snntorch_modules(bias, on_cpu):
    """snnTorch's Synaptic layers and a Linear recurrence, run by hand, step by step, against the graph imported in
    snnTorch's order (current first, Euler at its dt)."""
    snn = pytest.importorskip("snntorch")
    graph, (a1, b1, a2, b2) = _braille(bias)
    n = graph.nodes
    lif1 = snn.Synaptic(alpha=_t(a1), beta=_t(b1), threshold=torch.ones(len(a1)), reset_mechanism="zero",
                        reset_delay=False)
    lif2 = snn.Synaptic(alpha=_t(a2), beta=_t(b2), threshold=torch.ones(len(a2)), reset_mechanism="zero",
                        reset_delay=False)
    fc1, fc2 = (torch.nn.Linear(*n[k].weight.shape[::-1]) for k in ("fc1", "fc2"))
    rec = torch.nn.Linear(len(a1), len(a1), bias=bias)
    with torch.no_grad():
        for layer, key in ((fc1, "fc1"), (fc2, "fc2"), (rec, "lif1.w_rec")):
            layer.weight.copy_(_t(n[key].weight))
            if layer.bias is not None:
                layer.bias.copy_(_t(n[key].bias))
    x = (_rand(40, 3, 12, seed=42) > 0.5).to(DTYPE)
    syn1, mem1 = lif1.init_synaptic()
    syn2, mem2 = lif2.init_synaptic()
    spk1, theirs = torch.zeros(3, len(a1)), []
    with torch.no_grad():
        for xt in x:
            spk1, syn1, mem1 = lif1(fc1(xt) + rec(spk1), syn1, mem1)
            spk1 = spk1.to(DTYPE)  # (snnTorch's spikes are float32)
            spk2, syn2, mem2 = lif2(fc2(spk1), syn2, mem2)
            theirs.append(spk2)
    theirs = torch.stack(theirs).to(DTYPE)
    net = from_nir(graph, dt=DT, method="euler", order="current_first")
    assert (net.folded == {"lif1.lif": "lif1.w_rec"}) == (not bias)  # a Linear loop runs inside the fused kernel
    assert theirs.sum() > 0 and torch.equal(net(x), theirs)
