"""Plugins: discovery (entry points, files, FLEXSN_DSL_PLUGINS), surrogates from plugins used by
name from YAML on both backends, code-generation passes end to end, and broken plugins.

The two example plugins under ``plugins/`` are pip-installed (``--target``, no network) into a
temporary folder that goes on ``sys.path``: flexsn-dsl finds them only through the
``flexsn_dsl`` entry points of the installed metadata.
"""
from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import flexsn_dsl
from flexsn_dsl import builtin_surrogates, hookspecs
from flexsn_dsl.compiler import compile_spec
from flexsn_dsl.plugins import BUILTIN, clear_cache, get_plugins

ROOT = Path(__file__).resolve().parents[1]
EXAMPLES = {"flexsn-surrogates-extra": ("surrogates_extra", "flexsn_surrogates_extra"),
            "flexsn-safe-exp": ("safe_exp", "flexsn_safe_exp")}
CONTRACT_SURROGATES = {"sigmoid", "atan", "piecewise_quadratic", "piecewise_exp", "soft_sign", "erf", "super_spike",
                       "rect", "piecewise_leaky_relu", "s2nn", "q_pseudo_spike", "leaky_k_relu",
                       "nonzero_sign_log_abs", "log_tailed_relu", "fast_sigmoid", "triangle", "straight_through"}
THRESHOLD = 0.25
# specs below overflow on purpose when a pass is off (numpy warns in Triton's interpreter)
OVERFLOW_OK = pytest.mark.filterwarnings("ignore:overflow encountered", "ignore:invalid value encountered")


# --------------------------------------------------------------------------
# fixtures and helpers
# --------------------------------------------------------------------------
def _write_dist(site: Path, dist: str, entry: str, module: str, source: str | None = None) -> None:
    """A minimal installed distribution: NAME-VERSION.dist-info with METADATA and entry_points.txt."""
    info = site / f"{dist.replace('-', '_')}-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: 0.1.0\n")
    (info / "entry_points.txt").write_text(f"[flexsn_dsl]\n{entry} = {module}\n")
    if source is not None:
        (site / f"{module}.py").write_text(textwrap.dedent(source))


def _forget_modules(*names: str) -> None:
    for name in list(sys.modules):
        if name.split(".")[0] in names:
            del sys.modules[name]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    """pip-install the example plugins into a temporary site folder and put it first on sys.path."""
    target = tmp_path_factory.mktemp("site")
    for package, (entry, module) in EXAMPLES.items():
        copy = tmp_path_factory.mktemp("src") / package  # pip builds in the tree: keep plugins/ clean
        shutil.copytree(ROOT / "plugins" / package, copy,
                        ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__", "tests"))
        done = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                               "--no-index", "--target", str(target), str(copy)], capture_output=True, text=True)
        if done.returncode != 0:  # no pip/setuptools: the same metadata, written by hand
            shutil.copytree(copy / module, target / module)
            _write_dist(target, package, entry, module)
    sys.path.insert(0, str(target))
    _forget_modules(*(m for _, m in EXAMPLES.values()))
    clear_cache()
    yield target
    sys.path.remove(str(target))
    _forget_modules(*(m for _, m in EXAMPLES.values()))
    clear_cache()


@pytest.fixture(autouse=True)
def fresh_plugins(tmp_path, monkeypatch):
    """Every test discovers plugins afresh, and writes generated modules to its own cache."""
    monkeypatch.setenv("FLEXSN_DSL_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FLEXSN_DSL_PLUGINS", raising=False)
    clear_cache()
    yield
    clear_cache()


def _plugin_file(folder: Path, name: str, body: str) -> Path:
    path = folder / f"{name}.py"
    path.write_text("import flexsn_dsl\nimport sympy\n\n" + textwrap.dedent(body))
    return path


GOOD = """
@flexsn_dsl.hookimpl
def flexsn_dsl_register_surrogates(registry):
    registry.register("my_tri", gradient="alpha * Max(0, 1 - alpha * Abs(x))", params={"alpha": 1.0},
                      description="a triangle written as in the contract's example")
"""


