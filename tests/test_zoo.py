"""The neuron zoo (``neurons/*.yaml``) against independent hand-written references.

Every spec is loaded with ``flexsn_dsl.load`` and run in float64 on seeded random
inputs; outputs, final states and the gradients of the inputs and of the
learnable parameters must match ``tests/zoo_reference.py`` to tight tolerances.

To run the zoo on another backend, add its name to ``BACKENDS``.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
import zoo_reference as zr  # noqa: E402

import flexsn_dsl  # noqa: E402

BACKENDS = ["torch", "triton"]

NEURONS_DIR = Path(__file__).resolve().parents[1] / "neurons"
# recurrent neurons (rlif, lsnn) need sizes= and a weight: tests/test_recurrent.py checks them
SPEC_PATHS = sorted(p for p in [*NEURONS_DIR.glob("*.yaml"), *NEURONS_DIR.glob("*.yml")]
                    if "recurrent" not in yaml.safe_load(p.read_text()))
# stochastic neurons (their references take the draws as inputs): tests/test_noise.py checks them on the
# numbers they drew and by their statistics
DETERMINISTIC = [p for p in SPEC_PATHS if not getattr(zr.REFERENCES.get(p.stem), "draws", ())]

T = 8
SHAPE = (3, 5)
DTYPE = torch.float64
FWD_TOL = dict(rtol=1e-9, atol=1e-11)
GRAD_TOL = dict(rtol=1e-7, atol=1e-9)
# learnable parameters may be created in float32 before ``.to(float64)``
PARAM_VALUE_TOL = dict(rtol=1e-6, atol=1e-7)

# specs with several states (and inputs/outputs, learnable parameters) used for
# the step-mode / reset / state_seqs tests
STATEFUL_SPECS = ["modulated_lif", "alif"]

# (spec, overrides): overrides that must change the result as the reference says
OVERRIDES = [
    ("lif", {"tau": 3.0, "v_th": 0.8}),
    ("plif", {"w": 0.5}),  # a learnable parameter: its initial value
    ("izhikevich", {"c": -0.5, "d": 0.05}),  # c is also in the initial states
    ("modulated_lif", {"beta": 0.7, "gamma": 0.5}),
]


# --------------------------------------------------------------------------
# helpers
# --------------------------------------------------------------------------


def _spec_path(name: str) -> Path:
    for p in SPEC_PATHS:
        if p.stem == name:
            return p
    raise AssertionError(f"no spec neurons/{name}.yaml")


def _load(name: str, backend: str, **kwargs):
    m = flexsn_dsl.load(str(_spec_path(name)), backend=backend, sizes=zr.REFERENCES[name].sizes, **kwargs)
    assert isinstance(m, torch.nn.Module)
    return m.to(DTYPE)


def _as_tuple(y):
    return tuple(y) if isinstance(y, (tuple, list)) else (y,)


def _call(m, ref, xs):
    """Call ``m`` with the inputs in spec order; returns ``{output: tensor}``."""
    y = m(*[xs[k] for k in ref.inputs])
    if len(ref.outputs) == 1:
        assert isinstance(y, torch.Tensor), "one output must be returned as a tensor"
    else:
        assert isinstance(y, tuple), "several outputs must be returned as a tuple"
    ys = _as_tuple(y)
    assert len(ys) == len(ref.outputs), f"expected outputs {ref.outputs}, got {len(ys)}"
    return dict(zip(ref.outputs, ys))


def _shape(name) -> tuple:
    """The shape of one step of the inputs: the spec's own where its parameters have a shape."""
    return zr.REFERENCES[name].step_shape or SHAPE


def _inputs(name, seed=None, requires_grad=False):
    xs = zr.make_inputs(name, T, _shape(name), seed=seed, dtype=DTYPE)
    return {k: v.clone().requires_grad_(requires_grad) for k, v in xs.items()}


def _twin_inputs(name, seed=None):
    """The same inputs twice, as separate leaves (module side, reference side)."""
    xs = zr.make_inputs(name, T, _shape(name), seed=seed, dtype=DTYPE)
    return (
        {k: v.clone().requires_grad_(True) for k, v in xs.items()},
        {k: v.clone().requires_grad_(True) for k, v in xs.items()},
    )


def _module_params(m, ref, expected=None):
    """The learnable parameters of ``m``, checked against the spec.

    Returns ``(named, leaves)``: ``named`` the module's parameters by name, and
    ``leaves`` float64 copies (0-dim, or of the parameter's shape) with requires_grad for the reference.
    """
    named = dict(m.named_parameters())
    assert set(named) == set(ref.learnable), (
        f"named_parameters {sorted(named)} != learnable parameters {sorted(ref.learnable)}"
    )
    expected = {**ref.learnable_defaults, **(expected or {})}
    leaves = {}
    for k in ref.learnable:
        p = named[k]
        shape = ref.param_shapes.get(k, ())
        assert tuple(p.shape) == shape, f"parameter {k} should have shape {shape}, got {tuple(p.shape)}"
        torch.testing.assert_close(
            p.detach().to(DTYPE), torch.full(shape, expected[k], dtype=DTYPE, device=p.device),
            **PARAM_VALUE_TOL,
        )
        # the reference uses the module's exact value (it may have been rounded to float32)
        leaves[k] = p.detach().to(DTYPE).clone().requires_grad_(True)
    return named, leaves


