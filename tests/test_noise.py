"""Random numbers in specs (language v3, section 1): rand(), randn() and white noise xi.

References: closed-form statistics (uniform and normal moments, the stationary variance and
autocorrelation of the Euler-Maruyama Ornstein-Uhlenbeck recursion, escape-noise rates), and for
the gradients a second spec that takes the same numbers as an input (run on the torch backend):
a spec that outputs its draws shows them, and its gradients must be those of the spec fed those
numbers, which holds only if the backward regenerates exactly the forward's draws.
"""
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.errors import SpecError
from flexsn_dsl.triton_settings import interpreting

ROOT = Path(__file__).resolve().parent.parent
BACKENDS = ["triton", "torch"]

DRAWS = """
neuron: draws
inputs: [x]
states: {v: 0.0}
step:
  a: rand()
  b: rand()
  n: randn()
  v: v + 0 * x
outputs: [a, b, n]
"""


def _draws(backend, T=64, N=256, dtype=torch.float32, seed=0):
    m = flexsn_dsl.loads(DRAWS, backend=backend)
    torch.manual_seed(seed)
    return m(torch.zeros(T, N, dtype=dtype))


def _sigmas(n: int) -> float:
    """Four standard errors of a mean of n samples of unit variance."""
    return 4 / math.sqrt(n)


@pytest.mark.parametrize("backend", BACKENDS)
def test_draws_have_their_distributions_and_are_independent(backend):
    a, b, n = _draws(backend)
    count = a.numel()
    assert a.min() >= 0 and a.max() < 1 and b.min() >= 0 and b.max() < 1
    assert abs(a.mean().item() - 0.5) < _sigmas(count) * math.sqrt(1 / 12)
    assert abs(a.var().item() - 1 / 12) < 0.01
    assert abs(n.mean().item()) < _sigmas(count) and abs(n.var().item() - 1) < 0.05
    assert abs(((n - n.mean()) ** 4).mean().item() / n.var().item() ** 2 - 3) < 0.25  # normal kurtosis
    z = lambda u: (u - u.mean()) / u.std()  # noqa: E731
    limit = _sigmas(count)
    assert abs((z(a) * z(b)).mean().item()) < limit  # two occurrences
    assert abs((z(a) * z(n)).mean().item()) < limit
    assert abs((z(a[1:]) * z(a[:-1])).mean().item()) < limit  # consecutive steps
    assert abs((z(a[:, 1:]) * z(a[:, :-1])).mean().item()) < limit  # neighbouring elements
    assert len(torch.unique(a)) > 0.99 * count  # no repeated streams


@pytest.mark.parametrize("backend", BACKENDS)
def test_manual_seed_makes_a_call_reproducible_and_calls_draw_fresh_numbers(backend):
    first, again = _draws(backend, T=16, seed=3), _draws(backend, T=16, seed=3)
    for x, y in zip(first, again):
        assert torch.equal(x, y)
    m = flexsn_dsl.loads(DRAWS, backend=backend)
    torch.manual_seed(3)
    one = m(torch.zeros(16, 256))
    two = m(torch.zeros(16, 256))  # the next call, the same generator
    assert torch.equal(one[0], first[0]) and not torch.equal(one[0], two[0])
    assert not torch.equal(_draws(backend, T=16, seed=4)[0], first[0])


NOISY = """
neuron: noisy
inputs: [x]
parameters:
  tau: 2.0
  sigma: {value: 0.4, learnable: true}
  p: {value: 0.3, learnable: true}
states: {v: 0.0}
step:
  n: randn()
  u: rand()
  h: v + (x - v) / tau + sigma * n
  s: spike(h - 1.0 + p * (u - 0.5))
  v: h * (1 - s)
outputs: [s, n, u]
"""