def _probe(surrogate: str, name: str = "probe", extra: str = "") -> str:
    return textwrap.dedent(f"""\
        neuron: {name}
        surrogate: {surrogate}
        states: {{v: 0.0}}
        step:
          s: spike(x - {THRESHOLD})
        outputs: [s]
        """) + extra


def _grad(neuron, x: torch.Tensor) -> torch.Tensor:
    x = x.clone().requires_grad_()
    spikes = neuron(x)
    assert torch.equal(spikes, (x.detach() >= THRESHOLD).to(x.dtype))
    spikes.sum().backward()
    return x.grad


X64 = torch.linspace(-3, 3, 30, dtype=torch.float64).reshape(5, 6)


def _env(site: Path | None = None, **extra) -> dict:
    paths = [str(site)] if site else []
    paths += [p for p in sys.path if p and p != str(site)]
    return {**os.environ, "PYTHONPATH": os.pathsep.join(paths), **extra}


def _cli(*args, env=None, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexsn_dsl", *map(str, args)], capture_output=True, text=True,
                          env=env or _env(), cwd=cwd, timeout=120)


# --------------------------------------------------------------------------
# the hooks and the built-in catalogue
# --------------------------------------------------------------------------
def test_builtin_catalogue_registers_through_the_public_hook():
    assert flexsn_dsl.hookimpl is hookspecs.hookimpl
    assert hasattr(builtin_surrogates.flexsn_dsl_register_surrogates, "flexsn_dsl_impl")  # marked @hookimpl
    plugins = get_plugins()
    assert plugins.sources[0] == (BUILTIN, "built in")
    assert CONTRACT_SURROGATES <= set(plugins.surrogates)
    assert {plugins.surrogates[n].origin for n in CONTRACT_SURROGATES} == {BUILTIN}
    assert plugins.surrogates["sigmoid"].params == {"alpha": 4.0}


def test_installed_plugins_are_found_through_entry_point_metadata(site):
    plugins = get_plugins(warn=False)
    assert not plugins.errors
    sources = dict(plugins.sources)
    assert sources["surrogates_extra"] == ("entry point surrogates_extra = flexsn_surrogates_extra "
                                           "from flexsn-surrogates-extra 0.1.0")
    assert sources["safe_exp"].startswith("entry point safe_exp = flexsn_safe_exp from flexsn-safe-exp")
    assert Path(sys.modules["flexsn_surrogates_extra"].__file__).is_relative_to(site)  # the installed copy
    assert plugins.surrogates["circ"].origin == "surrogates_extra"
    assert plugins.passes["safe_exp"].origin == "safe_exp" and plugins.passes["fast_math"].stage == "source"


@pytest.mark.parametrize("backend", ["torch", "triton"])
@pytest.mark.parametrize("name, spec_params, formula", [
    ("circ", "alpha: 1.5", lambda u: 1.5 ** 3 / (1.5 ** 2 + u ** 2) ** 1.5),
    ("multi_gaussian", "sigma: 0.4",
     lambda u: 0.5 / math.sqrt(2 * math.pi) * (1.15 / 0.4 * torch.exp(-u ** 2 / (2 * 0.4 ** 2))
                                              - 0.15 / 2.4 * torch.exp(-(u - 0.4) ** 2 / (2 * 2.4 ** 2))
                                              - 0.15 / 2.4 * torch.exp(-(u + 0.4) ** 2 / (2 * 2.4 ** 2)))),
])
def test_entry_point_surrogate_by_name_from_yaml(site, backend, name, spec_params, formula):
    neuron = flexsn_dsl.loads(_probe(f"{{name: {name}, {spec_params}}}", f"probe_{name}"), backend=backend)
    torch.testing.assert_close(_grad(neuron, X64), formula(X64 - THRESHOLD), rtol=1e-10, atol=1e-12)