def _weights(name, like: dict, base: int):
    gen = torch.Generator().manual_seed(zr.input_seed(name, base))
    return {k: torch.randn(v.shape, generator=gen, dtype=DTYPE, device="cpu").to(v.device)
            for k, v in sorted(like.items())}


def _check_spikes(ref, outs):
    for k in ref.spike_outputs:
        s = outs[k].detach()
        assert bool(((s == 0) | (s == 1)).all()), f"output {k} is not binary"
        n = int(s.sum())
        assert 0 < n < s.numel(), (
            f"output {k} spikes {n}/{s.numel()} times: the test would not be meaningful"
        )


# --------------------------------------------------------------------------
# the zoo itself
# --------------------------------------------------------------------------


def test_zoo_is_complete():
    names = {p.stem for p in SPEC_PATHS}
    assert len(names) >= 12
    assert set(zr.REFERENCES) <= names, (
        f"references without a spec: {sorted(set(zr.REFERENCES) - names)}"
    )


@pytest.mark.parametrize("path", SPEC_PATHS, ids=lambda p: p.stem)
def test_spec_header(path):
    """Each spec names itself after its file, describes itself, and agrees with its
    reference on inputs, states and learnable parameters."""
    assert path.stem in zr.REFERENCES, f"{path.name} has no reference in tests/zoo_reference.py"
    ref = zr.REFERENCES[path.stem]
    spec = yaml.safe_load(path.read_text())
    assert spec["neuron"] == path.stem
    assert isinstance(spec.get("description"), str) and spec["description"].strip()
    assert tuple(spec.get("inputs", ["x"])) == ref.inputs
    # a refractory period adds the state `refractory` (the steps left)
    assert tuple(spec["states"]) + (("refractory",) if "refractory" in spec else ()) == ref.states
    params = spec.get("parameters") or {}
    assert set(params) == set(ref.params)
    learnable = {k for k, v in params.items() if isinstance(v, dict) and v.get("learnable")}
    assert learnable == set(ref.learnable)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("path", DETERMINISTIC, ids=lambda p: p.stem)
def test_zoo_matches_reference(path, backend):
    name = path.stem
    assert name in zr.REFERENCES, f"{path.name} has no reference in tests/zoo_reference.py"
    ref = zr.REFERENCES[name]

    m = _load(name, backend)
    named, leaves = _module_params(m, ref)
    xs_m, xs_r = _twin_inputs(name)

    # forward
    outs_m = _call(m, ref, xs_m)
    outs_r, states_r = zr.run_reference(name, xs_r, leaves)
    for k in ref.outputs:
        assert outs_m[k].shape == (T, *_shape(name)), f"output {k}: shape {tuple(outs_m[k].shape)}"
        assert outs_m[k].dtype == DTYPE, f"output {k}: dtype {outs_m[k].dtype}"
        torch.testing.assert_close(outs_m[k], outs_r[k], **FWD_TOL, msg=lambda s, k=k: f"output {k}: {s}")
    _check_spikes(ref, outs_m)

    states_m = dict(m.states)
    assert set(states_m) == set(ref.states)
    for k in ref.states:
        torch.testing.assert_close(states_m[k], states_r[k], **FWD_TOL, msg=lambda s, k=k: f"state {k}: {s}")
        if k != "refractory":  # the refractory counter has no gradient
            assert states_m[k].requires_grad, f"final state {k} carries no autograd graph"

    # backward: a random weighted sum of the outputs and of the final states
    w_out = _weights(name, outs_r, 1)
    w_st = _weights(name, states_r, 2)

    def loss(outs, states):
        return sum((w_out[k] * outs[k]).sum() for k in w_out) + sum(
            (w_st[k] * states[k]).sum() for k in w_st
        )

    loss(outs_m, states_m).backward()
    grads_r = torch.autograd.grad(
        loss(outs_r, states_r), [xs_r[k] for k in ref.inputs] + [leaves[k] for k in ref.learnable]
    )
    for k, g_r in zip(ref.inputs, grads_r):
        g_m = xs_m[k].grad
        assert g_m is not None, f"input {k} got no gradient"
        assert g_r.abs().sum() > 0
        torch.testing.assert_close(g_m, g_r, **GRAD_TOL, msg=lambda s, k=k: f"grad of input {k}: {s}")
    for k, g_r in zip(ref.learnable, grads_r[len(ref.inputs):]):
        g_m = named[k].grad
        assert g_m is not None, f"learnable parameter {k} got no gradient"
        assert bool((g_r.abs() > 0).all())
        assert g_m.shape == named[k].shape
        torch.testing.assert_close(
            g_m.to(DTYPE), g_r, **GRAD_TOL, msg=lambda s, k=k: f"grad of parameter {k}: {s}"
        )


