"""recompute=True (issue 27): a training call keeps its outputs and the states at the start of every chunk of
steps; the backward computes each chunk's states again. Outputs, final states and every gradient are the
bits of the saving path, whatever T and the chunk: on the torch backend, and on Triton's interpreter (the CPU).
Triton's compiled kernels (a GPU) agree to rounding: the compiler contracts multiply-adds differently in the
inference and training kernels, by time tile and for a launch of one step. The memory a forward pass keeps for
the backward is counted, never timed."""
from __future__ import annotations

import gc
import weakref
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import flexsn_dsl
from flexsn_dsl import SpecError
from flexsn_dsl.runtime import MIN_CHUNK, recompute_chunk

ROOT = Path(__file__).resolve().parents[1]
BACKENDS = ["triton", "torch"]

# one learnable scalar (k), a shaped learnable one (tau, per channel: the tiled backward), two states
# with an initial value that is not a constant (w starts at k)
SHAPED = """
neuron: shaped_adaptive
inputs: [x]
parameters:
  tau: {value: 2.0, learnable: true, shape: [C, 1]}
  k: {value: 0.7, learnable: true}
states: {v: 0.0, w: k}
step:
  h: v + (k * x - v) / tau - 0.2 * w
  s: spike(h - 1.0)
  v: h * (1 - s)
  w: 0.9 * w + s
outputs: [s, h]
"""


def _bits(t: torch.Tensor) -> torch.Tensor:
    """The tensor's bits as integers (torch.equal takes -0.0 for 0.0)."""
    return t.detach().contiguous().view({8: torch.int64, 4: torch.int32, 2: torch.int16}[t.element_size()])


# Triton's compiled kernels (the GPU) round some steps differently in a chunked launch (see above)
COMPILED = torch.get_default_device().type == "cuda"
# relative and absolute, compiled: a last-bit difference grows through the dynamics (HH, two calls of 6 steps
# in chunks of one step, on an H200: outputs within 3e-5, gradients within 6e-4)
ROUNDING = {torch.float64: 1e-12, torch.float32: 1e-3, torch.float16: 2e-3}


def _exact(backend: str) -> bool:
    """Whether ``backend`` gives the saving path's very bits here (all but Triton's compiled kernels)."""
    return backend == "torch" or not COMPILED


def _assert_same_bits(a: list, b: list, what: str, exact: bool = True) -> None:
    """The same bits, or (``exact`` False) equal to the rounding of the dtype's compiled arithmetic."""
    assert len(a) == len(b), what
    for k, (x, y) in enumerate(zip(a, b)):
        if x is None or y is None:
            assert x is None and y is None, f"{what}[{k}]"
            continue
        assert x.shape == y.shape and x.dtype == y.dtype, f"{what}[{k}]"
        if exact:
            assert torch.equal(_bits(x), _bits(y)), f"{what}[{k}]: max diff {(x.double() - y.double()).abs().max()}"
        else:
            tol = ROUNDING[x.dtype]
            torch.testing.assert_close(x, y, rtol=tol, atol=tol, msg=lambda m: f"{what}[{k}]: {m}")


def _train(module: flexsn_dsl.FlexSN, xs: list[torch.Tensor], calls: int = 1, init: dict | None = None):
    """Outputs of ``calls`` calls carrying the states, the final states, and the gradients of a loss of all
    of them with respect to the inputs, the learnable parameters and the given initial states ``init``."""
    if init:
        module.states = dict(init)
    outs = []
    for _ in range(calls):
        y = module(*xs)
        outs += list(y) if isinstance(y, tuple) else [y]
    finals = [module.states[n] for n in module.spec.states]
    weights = [torch.linspace(-1, 2, o.numel(), dtype=o.dtype).view_as(o) for o in outs]
    loss = sum((o * w).sum() for o, w in zip(outs, weights)) + sum(0.3 * f.sum() for f in finals)
    leaves = [*xs, *[p for p in module.parameters() if p.requires_grad], *(init or {}).values()]
    grads = torch.autograd.grad(loss, leaves, allow_unused=True)
    return [o.detach() for o in outs], [f.detach() for f in finals], list(grads)