# --------------------------------------------------------------------------
# plugin files: plugins=, --plugin, FLEXSN_DSL_PLUGINS
# --------------------------------------------------------------------------
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_plugin_file_through_load(tmp_path, backend):
    plugin = _plugin_file(tmp_path, "tri_plugin", GOOD)
    spec = tmp_path / "probe.yaml"
    spec.write_text(_probe("{name: my_tri, alpha: 2.0}"))
    with pytest.raises(flexsn_dsl.SpecError, match="unknown surrogate 'my_tri'"):
        flexsn_dsl.load(spec)
    neuron = flexsn_dsl.load(spec, plugins=[plugin], backend=backend)
    u = X64 - THRESHOLD
    torch.testing.assert_close(_grad(neuron, X64), 2.0 * torch.clamp(1 - 2.0 * u.abs(), min=0), rtol=1e-12, atol=0)
    assert get_plugins([plugin]).surrogates["my_tri"].origin == str(plugin)


SYMPY_SPELLINGS = """
@flexsn_dsl.hookimpl
def flexsn_dsl_register_surrogates(registry):
    registry.register("tri_pw", gradient="Piecewise((alpha * (1 - Abs(alpha * x)), Abs(alpha * x) <= 1), (0, True))",
                      params={"alpha": 1.0})
    registry.register("sech2", gradient="Rational(1, 2) * alpha * sech(alpha * x) ** 2", params={"alpha": 1.0})
    registry.register("gauss", gradient="E ** (-x ** 2) / Pow(pi, Rational(1, 2))")
    registry.register("asinh_bump", gradient="1 / (1 + asinh(x) ** 2)")
"""


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_gradients_in_sympys_spellings(tmp_path, backend):
    """A gradient string is sympy's syntax (the contract: "sympy-parsable"): Piecewise of (value, condition) pairs,
    Rational, Pow, E, sech and asinh, against the same formulas written in torch."""
    plugin = _plugin_file(tmp_path, "sympy_spellings", SYMPY_SPELLINGS)
    u = X64 - THRESHOLD
    expected = {"{name: tri_pw, alpha: 2.0}": torch.where((2 * u).abs() <= 1, 2 * (1 - (2 * u).abs()), 0.0),
                "{name: sech2, alpha: 2.0}": 1.0 / torch.cosh(2 * u) ** 2,
                "gauss": torch.exp(-u ** 2) / math.sqrt(math.pi),
                "asinh_bump": 1 / (1 + torch.asinh(u) ** 2)}
    for i, (surrogate, want) in enumerate(expected.items()):
        neuron = flexsn_dsl.loads(_probe(surrogate, f"probe_{i}"), plugins=[plugin], backend=backend)
        torch.testing.assert_close(_grad(neuron, X64), want, rtol=1e-12, atol=1e-15)


def test_plugin_file_from_environment_variable(tmp_path, monkeypatch):
    plugin = _plugin_file(tmp_path, "env_plugin", GOOD)
    monkeypatch.setenv("FLEXSN_DSL_PLUGINS", os.pathsep.join([str(plugin), ""]))
    clear_cache()
    neuron = flexsn_dsl.loads(_probe("my_tri"), backend="torch")
    torch.testing.assert_close(_grad(neuron, X64), torch.clamp(1 - (X64 - THRESHOLD).abs(), min=0))
    assert any(name.endswith("env_plugin.py") for name, _ in get_plugins().sources)


def test_cli_check_with_plugin_file(tmp_path):
    plugin = _plugin_file(tmp_path, "tri_plugin", GOOD)
    spec = tmp_path / "probe.yaml"
    spec.write_text(_probe("{name: my_tri, alpha: 2.0}"))
    done = _cli("check", "--plugin", plugin, spec)
    assert done.returncode == 0, done.stderr
    assert "surrogate my_tri" in done.stdout
    done = _cli("check", spec)
    assert done.returncode == 1 and "unknown surrogate 'my_tri'" in done.stderr and "Traceback" not in done.stderr
    assert f"{spec}:2:" in done.stderr  # file, line and column of the surrogate name


