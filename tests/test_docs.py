"""The docs say what the code does.

- Generated blocks (``<!-- BEGIN GENERATED name ... -->`` … ``<!-- END GENERATED name -->``) equal
  what the code produces now: the surrogate table from the plugin registry, the zoo from
  ``neurons/*.yaml``, the CLI reference from the argparse parser. Refresh them with
  ``PYTHONPATH=. python tests/test_docs.py``.
- Every ```` ```yaml spec ```` block loads; every ```` ```yaml error ```` block fails with exactly
  the error in the ```` ```text ```` block after it.
"""
from __future__ import annotations

import contextlib
import io
import os
import re
import sys
from pathlib import Path

import pytest
import torch
import yaml

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / "docs"
GENERATED = re.compile(r"(<!-- BEGIN GENERATED (\w+)[^\n]*-->\n)(.*?)(<!-- END GENERATED \2 -->)", re.S)
FENCE = re.compile(r"^```([^\n]*)\n(.*?)^```\n", re.S | re.M)


# -- generated blocks ------------------------------------------------------------------------
def surrogates_block() -> str:
    """The built-in surrogates as registered (names, defaults, where from), with their formulas."""
    from flexsn_dsl.builtin_surrogates import CATALOGUE
    from flexsn_dsl.plugins import get_plugins
    registered = {s.name: s for s in get_plugins(()).surrogates.values() if s.origin == "flexsn_dsl.builtin_surrogates"}
    assert set(registered) == set(CATALOGUE)
    rows = ["| name | parameters (defaults) | g(x) | from |", "|---|---|---|---|"]
    for name in sorted(registered):
        s = registered[name]
        params = ", ".join(f"{k}={v:g}" for k, v in s.params.items()) or "none"
        rows.append(f"| `{name}` | {params} | `{CATALOGUE[name][0]}` | {s.description} |")
    return "\n".join(rows) + "\n"


def _zoo() -> list[tuple[Path, dict]]:
    return [(p, yaml.safe_load(p.read_text())) for p in sorted((ROOT / "neurons").glob("*.y*ml"))]


def zoo_block() -> str:
    """A table of the bundled neurons, then each one's description (its source)."""
    rows = ["| neuron | file | inputs | states | learnable | surrogate |", "|---|---|---|---|---|---|"]
    details = []
    for path, spec in _zoo():
        params = spec.get("parameters") or {}
        learnable = [k for k, v in params.items() if isinstance(v, dict) and v.get("learnable")]
        surrogate = spec.get("surrogate", "sigmoid")
        if isinstance(surrogate, dict):
            args = ", ".join(f"{k}={v:g}" for k, v in surrogate.items() if k != "name")
            surrogate = f"{surrogate['name']}({args})"
        name = spec["neuron"]
        rows.append(f"| [`{name}`](#{name}) | [`neurons/{path.name}`](../neurons/{path.name}) | "
                    f"{', '.join(spec.get('inputs', ['x']))} | {', '.join(spec['states'])} | "
                    f"{', '.join(learnable) or '-'} | {surrogate} |")
        details.append(f"### {name}\n\n{' '.join(spec.get('description', '').split())}\n")
    return "\n".join(rows) + "\n\n" + "\n".join(details)


def cli_block() -> str:
    """Every command's --help, as argparse prints it at 100 columns."""
    from flexsn_dsl.cli import _parser
    old = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = "100"
    try:
        parser = _parser()
        sub = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
        parts = [f"```text\n{parser.format_help()}```\n"]
        for name, p in sub.choices.items():
            parts.append(f"### `flexsn-dsl {name}`\n\n```text\n{p.format_help()}```\n")
    finally:
        if old is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = old
    return "\n".join(parts)


BLOCKS = {"surrogates": surrogates_block, "zoo": zoo_block, "cli": cli_block}


def _blocks_in(text: str) -> dict[str, str]:
    return {m.group(2): m.group(3) for m in GENERATED.finditer(text)}


def refresh() -> list[Path]:
    """Rewrite every generated block in docs/; returns the files that changed."""
    changed = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        new = GENERATED.sub(lambda m: m.group(1) + BLOCKS[m.group(2)]() + m.group(4), text)
        if new != text:
            path.write_text(new)
            changed.append(path)
    return changed


@pytest.mark.parametrize("name", sorted(BLOCKS))
def test_generated_blocks_are_up_to_date(name):
    found = [(path, block) for path in sorted(DOCS.glob("*.md")) for n, block in _blocks_in(path.read_text()).items()
             if n == name]
    assert found, f"no generated block {name!r} in docs/"
    wanted = BLOCKS[name]()
    for path, block in found:
        assert block == wanted, f"{path.name}: block {name!r} is stale: run PYTHONPATH=. python tests/test_docs.py"


def test_the_function_table_lists_every_function_of_the_language():
    from flexsn_dsl.expressions import DSL_FUNCTIONS
    text = (DOCS / "language.md").read_text()
    table = text[text.index("<!-- functions:"):text.index("\n\n", text.index("<!-- functions:"))]
    documented = set(re.findall(r"`(\w+)\(", "\n".join(line.split("|")[1] for line in table.splitlines()[3:])))
    assert documented == set(DSL_FUNCTIONS)