def fed_spec(text: str) -> str:
    """``text`` with each draw line (``n: randn()``, ``u: rand()``) turned into an input of that name, and out
    of the outputs: the same neuron fed the numbers instead of drawing them."""
    draws = re.findall(r"^  (\w+): randn?\(\)$", text, re.M)
    text = re.sub(r"^  \w+: randn?\(\)\n", "", text, flags=re.M)
    text = text.replace("inputs: [x]", f"inputs: [x, {', '.join(draws)}]")
    return re.sub(r"^outputs: \[(.*)\]$", lambda m: "outputs: [" + ", ".join(
        o for o in m.group(1).split(", ") if o not in draws) + "]", text, flags=re.M)


FED = fed_spec(NOISY)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_the_backward_uses_the_numbers_the_forward_drew(backend, dtype):
    """Gradients of x, sigma, p (a draw in the update and in the spike) and of the initial state equal
    those of the same neuron fed the drawn numbers as inputs."""
    torch.manual_seed(0)
    x = (torch.rand(40, 33, dtype=dtype) * 1.5).requires_grad_()
    v0 = torch.rand(33, dtype=dtype, requires_grad=True)
    noisy = flexsn_dsl.loads(NOISY, backend=backend).to(dtype)
    noisy.states = {"v": v0}
    s, n, u = noisy(x)
    weights = torch.rand_like(s)
    (s * weights).sum().backward()
    fed = flexsn_dsl.loads(FED, backend="torch").to(dtype)
    x2, v2 = x.detach().clone().requires_grad_(), v0.detach().clone().requires_grad_()
    fed.states = {"v": v2}
    s2 = fed(x2, n.detach(), u.detach())
    (s2 * weights).sum().backward()
    assert s.sum() > 0 and torch.equal(s, s2)
    tol = dict(rtol=1e-5, atol=1e-6) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(x.grad, x2.grad, **tol)
    torch.testing.assert_close(v0.grad, v2.grad, **tol)
    for name in ("sigma", "p"):
        torch.testing.assert_close(getattr(noisy, name).grad, getattr(fed, name).grad, **tol)


def test_the_backward_regenerates_the_draws_instead_of_saving_them():
    """Nothing the size of a step sequence is saved for a draw: the noisy LIF saves what the
    plain one does."""
    plain = NOISY.replace("sigma * n", "sigma * 0.25").replace("p * (u - 0.5)", "p * 0.1")
    sizes = []
    for text in (NOISY, plain):
        m = flexsn_dsl.loads(text, backend="triton")
        sizes.append(m._compiled.info.saved_names)
    assert sizes[0] == sizes[1]


OU = """
neuron: ou
parameters:
  tau: 1.0
  sigma: 0.5
  dt: 0.1
states: {v: 0.0}
equations:
  v: (x - v) / tau + sigma * sqrt(2 / tau) * xi
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_ornstein_uhlenbeck_statistics(backend):
    """Euler-Maruyama v' = a v + b n (a = 1 - dt/tau, b = sigma sqrt(2 dt / tau)): stationary variance
    b^2 / (1 - a^2) (sigma^2 for small dt), lag-k autocorrelation a^k, mean the drive."""
    tau, sigma, dt = 1.0, 0.5, 0.1
    a, b = 1 - dt / tau, sigma * math.sqrt(2 * dt / tau)
    var = b * b / (1 - a * a)
    m = flexsn_dsl.loads(OU, backend=backend)
    torch.manual_seed(1)
    N, T = 1024, 100  # (a correlation time of 10 steps: about 10,000 independent samples)
    m.states = {"v": torch.randn(N) * math.sqrt(var)}  # start in the stationary law: no burn-in
    v = m(torch.zeros(T, N))  # the state sequence is the output (no threshold)
    assert abs(v.var().item() / var - 1) < 0.05
    assert abs(v.mean().item()) < 0.03
    for lag in (2, 5):
        corr = (v[lag:] * v[:-lag]).mean().item() / v.var().item()
        assert abs(corr - a ** lag) < 0.04
    drive = flexsn_dsl.loads(OU, backend=backend)  # driven: the mean follows the drive
    drive.states = {"v": 0.7 + torch.randn(N) * math.sqrt(var)}
    assert abs(drive(torch.full((40, N), 0.7)).mean().item() - 0.7) < 0.03


def test_white_noise_is_integrated_by_euler_maruyama():
    m = flexsn_dsl.loads(OU, backend="torch")
    source = m._compiled.torch_source
    assert "randn__0" in source
    line = next(ln for ln in source.splitlines() if ln.strip().startswith("v__next ="))
    # x + dt f + sqrt(dt) g n with dt = 0.1, g = sigma sqrt(2 / tau)
    v, x, n = (torch.tensor([0.3, -0.2]), torch.tensor([1.0, 0.5]), torch.tensor([0.8, -1.1]))
    expected = v + 0.1 * (x - v) / 1.0 + math.sqrt(0.1) * 0.5 * math.sqrt(2.0) * n  # tau = 1
    (s,), (nxt,) = m._compiled.torch_namespace["step"](x, v, randn__0=n)
    torch.testing.assert_close(nxt, expected)
    assert "randn__0" in line


ESCAPE = """
neuron: escape
inputs: [x]
states: {v: 0.0}
step:
  v: x
  s: spike(sigmoid(v) - rand())