def test_cli_plugins_lists_everything_with_its_origin(site, tmp_path):
    plugin = _plugin_file(tmp_path, "tri_plugin", GOOD)
    env = _env(site, FLEXSN_DSL_CACHE=str(tmp_path / "cache"))
    done = _cli("plugins", "--plugin", plugin, env=env)
    assert done.returncode == 0, done.stderr
    out = done.stdout
    assert f"{BUILTIN}  (built in)" in out
    assert "surrogates_extra  (entry point surrogates_extra = flexsn_surrogates_extra from " \
           "flexsn-surrogates-extra 0.1.0)" in out
    assert f"{plugin}  (file {plugin})" in out
    assert "sigmoid(alpha=4)  g(x) = " in out and f"[{BUILTIN}]" in out
    assert "circ(alpha=1)  g(x) = alpha**3/(alpha**2 + x**2)**1.5  [surrogates_extra]" in out
    assert "my_tri(alpha=1)  g(x) = " in out and f"[{plugin}]" in out
    assert "safe_exp  (stage ir, order 50)  [safe_exp]" in out
    assert "fast_math  (stage source, order 100)  [safe_exp]" in out
    assert out.index("safe_exp  (stage ir") < out.index("fast_math  (stage source")  # run order
    data = json.loads(_cli("plugins", "--json", env=env).stdout)
    assert {"name": "circ", "plugin": "surrogates_extra"}.items() <= \
        next(s for s in data["surrogates"] if s["name"] == "circ").items()
    assert [p["name"] for p in data["passes"]] == ["safe_exp", "fast_math"] and data["errors"] == []


# --------------------------------------------------------------------------
# code-generation passes
# --------------------------------------------------------------------------
EIF_SOFT = ROOT / "plugins" / "flexsn-safe-exp" / "examples" / "eif_soft_reset.yaml"


def _eif(backend: str, spec=None, text=None, passes=()):
    if text is not None:
        neuron = flexsn_dsl.loads(text, backend=backend, passes=passes, store_state_seqs=True)
    else:
        neuron = flexsn_dsl.load(spec, backend=backend, passes=passes, store_state_seqs=True)
    x = torch.tensor([[0.5, 200.0]] * 4, requires_grad=True)
    neuron(x).sum().backward()
    return neuron.state_seqs["v"].detach(), x.grad


@OVERFLOW_OK
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_pass_enabled_per_spec(site, backend):
    text = EIF_SOFT.read_text()
    v, grad = _eif(backend, text=text)
    assert not torch.isfinite(v).all() and torch.isnan(grad).any()
    safe_text = text.replace("neuron: eif_soft_reset", "neuron: eif_spec_pass") + "passes: [safe_exp]\n"
    v, grad = _eif(backend, text=safe_text)
    assert torch.isfinite(v).all() and torch.isfinite(grad).all()
    compiled = compile_spec(text=safe_text)
    assert "torch.exp(torch.clamp(" in compiled.torch_source and "_exp(tl.minimum(" in compiled.triton_source


@OVERFLOW_OK
@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_pass_enabled_per_build(site, backend):
    v, grad = _eif(backend, spec=EIF_SOFT, passes=["safe_exp"])
    assert torch.isfinite(v).all() and torch.isfinite(grad).all()
    v, grad = _eif(backend, spec=EIF_SOFT, passes="safe_exp")  # one name as a string is fine too
    assert torch.isfinite(v).all() and torch.isfinite(grad).all()


