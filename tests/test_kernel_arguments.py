"""No generated or packaged Triton function takes an argument named like a local of Triton's argument binder.
Triton 3.6 binds a launch's arguments in ``def dynamic_func(<arguments>): params = {...}; specialization = [...]``,
so an argument named ``params`` is read back as that dict ("failed to specialize argument of type: dict", the
GPU lane's failure of PlasticLinear's fused kernel); the interpreter binds nothing and never showed it."""
from __future__ import annotations

import ast
import inspect
from pathlib import Path

import pytest

import flexsn_dsl
from flexsn_dsl import delay_kernels
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.plastic_kernels import plastic_source

ROOT = Path(__file__).resolve().parents[1]
BINDER_NAMES = {"params", "specialization", "options", "backend", "specialize_impl", "JITCallable"}
SPECS = sorted((ROOT / "neurons").glob("*.yaml"))
PLASTIC = [("stdp_triplet.yaml", "lif.yaml"), ("stdp_reward.yaml", "izhikevich.yaml")]


def jit_arguments(source: str) -> dict[str, list[str]]:
    """Each ``@triton.jit`` function of ``source``: its argument names."""
    found = {}
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.FunctionDef) and any("jit" in ast.unparse(d) for d in node.decorator_list):
            found[node.name] = [a.arg for a in node.args.args]
    return found


def sources() -> list[tuple[str, str]]:
    out = [(path.stem, compile_spec(path).triton_source) for path in SPECS]
    out.append(("delay_kernels", inspect.getsource(delay_kernels)))
    for synapse, neuron in PLASTIC:
        model = flexsn_dsl.load(ROOT / "tests" / "specs" / synapse).model
        out.append((f"{synapse} -> {neuron}", plastic_source(model, compile_spec(ROOT / "neurons" / neuron))))
    return out


@pytest.mark.parametrize("name, source", sources(), ids=lambda v: v if len(v) < 40 else "")
def test_no_argument_shadows_the_binders_names(name, source):
    kernels = jit_arguments(source)
    assert kernels, f"{name}: no @triton.jit function found"
    clashes = {k: sorted(set(args) & BINDER_NAMES) for k, args in kernels.items() if set(args) & BINDER_NAMES}
    assert not clashes, f"{name}: arguments named like the binder's locals: {clashes}"


def test_the_check_sees_a_clash():
    """The reading above finds the argument that broke the fused kernel (its old signature)."""
    old = "@triton.jit\ndef k(x, out, w, pre_tr, post_tr, states, inputs, params, T):\n    pass\n"
    assert set(jit_arguments(old)["k"]) & BINDER_NAMES == {"params"}