# -- examples ------------------------------------------------------------------------------------
def _examples():
    """(id, kind, options, yaml text, expected error text or None) for every marked block."""
    out = []
    for path in sorted(DOCS.glob("*.md")):
        text = path.read_text()
        fences = list(FENCE.finditer(text))
        for i, m in enumerate(fences):
            info = m.group(1).split()
            if len(info) < 2 or info[0] != "yaml" or info[1] not in ("spec", "error"):
                continue
            options = dict(o.split("=", 1) for o in info[2:])
            expected = None
            if info[1] == "error" and i + 1 < len(fences) and fences[i + 1].group(1).strip() == "text" \
                    and text[m.end():fences[i + 1].start()].strip() == "":
                expected = fences[i + 1].group(2)
            line = text[:m.start()].count("\n") + 1
            out.append(pytest.param(info[1], options, m.group(2), expected, id=f"{path.name}:{line}"))
    return out


def _load(text: str, options: dict):
    import flexsn_dsl
    kwargs = {}
    if "sizes" in options:
        kwargs["sizes"] = {k: int(v) for k, v in (item.split(":") for item in options["sizes"].split(","))}
    return flexsn_dsl.loads(text, filename="spec.yaml", backend="torch", **kwargs)


@pytest.mark.parametrize("kind, options, text, expected", _examples())
def test_doc_examples(kind, options, text, expected):
    import flexsn_dsl
    if kind == "spec":
        m = _load(text, options)
        assert m.spec.name == yaml.safe_load(text)["neuron"]
        return
    with pytest.raises(flexsn_dsl.SpecError) as info:
        _load(text, options)
    got = info.value.format()
    assert got.startswith("spec.yaml:") and info.value.line is not None, got
    assert expected is not None, "an error example is followed by the text of its error"
    assert got == expected.rstrip("\n"), got


def test_every_error_example_states_its_error():
    kinds = [p.values for p in _examples()]
    errors = [v for v in kinds if v[0] == "error"]
    assert len(errors) >= 25
    assert all(expected is not None for _, _, _, expected in errors)


def test_the_error_format_in_the_docs_is_what_check_prints(tmp_path, monkeypatch, capsys):
    """The catalogue shows what `flexsn-dsl check` prints: the same text as SpecError.format()."""
    from flexsn_dsl.cli import main
    (tmp_path / "spec.yaml").write_text("neuron: lif\nstates: {v: 0.0}\n")
    monkeypatch.chdir(tmp_path)
    assert main(["check", "spec.yaml"]) == 1
    err = capsys.readouterr().err
    text = (DOCS / "language.md").read_text()
    assert err.strip() in text


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    commands = [line for line in readme.splitlines() if line.startswith("python -m venv") and "pytest" in line]
    assert len(commands) == 1
    assert commands[0] in (ROOT / ".ci" / "run").read_text().splitlines()


def test_the_readme_tutorial_trains_visibly(monkeypatch, capsys):
    """The README's LIF tutorial runs as written: the rate it prints rises to the target and the loss falls
    tenfold; on the CPU it prints exactly the numbers the README shows."""
    readme = (ROOT / "README.md").read_text()
    code = next(b for b in re.findall(r"```python\n(.*?)```", readme, re.S) if "lif.reset()" in b)
    shown = re.search(r"```text\n(step  0 .*?)```", readme, re.S).group(1)
    monkeypatch.chdir(ROOT)
    exec(compile(code, "README.md", "exec"), {})
    printed = capsys.readouterr().out
    rows = [line.split() for line in printed.splitlines()]
    rates, losses = [float(r[3]) for r in rows], [float(r[5]) for r in rows]
    assert len(rows) == 4 and rates[0] < 0.05 and rates[-1] > 0.15 and losses[-1] < losses[0] / 5, printed
    if torch.get_default_device().type == "cpu":
        assert printed == shown


def test_the_readme_links_resolve():
    for path in [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted(DOCS.glob("*.md"))]:
        for target in re.findall(r"\]\(([^)#:]+)(?:#[^)]*)?\)", path.read_text()):
            assert (path.parent / target).exists(), f"{path.name}: broken link {target}"


def test_benchmarks_readme_lists_every_script_and_results_are_data():
    """benchmarks/README.md has a row for every script in benchmarks/; benchmarks/results/ holds only data named
    <device>-<what>-<YYYY-MM-DD>[-<label>].{log,json,jsonl}."""
    bench = ROOT / "benchmarks"
    readme = (bench / "README.md").read_text()
    scripts = sorted(p.name for p in bench.iterdir() if p.suffix in (".py", ".sh"))
    assert scripts and [s for s in scripts if f"]({s})" not in readme] == []
    name = re.compile(r"[a-z0-9]+-[a-z0-9-]+-\d{4}-\d{2}-\d{2}(-[a-z0-9-]+)?\.(log|json|jsonl)")
    assert [p.name for p in (bench / "results").iterdir() if not name.fullmatch(p.name)] == []


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    with contextlib.redirect_stderr(io.StringIO()):
        changed = refresh()
    print("\n".join(f"updated {p.relative_to(ROOT)}" for p in changed) or "docs/ generated blocks are up to date")