def test_cli_build_and_show_with_passes(site, tmp_path):
    env = _env(site, FLEXSN_DSL_CACHE=str(tmp_path / "cache"))
    out = tmp_path / "build"
    done = _cli("build", EIF_SOFT, ROOT / "neurons" / "eif.yaml", "-o", out, "--pass", "safe_exp",
                "--pass", "fast_math", env=env)
    assert done.returncode == 0, done.stderr
    kernels = (out / "eif.py").read_text()
    assert "passes: fast_math, safe_exp" in kernels or "passes: safe_exp, fast_math" in kernels
    assert "_exp(tl.minimum(" in kernels and "def _fast_div(a, b):" in kernels and "grad__s * _fast_div(1.0, " in kernels
    assert "torch.exp(torch.clamp(" in (out / "eif_soft_reset_torch.py").read_text()
    done = _cli("show", EIF_SOFT, "--kernel", "module", "--pass", "fast_math", env=env)
    assert done.returncode == 0 and "_fast_div(" in done.stdout and "tl.minimum" not in done.stdout
    done = _cli("build", EIF_SOFT, "-o", out, "--pass", "safe_exq", env=env)
    assert done.returncode == 1 and "unknown code-generation pass 'safe_exq'" in done.stderr
    assert "did you mean 'safe_exp'?" in done.stderr


ORDERED_PASSES = """
CALLS = []

def _ir(name):
    def run(ir):
        CALLS.append(name)
        return ir
    return run

def _source(name):
    def run(source, module_name):
        CALLS.append(name)
        return source + f"# {name} saw {module_name}\\n"
    return run

@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry):
    registry.register("src_early", stage="source", function=_source("src_early"), order=1)
    registry.register("ir_late", stage="ir", function=_ir("ir_late"), order=200)
    registry.register("ir_b", stage="ir", function=_ir("ir_b"), order=10)
    registry.register("ir_a", stage="ir", function=_ir("ir_a"), order=10)
    registry.register("src_always", stage="source", function=_source("src_always"), default=True)
    registry.register("unused", stage="ir", function=_ir("unused"))
"""


def test_passes_run_in_documented_order(tmp_path):
    plugin = _plugin_file(tmp_path, "ordered", ORDERED_PASSES)
    text = _probe("sigmoid", "ordered", "passes: [ir_late, src_early]\n")
    compiled = compile_spec(text=text, plugins=[plugin], passes=["ir_b", "ir_a"])
    calls = next(m for m in list(sys.modules.values()) if getattr(m, "__file__", None) == str(plugin)).CALLS
    assert calls == ["ir_a", "ir_b", "ir_late"]  # IR passes run at load time (errors show early)
    source = compiled.triton_source
    assert calls == ["ir_a", "ir_b", "ir_late", "src_early", "src_always"]  # by stage, order, then name
    assert f"# src_always saw {compiled.module_name}" in source
    assert "passes: ir_a, ir_b, ir_late, src_early, src_always." in source
    assert "unused" not in source


# --------------------------------------------------------------------------
# broken plugins: clear errors naming the plugin; the others keep working
# --------------------------------------------------------------------------
BAD_SURROGATE_PLUGINS = {
    "unparsable": ('registry.register("bad", gradient="alpha * (x +", params={"alpha": 1.0})',
                   "surrogate 'bad': syntax error in gradient"),
    "unknown_name": ('registry.register("bad", gradient="beta * exp(-x ** 2)", params={"alpha": 1.0})',
                     "surrogate 'bad': unknown name 'beta'"),
    "unknown_function": ('registry.register("bad", gradient="gamma(x)")', "unknown function 'gamma'"),
    "not_a_pair": ('registry.register("bad", gradient="Piecewise(x, (0, True))")',
                   "each argument of Piecewise() is a (value, condition) pair"),
    "clash": ('registry.register("sigmoid", gradient="1")',
              f"surrogate 'sigmoid' is already registered by plugin {BUILTIN}"),
    "not_finite": ('registry.register("bad", gradient="1 / x")', "is not a finite real number at x=0"),
    "bad_params": ('registry.register("bad", gradient="x", params={"x": 1.0})', "parameter named 'x'"),
    "sympy_unknown_symbol": ('registry.register("bad", gradient=sympy.Symbol("y") * sympy.Symbol("x"))',
                             "gradient uses unknown names ['y']"),
    "hook_raises": ('raise RuntimeError("no catalogue today")',
                    "raised in flexsn_dsl_register_surrogates: RuntimeError: no catalogue today (at"),
}