def _compare(load, shape: tuple[int, ...], T: int, chunk: int | bool, dtype=torch.float32, calls: int = 1,
             init: bool = False, scale: float = 3.0):
    """The saving path and recompute on the same inputs: the same bits everywhere (to rounding on compiled
    Triton kernels)."""
    results = []
    for recompute in (False, chunk):
        module = load(recompute).to(dtype)
        exact = _exact(module.backend)
        g = torch.Generator(torch.get_default_device()).manual_seed(7)
        xs = [(torch.rand(T, *shape, generator=g, dtype=torch.float64) * scale).to(dtype).requires_grad_()
              for _ in module.spec.inputs]
        states = {n: (torch.rand(shape, generator=g, dtype=torch.float64) * 0.5).to(dtype).requires_grad_()
                  for n in module.spec.states} if init else None
        results.append(_train(module, xs, calls, states))
    (outs, finals, grads), (outs_r, finals_r, grads_r) = results
    assert any(bool(g.abs().sum() > 0) for g in grads if g is not None)  # gradients that say something
    _assert_same_bits(outs, outs_r, "outputs", exact)
    _assert_same_bits(finals, finals_r, "final states", exact)
    _assert_same_bits(grads, grads_r, "gradients", exact)
    return outs


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("T, chunk", [(7, 3), (9, 4), (5, 8), (6, 1), (4, True)])
def test_same_bits_as_the_saving_path(backend, T, chunk):
    """HH (four states, two outputs): odd T, T smaller than a chunk, T not a multiple of it, chunks of
    one step, the default chunk; two calls carrying the states."""
    load = lambda rc: flexsn_dsl.load(ROOT / "neurons" / "hh.yaml", backend=backend, params={"dt": 0.25},  # noqa: E731
                                      recompute=rc)
    s = torch.cat(_compare(load, (3, 5), T, chunk, calls=2, scale=50.0)[0::2])  # both calls' spikes
    assert 0 < s.sum() < s.numel() / 2  # spikes, not everywhere


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("dtype", [torch.float64, torch.float16])
def test_shaped_and_learnable_parameters(backend, dtype):
    """A learnable shaped parameter (the tiled backward), a learnable scalar, initial states given and
    needing gradients, and 16-bit storage (the checkpoints and carried gradients stay in float32)."""
    load = lambda rc: flexsn_dsl.loads(SHAPED, backend=backend, sizes={"C": 3}, recompute=rc)  # noqa: E731
    _compare(load, (2, 3, 4), 7, 2, dtype=dtype, init=True)


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("spec", ["lif_ct", "adex_ct", "plif", "lif_hetero"])
def test_zoo_specs(backend, spec):
    """Continuous-time specs (exact propagators, an ODE integrated by the step), learnable scalars and a
    per-neuron learnable parameter."""
    load = lambda rc: flexsn_dsl.load(ROOT / "neurons" / f"{spec}.yaml", backend=backend,  # noqa: E731
                                      sizes={"N": 6} if spec == "lif_hetero" else None, recompute=rc)
    _compare(load, (2, 6), 11, 4, calls=2)


def test_state_sequences_are_stored_and_differentiated():
    """store_state_seqs with recompute: the sequences are outputs (stored in the forward), and a loss on
    them has the saving path's gradients."""
    results = []
    for rc in (False, 3):
        m = flexsn_dsl.load(ROOT / "neurons" / "izhikevich.yaml", backend="triton", store_state_seqs=True, recompute=rc)
        gen = torch.Generator(torch.get_default_device()).manual_seed(1)
        x = (torch.rand(8, 5, generator=gen) * 20).requires_grad_()
        s = m(x)
        loss = (s * 2).sum() + sum((q * 0.01).sum() for q in m.state_seqs.values())
        results.append([s.detach(), *[q.detach() for q in m.state_seqs.values()], *torch.autograd.grad(loss, [x])])
    _assert_same_bits(results[0], results[1], "izhikevich", _exact("triton"))


def test_recurrent_spec():
    """The torch backend recomputes a recurrent spec (the same bits); the Triton backend's recurrent kernel
    refuses recompute, saying what to use instead."""
    weight = torch.randn(6, 6, generator=torch.Generator(torch.get_default_device()).manual_seed(3)) * 0.3
    load = lambda rc: flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", backend="torch",  # noqa: E731
                                      params={"r_weight": weight}, recompute=rc)
    _compare(load, (2, 6), 9, 4, calls=2)
    with pytest.raises(SpecError, match=r"does not recompute states.*\n(.*\n)*.*use recompute=False or backend=\"torch\""):
        flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", backend="triton", sizes={"N": 6}, recompute=True)


@pytest.mark.parametrize("value", [0, -3, 2.5, "yes", None])
def test_bad_recompute_values(value):
    with pytest.raises(ValueError, match="recompute must be True, False or the steps of a chunk"):
        flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", recompute=value)


def test_repr_and_copies_keep_it():
    """The module's repr says recompute; a deep copy and a pickled copy keep it."""
    import copy
    import pickle
    m = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", recompute=16)
    assert "recompute=16" in repr(m) and "recompute" not in repr(flexsn_dsl.load(ROOT / "neurons" / "lif.yaml"))
    assert copy.deepcopy(m).recompute == pickle.loads(pickle.dumps(m)).recompute == 16


def test_default_chunk():
    """True: about sqrt(T) steps, at least MIN_CHUNK; a number is the chunk itself."""
    assert recompute_chunk(True, 1) == recompute_chunk(True, 1000) == MIN_CHUNK
    assert recompute_chunk(True, 10_000) == 100 and recompute_chunk(True, 10_001) == 101
    assert recompute_chunk(5, 1000) == 5