outputs: [s]
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_escape_noise_fires_with_its_probability(backend):
    m = flexsn_dsl.loads(ESCAPE, backend=backend)
    torch.manual_seed(2)
    drive = torch.tensor([-2.0, -0.5, 0.0, 1.0])
    s = m(drive.repeat(64, 512, 1))
    rate = s.mean(dim=(0, 1))
    p = torch.sigmoid(drive)
    assert torch.all((rate - p).abs() < 4 * torch.sqrt(p * (1 - p) / (64 * 512)))


RECURRENT_NOISY = """
neuron: rnoisy
inputs: [x]
parameters: {tau: 2.0, sigma: 0.3}
states: {v: 0.0}
recurrent: {r: {from: s}}
step:
  n: randn()
  h: v + (x + r - v) / tau + sigma * n
  s: spike(h - 1.0)
  v: h * (1 - s)
outputs: [s, n]
"""
RECURRENT_FED = fed_spec(RECURRENT_NOISY)


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("noisy", ["v: 0.5 * v + x + sigma * randn()",
                                   "v: 0.5 * v + x + sigma * randn() + 0 * rand()"])
def test_a_draw_a_zero_scale_folds_away_leaves_a_deterministic_step(noisy, backend):
    """With sigma 0 (the spec's value, or params=) sympy folds the draw away: the kernels draw nothing, and a
    call takes no seed (the Triton backend passed one anyway, shifting every argument: an error, and with
    gradients memory corrupted). The step is 0.5 v + x, written out."""
    spec = f"neuron: folded\nparameters: {{sigma: 0.0}}\nstates: {{v: 0.0}}\nstep:\n  {noisy}\noutputs: [v]\n"
    x = torch.rand(5, 2, 3, dtype=torch.float64, requires_grad=True)
    ou = flexsn_dsl.load(ROOT / "neurons" / "ou_lif.yaml", params={"sigma": 0.0}, backend=backend).double()
    runs = []
    for seed in (0, 1):  # no noise: other seeds, the same numbers
        torch.manual_seed(seed)
        y = ou(x)
        runs.append(torch.stack(y) if isinstance(y, tuple) else y)
        ou.reset()
    assert torch.equal(*runs)
    m = flexsn_dsl.loads(spec, backend=backend).double()
    y = m(x)
    v, want = torch.zeros(2, 3, dtype=torch.float64), []
    for xt in x:
        v = 0.5 * v + xt
        want.append(v)
    torch.testing.assert_close(y, torch.stack(want), rtol=1e-15, atol=0)
    (grad,) = torch.autograd.grad(y.sum(), x)
    torch.testing.assert_close(grad, (2 - 0.5 ** torch.arange(4, -1, -1, dtype=torch.float64)).reshape(5, 1, 1)
                               .expand(5, 2, 3), rtol=1e-15, atol=0)