@pytest.mark.parametrize("case", sorted(BAD_SURROGATE_PLUGINS))
def test_bad_surrogate_plugin_is_reported_and_the_others_work(tmp_path, case):
    body, expected = BAD_SURROGATE_PLUGINS[case]
    bad = _plugin_file(tmp_path, f"bad_{case}", f"""
        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_surrogates(registry):
            {body}
        """)
    good = _plugin_file(tmp_path, "good", GOOD)
    with pytest.warns(UserWarning, match=f"plugin {re.escape(str(bad))}: .*{re.escape(expected[:30])}"):
        plugins = get_plugins([bad, good])
    [error] = plugins.errors
    assert error.plugin == str(bad) and error.message.startswith(f"plugin {bad}: ")
    assert expected in error.message, error.message
    assert "bad" not in plugins.surrogates and CONTRACT_SURROGATES <= set(plugins.surrogates)
    neuron = flexsn_dsl.loads(_probe("my_tri"), plugins=[bad, good], backend="torch")  # the good one still works
    torch.testing.assert_close(_grad(neuron, X64), torch.clamp(1 - (X64 - THRESHOLD).abs(), min=0))
    with pytest.raises(flexsn_dsl.SpecError,
                       match=f"unknown surrogate 'bad'.*plugins that failed to load: plugin {re.escape(str(bad))}"):
        flexsn_dsl.loads(_probe("bad"), plugins=[bad, good])


@pytest.mark.parametrize("case, source, expected", [
    ("raises_at_import", "raise ImportError('needs a GPU library')",
     "failed to import: ImportError: needs a GPU library (at bad_raises_at_import.py line 4)"),
    ("syntax_error", "def oops(:\n    pass", "failed to import: SyntaxError"),
    ("hook_typo", "@flexsn_dsl.hookimpl\ndef flexsn_dsl_register_surrogate(registry):\n    pass",
     "@hookimpl function 'flexsn_dsl_register_surrogate' is not a flexsn-dsl hook"),
    ("hook_not_marked", "def flexsn_dsl_register_surrogates(registry):\n    registry.register('x1', gradient='1')",
     "function 'flexsn_dsl_register_surrogates' is not marked as a hook"),
    ("bad_hook_signature", "@flexsn_dsl.hookimpl\ndef flexsn_dsl_register_passes(registry, extra):\n    pass",
     "could not be registered"),
])
def test_broken_plugin_file_is_reported_and_the_others_work(tmp_path, case, source, expected):
    bad = _plugin_file(tmp_path, f"bad_{case}", source)
    good = _plugin_file(tmp_path, "good", GOOD)
    plugins = get_plugins([bad, good], warn=False)
    assert [e.plugin for e in plugins.errors] == [str(bad)]
    assert expected in plugins.errors[0].message, plugins.errors[0].message
    assert "my_tri" in plugins.surrogates and "sigmoid" in plugins.surrogates


def test_missing_plugin_file_is_reported(tmp_path):
    plugins = get_plugins([tmp_path / "nowhere.py"], warn=False)
    assert "plugin file does not exist" in plugins.errors[0].message and "sigmoid" in plugins.surrogates


