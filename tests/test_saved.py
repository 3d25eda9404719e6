"""What the training forward saves for the backward: the minimum-cut choice of
:mod:`flexsn_dsl.autodiff` against an exhaustive search written here (every subset of
the candidates, smallest first), on the zoo and on random small steps."""
from __future__ import annotations

import itertools
import random
from pathlib import Path

import pytest

from flexsn_dsl.autodiff import Backward, differentiate, name_spike_arguments
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.ir import StepIR

ROOT = Path(__file__).resolve().parents[1]
ZOO = sorted((ROOT / "neurons").glob("*.yaml"))

# The choices of the exhaustive search the package used before the minimum cut (commit cfb120c):
# (saved values, forward lines the backward reruns).
RECORDED = {
    "adex": (("v", "h"), ("s__u", "s")),
    "alif": (("s__u",), ("s", "z")),
    "cuba_lif": (("h",), ("s__u", "s")),
    "eif": (("x", "v"), ("h", "s__u", "s")),
    "if": (("h",), ("s__u", "s")),
    "izhikevich": (("v", "s__u"), ("s",)),
    "klif": (("charged",), ("h", "s__u", "s")),
    "leaky": (("mem", "mem__next"), ("b", "spk__u")),
    "li": (("v", "i_jump"), ()),
    "lif": (("h",), ("s__u", "s")),
    "lif_hetero": (("x", "v"), ("alpha", "h", "s__u", "s")),  # (added with it: the exhaustive search's choice)
    "lif_soft": (("s__u",), ()),
    "lsnn": (("a", "s__u"), ()),
    "modulated_lif": (("m", "h", "s1__u"), ("s1", "s2__u", "s2", "v_hard", "v_soft", "gate")),
    "plif": (("x", "v"), ("h", "s__u", "s")),
    "plif_channel": (("x", "v"), ("h", "s__u", "s")),  # (added with it: the exhaustive search's choice)
    "qif": (("x", "v"), ("h", "s__u", "s")),
    "resonate_fire": (("re_new", "im_new"), ("s__u", "s")),
    # continuous-time specs (the lines their lowering derives)
    "lif_ct": (("v__int",), ("s__u", "s")),
    "cuba_lif_ct": (("x", "i", "v__int"), ("s__u", "s")),
    "lif_refractory": (("refractory", "v__int"), ("s__u", "s")),
    "lif_hetero_ct": (("x", "v"), ("v__int", "s__u", "s")),  # (added with it: the exhaustive search's choice)
    "adex_ct": (("x", "v", "w"), ("v__k1", "w__k1", "v__k2", "w__k2", "v__k3", "w__k3", "v__k4", "v__int", "s__u", "s")),
    "izhikevich_ct": (("I", "v", "u"), ("v__k", "u__k", "v__int", "s__u", "s")),
    "hh": (("I", "V", "m", "h", "n", "refractory__start"),  # (the flag of its refractory condition)
           ("V__A", "m__A", "h__A", "n__A", "V__next", "s")),
    "morris_lecar": (("I", "V", "w", "refractory__start"),
                     ("V__k1", "w__k1", "V__k2", "w__k2", "V__k3", "w__k3", "V__k4", "V__next", "s")),
    "rlif": (("h",), ("s__u", "s")),
    # stochastic specs: a draw is regenerated in the backward, never saved
    "escape_lif": (("h",), ("p", "s__u", "s")),
    "ou_lif": (("v__int",), ("s__u", "s")),
}


def exhaustive(ir: StepIR, backward: Backward) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """The saved set by brute force: among all subsets of the values the backward's needs depend
    on, the least traffic (a stored value: write + read = 2, an input or output: read = 1), then
    the least recomputation (operations of the rerun lines), then the fewest values, then the first
    in (inputs, states, lines) order. Returns (saved names, rerun names)."""
    forward = dict(ir.assignments)
    order = [s for s, _ in ir.assignments]
    params = set(ir.params) | set(ir.fixed) | set(ir.draws)  # (draws are regenerated, never saved)
    needed = set().union(*(e.free_symbols for _, e in backward.adjoints), *(r.free_symbols for r in backward.results))
    needed &= set(ir.inputs) | set(ir.states) | set(forward)
    candidates, frontier = set(), set(needed)
    while frontier:
        sym = frontier.pop()
        if sym not in candidates:
            candidates.add(sym)
            frontier |= (forward[sym].free_symbols - params) if sym in forward else set()
    ranked = [s for s in [*ir.inputs, *ir.states, *order] if s in candidates]
    in_memory = set(ir.inputs) | set(ir.outputs)
    best = None
    for size in range(len(ranked) + 1):
        for subset in itertools.combinations(ranked, size):
            available = set(subset) | params
            for sym in order:
                if forward[sym].free_symbols <= available:
                    available.add(sym)
            if not needed <= available:
                continue
            rerun, want = [], set(needed)
            for sym in reversed(order):
                if sym in want and sym not in subset:
                    rerun.append(sym)
                    want |= forward[sym].free_symbols - params
            score = (sum(1 if s in in_memory else 2 for s in subset),
                     sum(forward[s].count_ops() + 1 for s in rerun), size)
            if best is None or score < best[0]:
                best = (score, tuple(s.name for s in subset), tuple(s.name for s in reversed(rerun)))
    return best[1], best[2]


def _chosen(ir: StepIR) -> tuple[StepIR, Backward]:
    ir = name_spike_arguments(ir)
    return ir, differentiate(ir)


@pytest.mark.parametrize("path", ZOO, ids=lambda p: p.stem)
def test_zoo_saved_sets(path):
    ir, backward = _chosen(compile_spec(path).ir)
    chosen = (tuple(s.name for s in backward.saved), tuple(s.name for s, _ in backward.recompute))
    assert chosen == exhaustive(ir, backward)
    assert chosen == RECORDED[path.stem]


def test_every_zoo_spec_is_recorded():
    assert sorted(RECORDED) == [p.stem for p in ZOO]


def _random_spec(rng: random.Random) -> str:
    """A small random step over inputs x, y, states v, w and a learnable parameter k."""
    names = ["x", "y", "v", "w", "k"]
    lines = []
    for i in range(rng.randint(3, 7)):
        a, b = rng.sample(names, 2)
        form = rng.choice(["{a} * {b}", "{a} + {b}", "exp({a}) - {b}", "spike({a} - {b})", "{a} * (1 - {b})",
                           "sigmoid({a}) * {b}", "{a} / 2", "tanh({a} + {b}) * 0.5", "spike({a})"])
        lines.append((f"a{i}", form.format(a=a, b=b)))
        names.append(f"a{i}")
    tail = [n for n in names if n.startswith("a")]
    lines += [("v", f"{rng.choice(tail)} + 0.5 * v"), ("w", f"{rng.choice(tail)} * w")]
    outputs = sorted(set(rng.sample(tail, min(2, len(tail)))))
    body = "".join(f"  {n}: {e}\n" for n, e in lines)
    return (f"neuron: r\ninputs: [x, y]\nparameters:\n  k: {{value: 0.7, learnable: true}}\n"
            f"states: {{v: 0.0, w: 1.0}}\nstep:\n{body}outputs: [{', '.join(outputs)}]\n")


@pytest.mark.parametrize("seed", range(40))
def test_random_steps_match_the_exhaustive_search(seed):
    text = _random_spec(random.Random(seed))
    ir, backward = _chosen(compile_spec(text=text).ir)
    chosen = (tuple(s.name for s in backward.saved), tuple(s.name for s, _ in backward.recompute))
    assert chosen == exhaustive(ir, backward), text