def test_a_recurrent_layers_folded_draw_leaves_its_kernels_as_without_noise():
    """The recurrent kernels as well (they took the seed as their steps: an error): sigma 0 gives the numbers
    and gradients of the same spec with no draw at all."""
    noisy = ("neuron: rl\nparameters: {sigma: 0.0, tau: 2.0}\nrecurrent: {r: {from: s}}\nstates: {v: 0.0}\n"
             "step:\n  h: v + (x + r - v) / tau + sigma * randn()\n  s: spike(h - 1.0)\n  v: h * (1 - s)\n"
             "outputs: [s, v]\n")
    plain = noisy.replace(" + sigma * randn()", "")
    x = torch.rand(6, 2, 3, dtype=torch.float64) * 2
    got = []
    for text in (noisy, plain):
        torch.manual_seed(0)
        m = flexsn_dsl.loads(text, backend="triton", sizes={"N": 3}).double()
        xg = x.clone().requires_grad_()
        s, v = m(xg)
        got.append((s, v, *torch.autograd.grad((s + v).sum(), [xg, m.r_weight])))
    assert got[0][0].sum() > 0
    for a, b in zip(*got):
        assert torch.equal(a, b)


def test_recurrent_kernels_draw_and_regenerate_per_step():
    torch.manual_seed(0)
    noisy = flexsn_dsl.loads(RECURRENT_NOISY, backend="triton", sizes={"N": 16}).double()
    fed = flexsn_dsl.loads(RECURRENT_FED, backend="torch", sizes={"N": 16}).double()
    fed.r_weight.data.copy_(noisy.r_weight.data)
    x = torch.rand(12, 3, 16, dtype=torch.float64, requires_grad=True)
    s, n = noisy(x)
    w = torch.rand_like(s)
    (s * w).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    s2 = fed(x2, n.detach())
    (s2 * w).sum().backward()
    assert torch.equal(s, s2) and s.sum() > 0
    assert n.std() > 0.5 and not torch.equal(n[0], n[1])
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(noisy.r_weight.grad, fed.r_weight.grad, rtol=1e-10, atol=1e-12)


def test_torch_compile_fullgraph_with_draws(fresh_dynamo):
    """A compiled noisy module runs as one graph; its backward still sees its own draws."""
    noisy = flexsn_dsl.loads(NOISY, backend="triton").double()
    fed = flexsn_dsl.loads(FED, backend="torch").double()
    compiled = torch.compile(noisy, fullgraph=True)
    torch.manual_seed(0)
    x = (torch.rand(20, 9, dtype=torch.float64) * 1.5).requires_grad_()
    s, n, u = compiled(x)
    s.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    fed(x2, n.detach(), u.detach()).sum().backward()
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-12)
    assert n.std() > 0.5


def _error(text: str) -> SpecError:
    with pytest.raises(SpecError) as info:
        flexsn_dsl.loads(text, backend="torch")
    return info.value


@pytest.mark.parametrize("text, message, hint, line", [
    ("neuron: e\nstates: {v: 0.0}\nstep:\n  v: v + rand(2)\n", "rand() takes no arguments", "a + (b - a) * rand()", 4),
    ("neuron: e\nstates: {v: 0.0}\nstep:\n  v: v + 0.1 * xi\n", "'xi' is white noise", "randn()", 4),
    ("neuron: e\nparameters: {dt: 0.1}\nstates: {v: 0.0}\nequations:\n  v: -v\nthreshold: v + xi_a > 1\n",
     "'xi_a' is white noise", "randn()", 6),
    ("neuron: e\nparameters: {dt: 0.1}\nstates: {v: 0.0}\nequations:\n  v: -v + xi\nmethod: rk4\n",
     "`method: rk4` cannot integrate white noise (xi)", "method: euler", 6),
    ("neuron: e\nparameters: {dt: 0.1}\nstates: {v: 0.0}\nequations:\n  v: -v + v * xi\n",
     "multiplicative noise: the term v*xi", "additive noise", 5),
    ("neuron: e\nparameters: {dt: 0.1}\nstates: {v: 0.0}\nequations:\n  v: -v + exp(xi)\n",
     "multiplicative noise: the term exp(xi)", "additive noise", 5),
    ("neuron: e\nstates: {v: rand()}\nstep:\n  v: v + 1\n", "may not use rand()", "draw in `step`", 2),
    ("neuron: e\nparameters: {xi: 1.0}\nstates: {v: 0.0}\nstep:\n  v: v + xi\n", "'xi' is reserved", "xi0", 2),
])
def test_bad_noise_is_refused_with_place_and_hint(text, message, hint, line):
    exc = _error(text)
    assert message in exc.message and hint in exc.hint
    assert exc.pos is not None and exc.pos.line == line