def test_broken_entry_points_are_reported_and_the_others_work(site, tmp_path, monkeypatch):
    broken = tmp_path / "broken_site"
    _write_dist(broken, "flexsn-broken", "broken_import", "flexsn_broken_import", "raise RuntimeError('boom')\n")
    _write_dist(broken, "flexsn-clash", "zz_clash", "flexsn_clash", """
        import flexsn_dsl

        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_surrogates(registry):
            registry.register("circ", gradient="1")  # taken by surrogates_extra (entry points load by name)
            registry.register("never_reached", gradient="1")
        """)
    monkeypatch.syspath_prepend(str(broken))
    clear_cache()
    try:
        plugins = get_plugins(warn=False)
        messages = {e.plugin: e.message for e in plugins.errors}
        assert messages.keys() == {"broken_import", "zz_clash"}
        assert messages["broken_import"].startswith("plugin broken_import: (entry point broken_import = "
                                                    "flexsn_broken_import from flexsn-broken 0.1.0) failed to import: "
                                                    "RuntimeError: boom")
        assert "surrogate 'circ' is already registered by plugin surrogates_extra" in messages["zz_clash"]
        assert plugins.surrogates["circ"].origin == "surrogates_extra"  # the first plugin keeps the name
        neuron = flexsn_dsl.loads(_probe("{name: circ, alpha: 1.0}", "probe_circ_ok"), backend="torch")
        torch.testing.assert_close(_grad(neuron, X64), 1 / (1 + (X64 - THRESHOLD) ** 2) ** 1.5)
        done = _cli("plugins", env=_env(site, PYTHONPATH=os.pathsep.join([str(broken), str(site), *sys.path])))
        assert done.returncode == 1 and "Traceback" not in done.stderr
        assert "error: plugin broken_import: " in done.stderr and "error: plugin zz_clash: " in done.stderr
        assert "circ(alpha=1)" in done.stdout
    finally:
        _forget_modules("flexsn_broken_import", "flexsn_clash")


BAD_PASSES = """
import dataclasses

def raises(ir):
    raise ZeroDivisionError("pass bug")

def returns_none(ir):
    return None

def unknown_symbol(ir):
    return ir.replace_exprs(lambda e: e + sympy.Symbol("ghost", real=True))

def unprintable(ir):
    return ir.replace_exprs(lambda e: e + sympy.Function("mystery")(e))

def source_not_python(source, module_name):
    return source + "\\ndef broken(:\\n"

def source_bytes(source, module_name):
    return source.encode()

def good(ir):
    return ir.replace_exprs(lambda e: e)

@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry):
    for f in (raises, returns_none, unknown_symbol, unprintable, good):
        registry.register(f.__name__, stage="ir", function=f)
    registry.register("source_not_python", stage="source", function=source_not_python)
    registry.register("source_bytes", stage="source", function=source_bytes)
"""


@pytest.mark.parametrize("name, expected", [
    ("raises", "code-generation pass 'raises' (stage ir) raised ZeroDivisionError: pass bug (at bad_passes.py line 8)"),
    ("returns_none", "code-generation pass 'returns_none' (stage ir) returned NoneType, expected a StepIR"),
    ("unknown_symbol", "returned an invalid IR: line 's' uses ['ghost']"),
    ("unprintable", "returned an invalid IR: line 's' = "),
    ("source_not_python", "code-generation pass 'source_not_python' (stage source) returned text that is not "
                          "valid Python"),
    ("source_bytes", "returned bytes, expected str"),
])
def test_bad_pass_is_a_clear_error_naming_pass_and_plugin(tmp_path, name, expected):
    plugin = _plugin_file(tmp_path, "bad_passes", BAD_PASSES)
    text = _probe("sigmoid", f"probe_{name}")
    with pytest.raises(flexsn_dsl.PluginError) as info:
        compiled = compile_spec(text=text, plugins=[plugin], passes=[name])
        compiled.triton_source  # noqa: B018 - source passes run when the kernels are generated
    assert info.value.message.startswith(f"plugin {plugin}: ") and info.value.plugin == str(plugin)
    assert expected in info.value.message, info.value.message
    # the same plugin's good pass, and builds without the bad pass, still work
    neuron = flexsn_dsl.loads(text, plugins=[plugin], passes=["good"], backend="triton")
    assert _grad(neuron, X64).shape == X64.shape


