"""flexsn-safe-exp: the safe_exp IR pass and the fast_math source pass, end to end."""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.plugins import get_plugins

HERE = Path(__file__).resolve().parent
EIF_SOFT = HERE.parent / "examples" / "eif_soft_reset.yaml"
REPO_NEURONS = HERE.parents[2] / "neurons"
BIG = 200.0  # drives v far above threshold; the soft reset keeps it there
# the runs without the pass overflow on purpose (numpy warns in Triton's interpreter)
OVERFLOW_OK = pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")


def _run(backend: str, passes=(), dtype=torch.float32, spec=EIF_SOFT, x=None):
    neuron = flexsn_dsl.load(spec, backend=backend, passes=list(passes), store_state_seqs=True)
    if x is None:
        x = torch.tensor([[0.5, BIG]] * 4, dtype=dtype)
    x = x.clone().requires_grad_()
    spikes = neuron(x)
    spikes.sum().backward()
    return spikes.detach(), neuron.state_seqs["v"].detach(), x.grad


def test_registered_through_the_entry_point():
    plugins = get_plugins()
    assert dict(plugins.sources)["safe_exp"].startswith("entry point safe_exp = flexsn_safe_exp")
    assert plugins.passes["safe_exp"].stage == "ir" and plugins.passes["safe_exp"].origin == "safe_exp"
    assert plugins.passes["fast_math"].stage == "source"
    assert not plugins.passes["safe_exp"].default and not plugins.passes["fast_math"].default


def test_safe_exp_rewrites_the_generated_code():
    plain = compile_spec(EIF_SOFT)
    safe = compile_spec(EIF_SOFT, passes=["safe_exp"])
    assert "torch.clamp" not in plain.torch_source and "tl.minimum" not in plain.triton_source
    assert "torch.exp(torch.clamp(" in safe.torch_source and ", max=80.0)" in safe.torch_source
    assert "_exp(tl.minimum(" in safe.triton_source and ", 80.0)" in safe.triton_source
    assert "passes: safe_exp" in safe.triton_source


@OVERFLOW_OK
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_safe_exp_turns_inf_and_nan_into_finite_values(backend):
    spikes, v, grad = _run(backend)
    assert torch.isinf(v[:, 1]).any() and torch.isnan(grad[:, 1]).any()   # without the pass
    spikes_safe, v_safe, grad_safe = _run(backend, passes=["safe_exp"])
    assert torch.isfinite(v_safe).all() and torch.isfinite(grad_safe).all()
    assert torch.equal(spikes_safe, spikes)
    # the first column never reaches the cap: identical with and without the pass
    assert torch.equal(v_safe[:, 0], v[:, 0]) and torch.equal(grad_safe[:, 0], grad[:, 0])


@OVERFLOW_OK
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_safe_exp_per_spec(tmp_path, backend):
    spec = tmp_path / "eif_safe.yaml"
    spec.write_text(EIF_SOFT.read_text().replace("neuron: eif_soft_reset", "neuron: eif_safe")
                    + "passes: [safe_exp]\n")
    _, v, grad = _run(backend, spec=spec)
    assert torch.isfinite(v).all() and torch.isfinite(grad).all()


def test_safe_exp_changes_nothing_below_the_cap():
    """The zoo's EIF and AdEx (hard reset): bit-identical results in float64."""
    torch.manual_seed(0)
    x = torch.randn(12, 7, dtype=torch.float64) * 2
    for name in ("eif", "adex"):
        spec = REPO_NEURONS / f"{name}.yaml"
        if not spec.exists():
            pytest.skip("the flexsn-dsl neuron zoo is not next to this plugin")
        plain = _run("torch", spec=spec, x=x)
        safe = _run("torch", passes=["safe_exp"], spec=spec, x=x)
        for a, b in zip(plain, safe):
            assert torch.equal(a, b)


def test_make_safe_exp_with_another_cap():
    import dataclasses
    import sympy
    from flexsn_safe_exp import make_safe_exp, safe_exp_rewrite

    u = sympy.Symbol("u", real=True)
    assert safe_exp_rewrite(sympy.exp(u), 10.0) == sympy.exp(sympy.Min(u, 10.0))
    assert safe_exp_rewrite(sympy.exp(sympy.Min(u, 3)), 10.0) == sympy.exp(sympy.Min(u, 3))  # bounded already
    assert safe_exp_rewrite(sympy.cosh(u), 10.0) == sympy.cosh(sympy.Max(sympy.Min(u, 10.0), -10.0))
    ir = compile_spec(EIF_SOFT).ir
    capped = make_safe_exp(10.0)(ir)
    assert dataclasses.is_dataclass(capped) and "Min(" in str(capped.assignments[0][1])
    with pytest.raises(ValueError):
        make_safe_exp(0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_fast_math_rewrites_divisions_and_keeps_results(dtype):
    spec = REPO_NEURONS / "eif.yaml"  # soft_sign surrogate: a division in the backward core
    plain = compile_spec(spec)
    fast = compile_spec(spec, passes=["fast_math"])
    assert "_fast_div" not in plain.triton_source
    source = fast.triton_source
    assert "def _fast_div(a, b):" in source and "tl.fdiv(a, b, approx=True)" in source
    backward = source[source.index("def eif_backward_core"):source.index("def eif_inference_kernel")]
    assert "_fast_div(" in backward and " / " not in backward.split('"""')[2]
    torch.manual_seed(1)
    x = torch.rand(6, 5, dtype=dtype) * 2
    reference = _run("torch", spec=spec, x=x)
    result = _run("triton", passes=["fast_math"], spec=spec, x=x)
    for a, b in zip(reference, result):  # on CPU the interpreter divides exactly; on a GPU <= 2 ulp apart
        torch.testing.assert_close(a, b)


def test_fast_math_leaves_sources_without_division_alone():
    from flexsn_safe_exp import fast_math

    source = "import triton\n\n@triton.jit\ndef n_forward_core(x):\n    return x * 2.0\n"
    assert fast_math(source, "n_0") == source


def test_cli_show_and_build_with_passes(tmp_path):
    """`flexsn-dsl show --kernel module --pass ...` and `build --pass ...` show the rewrites."""
    import os

    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p), "FLEXSN_DSL_CACHE": str(tmp_path)}
    show = subprocess.run([sys.executable, "-m", "flexsn_dsl", "show", str(EIF_SOFT), "--kernel", "module",
                           "--pass", "safe_exp", "--pass", "fast_math"], capture_output=True, text=True, env=env)
    assert show.returncode == 0, show.stderr
    assert "_exp(tl.minimum(" in show.stdout and "_fast_div(" in show.stdout
    out = tmp_path / "build"
    build = subprocess.run([sys.executable, "-m", "flexsn_dsl", "build", str(EIF_SOFT), "-o", str(out),
                            "--pass", "safe_exp"], capture_output=True, text=True, env=env)
    assert build.returncode == 0, build.stderr
    assert "_exp(tl.minimum(" in (out / "eif_soft_reset.py").read_text()
    assert "torch.exp(torch.clamp(" in (out / "eif_soft_reset_torch.py").read_text()