def test_check_reports_what_load_reports(tmp_path):
    spec = tmp_path / "bad.yaml"
    spec.write_text("neuron: e\nstates: {v: 0.0}\nstep:\n  v: v + 0.1 * xi\n")
    run = subprocess.run([sys.executable, "-m", "flexsn_dsl", "check", str(spec)], capture_output=True, text=True)
    assert run.returncode != 0 and "Traceback" not in run.stderr
    assert f"{spec}:4:" in run.stderr and "'xi' is white noise" in run.stderr


def test_noise_without_method_is_euler_maruyama_and_linear_noise_needs_no_warning(recwarn):
    m = flexsn_dsl.loads(OU, backend="torch")
    assert m._compiled.model.continuous.method == "euler"
    assert not [w for w in recwarn if "method" in str(w.message)]


# -- the zoo's noisy neurons against their references (tests/zoo_reference.py) --
sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402


@pytest.mark.parametrize("backend", BACKENDS)
def test_ou_lif_follows_its_reference_on_the_numbers_it_drew(backend):
    """The OU current's sequence gives back the normal numbers drawn (i_t = a i_{t-1} + c n_t); the
    hand-written reference fed them computes the same spikes, states and input gradients."""
    ref = zr.REFERENCES["ou_lif"]
    p = ref.params
    m = flexsn_dsl.load(ROOT / "neurons" / "ou_lif.yaml", backend=backend, store_state_seqs=True).double()
    torch.manual_seed(5)
    x = (0.9 + 0.4 * torch.rand(300, 2, 8, dtype=torch.float64)).requires_grad_()
    s = m(x)
    w = torch.rand_like(s)
    (s * w).sum().backward()
    current = m.state_seqs["i_n"].detach()
    before = torch.cat([torch.zeros_like(current[:1]), current[:-1]])
    n = (current - (1 - p["dt"] / p["tau_n"]) * before) / (math.sqrt(p["dt"]) * p["sigma"] * math.sqrt(2 / p["tau_n"]))
    assert abs(n.std().item() - 1) < 0.05
    x2 = x.detach().clone().requires_grad_()
    outs, finals, seqs = zr.run_reference("ou_lif", {"x": x2, "randn__0": n}, return_state_seqs=True)
    (outs["s"] * w).sum().backward()
    assert s.sum() > 10 and torch.equal(s, outs["s"])
    torch.testing.assert_close(m.state_seqs["v"], seqs["v"], rtol=1e-9, atol=1e-11)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-7, atol=1e-9)


@pytest.fixture
def one_program(monkeypatch):
    """A population of 4,096 neurons in one program of Triton's interpreter (``FLEXSN_DSL_BLOCK``), not four of
    1,024: each neuron's draws are keyed by its index, so the numbers are the same bits, and an interpreted
    launch takes its time by program and operation, not by neuron (about 4x faster). Left alone on a GPU."""
    if interpreting():
        monkeypatch.setenv("FLEXSN_DSL_BLOCK", "4096")


