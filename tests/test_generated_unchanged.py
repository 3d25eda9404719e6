"""The generated Triton module and torch step of every zoo spec, hashed against the stored list
tests/generated_hashes.json: generated code changes only on purpose, never as a side effect of
moving code around. After a deliberate change of the generated code, rewrite the list with
``PYTHONPATH=. python tests/test_generated_unchanged.py`` and say why in the commit."""
from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
STORED = Path(__file__).with_name("generated_hashes.json")
ZOO = sorted((ROOT / "neurons").glob("*.yaml"))


def _digest(text: str) -> str:
    """sha256 of generated text without its cache-key line (the key hashes the package's own source)."""
    body = "\n".join(line for line in text.splitlines() if not line.startswith("# Cache key:"))
    return hashlib.sha256(body.encode()).hexdigest()


def generated_hashes() -> dict[str, dict[str, str]]:
    import sympy

    from flexsn_dsl.compiler import compile_spec
    out = {"sympy": {"version": sympy.__version__}}  # sympy's simplifications shape the printed code
    for path in ZOO:
        compiled = compile_spec(path)
        out[path.stem] = {"triton": _digest(compiled.triton_source), "torch": _digest(compiled.torch_source)}
    return out


@pytest.mark.parametrize("spec", [p.stem for p in ZOO])
def test_generated_code_is_as_stored(spec):
    import sympy
    stored = json.loads(STORED.read_text())
    if stored["sympy"]["version"] != sympy.__version__:
        pytest.skip(f"the hashes were stored with sympy {stored['sympy']['version']}, this is sympy {sympy.__version__}")
    assert spec in stored, f"{spec} has no stored hashes: run PYTHONPATH=. python {Path(__file__).name}"
    from flexsn_dsl.compiler import compile_spec
    compiled = compile_spec(ROOT / "neurons" / f"{spec}.yaml")
    got = {"triton": _digest(compiled.triton_source), "torch": _digest(compiled.torch_source)}
    assert got == stored[spec], (f"the generated code of {spec} changed; if on purpose, run "
                                 f"PYTHONPATH=. python tests/{Path(__file__).name}")


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    STORED.write_text(json.dumps(generated_hashes(), indent=1, sort_keys=True) + "\n")
    print(f"wrote {STORED.relative_to(ROOT)}")