def test_bad_pass_in_yaml_through_the_cli_names_the_plugin(tmp_path):
    plugin = _plugin_file(tmp_path, "bad_passes", BAD_PASSES)
    spec = tmp_path / "probe.yaml"
    spec.write_text(_probe("sigmoid", extra="passes: [raises]\n"))
    done = _cli("check", "--plugin", plugin, spec, env=_env(FLEXSN_DSL_CACHE=str(tmp_path / "cache")))
    assert done.returncode == 1 and "Traceback" not in done.stderr
    assert f"plugin {plugin}: code-generation pass 'raises' (stage ir) raised ZeroDivisionError" in done.stderr
    spec.write_text(_probe("sigmoid", extra="passes: [raise]\n"))
    done = _cli("check", "--plugin", plugin, spec, env=_env(FLEXSN_DSL_CACHE=str(tmp_path / "cache")))
    assert done.returncode == 1 and f"{spec}:7:" in done.stderr and "did you mean 'raises'?" in done.stderr


def test_registering_bad_passes_is_reported(tmp_path):
    plugin = _plugin_file(tmp_path, "bad_registration", """
        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_passes(registry):
            registry.register("ok", stage="ir", function=lambda ir: ir)
            registry.register("wrong_stage", stage="ast", function=lambda ir: ir)
        """)
    plugin2 = _plugin_file(tmp_path, "bad_signature", """
        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_passes(registry):
            registry.register("two_args", stage="ir", function=lambda ir, extra: ir)
        """)
    plugin3 = _plugin_file(tmp_path, "pass_clash", """
        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_passes(registry):
            registry.register("ok", stage="source", function=lambda s, m: s)
        """)
    plugins = get_plugins([plugin, plugin2, plugin3], warn=False)
    messages = {e.plugin: e.message for e in plugins.errors}
    assert "pass 'wrong_stage' has unknown stage 'ast'" in messages[str(plugin)]
    assert "pass 'two_args' (stage 'ir') must accept (ir)" in messages[str(plugin2)]
    assert f"pass 'ok' is already registered by plugin {plugin}" in messages[str(plugin3)]
    assert plugins.passes["ok"].origin == str(plugin)


def test_a_broken_default_pass_is_skipped_with_a_warning(tmp_path):
    plugin = _plugin_file(tmp_path, "bad_default", """
        def boom(ir):
            raise RuntimeError("always broken")

        @flexsn_dsl.hookimpl
        def flexsn_dsl_register_passes(registry):
            registry.register("boom", stage="ir", function=boom, default=True)
        """)
    text = _probe("sigmoid", "probe_default")
    with pytest.warns(UserWarning, match=f"plugin {re.escape(str(plugin))}: .*'boom'.*a default pass: skipped"):
        neuron = flexsn_dsl.loads(text, plugins=[plugin], backend="torch")
    assert _grad(neuron, X64).shape == X64.shape
    with pytest.raises(flexsn_dsl.PluginError, match="always broken"):  # asked for by name: an error
        flexsn_dsl.loads(text.replace("probe_default", "probe_default2"), plugins=[plugin], passes=["boom"])


def test_cache_key_follows_the_plugin_code(tmp_path):
    """Editing a plugin's pass or surrogate formula changes the generated module's key."""
    plugin = tmp_path / "edit_me.py"
    template = """
import flexsn_dsl

def tag(source, module_name):
    return source + "# TAG\\n"

@flexsn_dsl.hookimpl
def flexsn_dsl_register_surrogates(registry):
    registry.register("editable", gradient="GRADIENT")

@flexsn_dsl.hookimpl
def flexsn_dsl_register_passes(registry):
    registry.register("tag", stage="source", function=tag)
"""
    keys = set()
    for gradient, tag in (("1", "one"), ("2", "one"), ("2", "two")):
        plugin.write_text(template.replace("GRADIENT", gradient).replace("TAG", tag))
        clear_cache()
        compiled = compile_spec(text=_probe("editable", "probe_edit"), plugins=[plugin], passes=["tag"])
        keys.add(compiled.key)
        assert compiled.triton_source.endswith(f"# {tag}\n")
    assert len(keys) == 3