@pytest.mark.parametrize("backend", BACKENDS)
def test_ou_lif_current_has_its_stationary_deviation(backend, one_program):
    m = flexsn_dsl.load(ROOT / "neurons" / "ou_lif.yaml", backend=backend, store_state_seqs=True)
    torch.manual_seed(6)
    a = 1 - 0.1 / 5.0
    expected = 0.3 / math.sqrt(1 - 0.1 / (2 * 5.0))  # sigma, for the Euler-Maruyama recursion: b^2 / (1 - a^2)
    m.states = {"v": torch.zeros(4096), "i_n": torch.randn(4096) * expected}  # the current's stationary law
    m(torch.zeros(300, 4096))
    current = m.state_seqs["i_n"]
    assert abs(current.std().item() / expected - 1) < 0.05
    lag = 50
    corr = (current[lag:] * current[:-lag]).mean().item() / current.var().item()
    assert abs(corr - a ** lag) < 0.05


def _expected_escape_spikes(x: float, T: int) -> float:
    """Expected spikes of one escape-noise neuron in T steps from reset, by the distribution of the
    steps since its last reset (its membrane follows one trajectory between resets)."""
    p = zr.REFERENCES["escape_lif"].params
    v, hazard = 0.0, []
    for _ in range(T):
        v = v + (x - v) * p["dt"] / p["tau"]
        hazard.append(1 - math.exp(-p["rho0"] * p["dt"] * math.exp((v - p["v_th"]) / p["delta"])))
    ages, total = [1.0] + [0.0] * T, 0.0
    for _ in range(T):
        fired = sum(a * q for a, q in zip(ages, hazard))
        total += fired
        ages = [fired] + [a * (1 - q) for a, q in zip(ages, hazard)][:T]
    return total


@pytest.mark.parametrize("backend", BACKENDS)
def test_escape_lif_fires_at_its_renewal_rate(backend, one_program):
    m = flexsn_dsl.load(ROOT / "neurons" / "escape_lif.yaml", backend=backend)
    torch.manual_seed(7)
    counts = m(torch.full((200, 4096), 0.95)).sum(0)
    expected = _expected_escape_spikes(0.95, 200)
    assert expected > 1
    assert abs(counts.mean().item() - expected) < 4 * counts.std().item() / math.sqrt(counts.numel())


def test_escape_lif_follows_its_reference_on_given_numbers(monkeypatch):
    """The torch backend's draws replaced by known numbers: spikes and gradients as the reference computes them."""
    torch.manual_seed(8)
    x = (0.8 + 0.6 * torch.rand(60, 4, 5, dtype=torch.float64)).requires_grad_()
    u = torch.rand(60, 4, 5, dtype=torch.float64)
    w = torch.rand(60, 4, 5, dtype=torch.float64)
    given = iter(u)
    monkeypatch.setattr(torch, "rand", lambda *shape, **kw: next(given).to(kw.get("dtype")))
    m = flexsn_dsl.load(ROOT / "neurons" / "escape_lif.yaml", backend="torch").double()
    s = m(x)
    monkeypatch.undo()
    (s * w).sum().backward()
    x2 = x.detach().clone().requires_grad_()
    outs, _ = zr.run_reference("escape_lif", {"x": x2, "rand__0": u})
    (outs["s"] * w).sum().backward()
    assert s.sum() > 5 and torch.equal(s, outs["s"])
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-9, atol=1e-11)


RANDOM_PERIOD = """
neuron: random_refractory
parameters: {dt: 1.0}
states: {v: 0.0}
equations:
  v: -v
method: euler
threshold: v + x >= 1
reset: {v: 0.0}
refractory:
  period: 1.0 + 3.0 * rand()
"""


@pytest.mark.parametrize("backend", BACKENDS)
def test_a_random_refractory_period_is_drawn_at_each_spike(backend):
    """Driven hard, the neuron fires as soon as it may: its intervals are round(1 + 3u) steps, u uniform:
    1, 2, 3, 4 with probabilities 1/6, 1/3, 1/3, 1/6."""
    m = flexsn_dsl.loads(RANDOM_PERIOD, backend=backend)
    torch.manual_seed(9)
    s = m(torch.full((300, 400), 5.0)).cpu()
    intervals = torch.cat([torch.diff(torch.nonzero(s[:, j])[:, 0]) for j in range(s.shape[1])])
    share = torch.bincount(intervals, minlength=5)[1:].double() / len(intervals)
    expected = torch.tensor([1 / 6, 1 / 3, 1 / 3, 1 / 6], dtype=torch.float64, device="cpu")
    assert torch.all((share - expected).abs() < 4 * torch.sqrt(expected * (1 - expected) / len(intervals)))