# --------------------------------------------------------------------------
# module behaviour: step mode, state persistence and reset, state_seqs, params
# --------------------------------------------------------------------------


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", STATEFUL_SPECS)
def test_single_step_mode_equals_multi_step(name, backend):
    ref = zr.REFERENCES[name]
    m_m = _load(name, backend, step_mode="m")
    m_s = _load(name, backend, step_mode="s")
    xs_m, xs_s = _twin_inputs(name)

    outs_m = _call(m_m, ref, xs_m)
    steps = []
    for t in range(T):
        o = _call(m_s, ref, {k: xs_s[k][t] for k in ref.inputs})
        for k in ref.outputs:
            assert o[k].shape == _shape(name)
        steps.append(o)
    outs_s = {k: torch.stack([o[k] for o in steps]) for k in ref.outputs}

    for k in ref.outputs:
        torch.testing.assert_close(outs_s[k], outs_m[k], **FWD_TOL)
    for k in ref.states:
        torch.testing.assert_close(m_s.states[k], m_m.states[k], **FWD_TOL)
    _, leaves = _module_params(m_m, ref)
    outs_r, _ = zr.run_reference(name, {k: v.detach() for k, v in xs_m.items()}, leaves)
    for k in ref.outputs:
        torch.testing.assert_close(outs_s[k], outs_r[k], **FWD_TOL)

    # gradients through T single-step calls equal those of one multi-step call
    w = _weights(name, outs_m, 3)
    sum((w[k] * outs_m[k]).sum() for k in w).backward()
    sum((w[k] * outs_s[k]).sum() for k in w).backward()
    for k in ref.inputs:
        torch.testing.assert_close(xs_s[k].grad, xs_m[k].grad, **GRAD_TOL)
    pm, ps = dict(m_m.named_parameters()), dict(m_s.named_parameters())
    for k in ref.learnable:
        torch.testing.assert_close(ps[k].grad, pm[k].grad, **GRAD_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", STATEFUL_SPECS)
def test_states_persist_across_calls_until_reset(name, backend):
    ref = zr.REFERENCES[name]
    m = _load(name, backend)
    _, leaves = _module_params(m, ref)
    leaves = {k: v.detach() for k, v in leaves.items()}
    xs1 = _inputs(name)
    xs2 = _inputs(name, seed=zr.input_seed(name, 10))

    with torch.no_grad():
        y1 = _call(m, ref, xs1)
        y2 = _call(m, ref, xs2)  # continues from the states left by the first call
        both = {k: torch.cat([xs1[k], xs2[k]]) for k in ref.inputs}
        outs_r, states_r = zr.run_reference(name, both, leaves)
        for k in ref.outputs:
            torch.testing.assert_close(y1[k], outs_r[k][:T], **FWD_TOL)
            torch.testing.assert_close(y2[k], outs_r[k][T:], **FWD_TOL)
        for k in ref.states:
            torch.testing.assert_close(m.states[k], states_r[k], **FWD_TOL)

        m.reset()
        y3 = _call(m, ref, xs1)
        for k in ref.outputs:
            torch.testing.assert_close(y3[k], y1[k], **FWD_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", STATEFUL_SPECS)
def test_store_state_seqs(name, backend):
    ref = zr.REFERENCES[name]
    m = _load(name, backend, store_state_seqs=True)
    _, leaves = _module_params(m, ref)
    leaves = {k: v.detach() for k, v in leaves.items()}
    xs = _inputs(name)
    with torch.no_grad():
        outs_m = _call(m, ref, xs)
        outs_r, states_r, seqs_r = zr.run_reference(name, xs, leaves, return_state_seqs=True)
    assert set(m.state_seqs) == set(ref.states)
    for k in ref.states:
        seq = m.state_seqs[k]
        assert tuple(seq.shape) == (T, *_shape(name)), f"state_seqs[{k}]: shape {tuple(seq.shape)}"
        torch.testing.assert_close(seq, seqs_r[k], **FWD_TOL)
        torch.testing.assert_close(seq[-1], m.states[k], **FWD_TOL)
    for k in ref.outputs:
        torch.testing.assert_close(outs_m[k], outs_r[k], **FWD_TOL)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name,overrides", OVERRIDES, ids=[n for n, _ in OVERRIDES])
def test_params_override(name, overrides, backend):
    ref = zr.REFERENCES[name]
    xs = _inputs(name)

    m = _load(name, backend, params=overrides)
    _, leaves = _module_params(m, ref, expected=overrides)
    params_r = {**overrides, **{k: v.detach() for k, v in leaves.items()}}
    with torch.no_grad():
        outs_m = _call(m, ref, xs)
        outs_r, states_r = zr.run_reference(name, xs, params_r)
        outs_default, _ = zr.run_reference(name, xs)
    for k in ref.outputs:
        torch.testing.assert_close(outs_m[k], outs_r[k], **FWD_TOL)
    for k in ref.states:
        torch.testing.assert_close(m.states[k], states_r[k], **FWD_TOL)
    assert any(not torch.equal(outs_r[k], outs_default[k]) for k in ref.outputs), (
        "the override does not change the outputs: the test is not meaningful"
    )