class _Allocations(TorchDispatchMode):
    """Every tensor the operators inside return, weakly, with its storage."""

    def __init__(self):
        super().__init__()
        self.made: list[tuple[weakref.ref, int, int]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in (out if isinstance(out, (tuple, list)) else [out]):
            if isinstance(t, torch.Tensor):
                storage = t.untyped_storage()
                self.made.append((weakref.ref(t), storage.data_ptr(), storage.nbytes()))
        return out


def _kept_bytes(module, x: torch.Tensor) -> int:
    """Bytes of the storages a call allocated that are alive after it (each once), beside those of its
    outputs and final states: what it keeps for the backward."""
    with _Allocations() as allocations:
        y = module(x)
    gc.collect()
    given = {t.untyped_storage().data_ptr() for t in (*y, *module.states.values())}
    alive = {ptr: n for ref, ptr, n in allocations.made if ref() is not None and ptr not in given}
    return sum(alive.values())


@pytest.mark.parametrize("backend", BACKENDS)
def test_memory_kept_for_the_backward(backend):
    """HH over T = 40 steps in chunks of 8: a training call keeps, beside its outputs and final states,
    only its states at the chunk boundaries (the saving path keeps several values per step)."""
    T, n, chunk = 40, 64, 8
    x = (torch.rand(T, n, generator=torch.Generator(torch.get_default_device()).manual_seed(0)) * 20).requires_grad_()
    kept = {}
    for rc in (False, chunk):
        m = flexsn_dsl.load(ROOT / "neurons" / "hh.yaml", backend=backend, recompute=rc)
        kept[rc] = _kept_bytes(m, x)
    step_bytes, n_st = n * x.element_size(), len(m.spec.states)
    # the Triton kernels start the first chunk from the constant initial states; the torch step's
    # checkpoint keeps the initial state tensors it was given
    boundaries = T // chunk - (1 if backend == "triton" else 0)
    assert kept[chunk] == boundaries * n_st * step_bytes
    assert kept[False] >= 2 * T * step_bytes


@pytest.mark.parametrize("backend", BACKENDS)
def test_no_steps_and_no_gradients(backend):
    """T = 0 (the states as they were, in the graph) and calls without gradients run as without recompute."""
    expected: list[torch.Tensor] = []  # (the call without recompute's, which runs first)
    for rc in (False, 2):
        m = flexsn_dsl.load(ROOT / "neurons" / "izhikevich.yaml", backend=backend, recompute=rc)
        x = torch.rand(0, 4, requires_grad=True)
        assert m(x).shape == (0, 4)
        x = torch.rand(5, 4, generator=torch.Generator(torch.get_default_device()).manual_seed(2)) * 20
        with torch.no_grad():
            y = m(x)
        if rc:
            _assert_same_bits([y, *m.states.values()], expected, "no_grad", _exact(backend))
        expected = [y, *m.states.values()]


def test_bench_recompute_row(tmp_path):
    """bench --recompute: a training row of its own, whose gradients are the saving path's (diff 0; to
    rounding on compiled kernels)."""
    import json

    from flexsn_dsl.cli import main
    out = tmp_path / "bench.json"
    assert main(["bench", str(ROOT / "neurons" / "izhikevich.yaml"), "-T", "5", "-n", "40", "--mode", "training",
                 "--peers", "--recompute", "--json", str(out)]) == 0
    rows = {r["impl"]: r for r in json.loads(out.read_text())[-1]["results"]}
    assert set(rows) == {"flexsn-dsl", "flexsn-dsl recompute"}
    assert rows["flexsn-dsl recompute"]["max_abs_diff"] <= (ROUNDING[torch.float32] if COMPILED else 0.0)
    assert rows["flexsn-dsl recompute"]["ms"] > 0


@pytest.mark.parametrize("backend", BACKENDS)
def test_strided_inputs_and_states(backend):
    """Inputs and carried initial states that are not contiguous (transposed views)."""
    results = []
    expected: list[torch.Tensor] = []  # (the call without recompute's, which runs first)
    for rc in (False, 2):
        m = flexsn_dsl.load(ROOT / "neurons" / "izhikevich.yaml", backend=backend, recompute=rc)
        g = torch.Generator(torch.get_default_device()).manual_seed(5)
        x = (torch.rand(4, 6, 5, generator=g) * 20).requires_grad_()
        init = {n: torch.rand(6, 5, generator=g).requires_grad_() for n in m.spec.states}
        m.states = {n: v.t() for n, v in init.items()}
        y = m(x.transpose(1, 2))
        results.append([y.detach(), *torch.autograd.grad((y * torch.arange(y.numel()).view_as(y)).sum()
                                                           + sum(v.sum() for v in m.states.values()),
                                                           [x, *init.values()])])
    _assert_same_bits(results[0], results[1], "strided", _exact(backend))