def test_to_nir_refuses_noise():
    pytest.importorskip("nir")
    from flexsn_dsl.nir import NIRError, to_nir
    net = torch.nn.Sequential(torch.nn.Linear(3, 3), flexsn_dsl.load(ROOT / "neurons" / "ou_lif.yaml"))
    with pytest.raises(NIRError, match="NIR has no noise"):
        to_nir(net, torch.zeros(2, 1, 3))


def test_simulate_seed_repeats_a_noisy_run_and_leaves_the_generator_alone(capsys):
    from flexsn_dsl.cli import main
    from flexsn_dsl.simulation import simulate
    spec = ROOT / "neurons" / "ou_lif.yaml"
    before = torch.random.get_rng_state()
    one, two = (simulate(spec, 1.0, steps=300, neurons=4, seed=11) for _ in range(2))
    assert torch.equal(torch.random.get_rng_state(), before)
    other = simulate(spec, 1.0, steps=300, neurons=4, seed=12)
    assert torch.equal(one.states["i_n"], two.states["i_n"]) and not torch.equal(one.states["i_n"], other.states["i_n"])
    runs = []
    for _ in range(2):
        assert main(["simulate", str(spec), "--steps", "200", "--seed", "3"]) == 0
        runs.append(capsys.readouterr().out)
    assert runs[0] == runs[1]
    assert main(["simulate", str(spec), "--steps", "20"]) == 0
    assert "repeat the run with --seed" in capsys.readouterr().out


@pytest.mark.parametrize("backend", BACKENDS)
def test_recompute_sees_the_same_draws(backend):
    """recompute=True runs chunks of steps, each chunk's draws those of its steps in the whole call: outputs
    and gradients are the bits of the saving path."""
    runs = []
    for recompute in (False, 4):
        m = flexsn_dsl.loads(NOISY, backend=backend, recompute=recompute).double()
        torch.manual_seed(0)
        x = (torch.rand(11, 6, dtype=torch.float64) * 1.5).requires_grad_()
        s, n, u = m(x)
        (s * torch.arange(1.0, 7.0, dtype=torch.float64)).sum().backward()
        runs.append((s, n, u, x.grad, m.sigma.grad, m.p.grad))
    for a, b in zip(*runs):
        assert torch.equal(a, b)


SHAPED_NOISY = """
neuron: shaped_noisy
inputs: [x]
parameters:
  tau: {value: 2.0, shape: [N], learnable: true}
  sigma: 0.4
states: {v: 0.0}
step:
  n: randn()
  h: v + (x - v) / tau + sigma * n
  s: spike(h - 1.0)
  v: h * (1 - s)
outputs: [s, n]
"""


def test_every_kernel_layout_draws_the_same_numbers():
    """A learnable per-neuron parameter makes the backward tiled (each element picks its own number of its Philox
    call) while the forward draws a block's calls once and interleaves them: the backward still sees the forward's
    numbers, element by element."""
    noisy = flexsn_dsl.loads(SHAPED_NOISY, backend="triton", sizes={"N": 37}).double()
    fed = flexsn_dsl.loads(fed_spec(SHAPED_NOISY), backend="torch", sizes={"N": 37}).double()
    torch.manual_seed(0)
    x = (torch.rand(9, 3, 37, dtype=torch.float64) * 1.5).requires_grad_()
    s, n = noisy(x)
    s.sum().backward()
    x2 = x.detach().clone().requires_grad_()
    s2 = fed(x2, n.detach())
    s2.sum().backward()
    assert torch.equal(s, s2)
    torch.testing.assert_close(x.grad, x2.grad, rtol=1e-10, atol=1e-12)
    torch.testing.assert_close(noisy.tau.grad, fed.tau.grad, rtol=1e-10, atol=1e-12)
