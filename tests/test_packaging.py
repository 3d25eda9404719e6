"""Packaging: Triton only where it has wheels, the optional extras, a wheel that ships LICENSE and
py.typed, and a clear error for backend="triton" where Triton is not installed."""
from __future__ import annotations

import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
tomllib = pytest.importorskip("tomllib")  # Python >= 3.11
requirements = pytest.importorskip("packaging.requirements")  # in the dev extra


def _project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def test_triton_is_required_on_linux_only():
    deps = {r.name: r for r in map(requirements.Requirement, _project()["project"]["dependencies"])}
    assert {"torch", "sympy", "pyyaml", "pluggy", "numpy", "triton"} <= set(deps)
    triton = deps["triton"]
    assert triton.marker is not None
    for system, wanted in (("Linux", True), ("Darwin", False), ("Windows", False)):
        assert triton.marker.evaluate({"platform_system": system}) is wanted
    assert all(r.marker is None for name, r in deps.items() if name != "triton")


def test_extras():
    extras = _project()["project"]["optional-dependencies"]
    names = {k: {requirements.Requirement(r).name for r in v} for k, v in extras.items()}
    assert names["plot"] == {"matplotlib"}
    assert {"pytest", "matplotlib", "scikit-learn"} <= names["dev"]


def test_the_wheel_ships_license_py_typed_and_the_marker(tmp_path):
    assert "MIT License" in (ROOT / "LICENSE").read_text()
    assert "## Unreleased" in (ROOT / "CHANGELOG.md").read_text()
    # an isolated build, as `pip install` does: a fresh venv has no `wheel` package for --no-build-isolation
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "-q", "-w", str(tmp_path), str(ROOT)],
                          capture_output=True, text=True, timeout=300, cwd=tmp_path)
    if proc.returncode != 0 and "No matching distribution found" in proc.stderr:
        pytest.skip(f"no package index to get the build backend from: {proc.stderr.strip()[-200:]}")
    assert proc.returncode == 0, proc.stderr
    (wheel,) = tmp_path.glob("flexsn_dsl-*.whl")
    with zipfile.ZipFile(wheel) as zf:
        names = zf.namelist()
        assert "flexsn_dsl/py.typed" in names
        assert "flexsn_dsl/simulation.py" in names
        assert {"flexsn_dsl/model/__init__.py", "flexsn_dsl/model/build.py", "flexsn_dsl/nir/read.py"} <= set(names)
        assert any(n.endswith(".dist-info/licenses/LICENSE") or n.endswith(".dist-info/LICENSE") for n in names)
        metadata = zf.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
    triton = [line for line in metadata.splitlines() if line.startswith("Requires-Dist: triton")]
    assert len(triton) == 1 and 'platform_system == "Linux"' in triton[0], triton
    assert any(line.startswith("Requires-Dist: matplotlib") and 'extra == "plot"' in line
               for line in metadata.splitlines())


WITHOUT_TRITON = """
import sys, warnings
sys.modules["triton"] = None  # as on a platform without Triton wheels: `import triton` fails
import torch, flexsn_dsl
try:
    flexsn_dsl.load("neurons/lif.yaml", backend="triton")
except ImportError as exc:
    print("ERROR", type(exc).__name__, isinstance(exc, flexsn_dsl.MissingDependency), exc)
x = torch.rand(6, 4, generator=torch.Generator().manual_seed(0)) * 3
with warnings.catch_warnings():
    warnings.simplefilter("error")  # CPU tensors: "auto" takes torch without a word
    auto = flexsn_dsl.load("neurons/lif.yaml")(x)
ref = flexsn_dsl.load("neurons/lif.yaml", backend="torch")(x)
print("SAME", bool(torch.equal(auto, ref)), int(ref.sum()), flexsn_dsl.load("neurons/lif.yaml").info.neuron)
"""


def test_without_triton_backend_triton_says_how_to_get_it_and_torch_works(tmp_path):
    env = {**os.environ, "FLEXSN_DSL_CACHE": str(tmp_path / "cache"), "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", WITHOUT_TRITON], cwd=ROOT, env=env, capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    error = next(line for line in proc.stdout.splitlines() if line.startswith("ERROR"))
    assert "MissingDependency True" in error and "pip install triton" in error and "backend='torch'" in error
    same = next(line for line in proc.stdout.splitlines() if line.startswith("SAME")).split()
    assert same[1] == "True" and int(same[2]) > 0 and same[3] == "lif"
