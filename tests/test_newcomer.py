"""A newcomer follows the README word for word: every `flexsn-dsl` command of its ```bash blocks (and of
docs/cli.md's examples) and every ```python block runs as written, from a folder holding the bundled
neurons, and prints what the text says it prints (a ```text block right after a Python block, a
`# torch.Size(...)` comment on a print, the `#   ...` lines after a command); and `flexsn-dsl simulate`
shows every zoo neuron spike with its defaults. `bench` commands are parsed, not run (timings sized for a GPU). The commands and code are read from the docs, never
copied here, so the docs cannot drift from what runs. (The set-up's `pip install` is CI's own step.)"""
from __future__ import annotations

import contextlib
import io
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
import torch

from flexsn_dsl.cli import _parser, main

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w*)\n(.*?)^```\n", re.S | re.M)
PRINTED = re.compile(r"^print\((.*)\)\s+# (torch\.Size\(\[[^]]*\]\))", re.M)


def _blocks(path: Path, language: str) -> list[tuple[int, str, str]]:
    """(line, code, the ```text block right after it or '') for every ```language block of ``path``."""
    text = path.read_text()
    fences = list(FENCE.finditer(text))
    out = []
    for i, m in enumerate(fences):
        if m.group(1) == language:
            following = fences[i + 1] if i + 1 < len(fences) else None
            shown = following.group(2) if following is not None and following.group(1) == "text" and \
                text[m.end():following.start()].strip() == "" else ""
            out.append((text[:m.start()].count("\n") + 1, m.group(2), shown))
    return out


def _commands(path: Path) -> list:
    """Each `flexsn-dsl ...` command of the ```bash blocks (the last part of a `... && flexsn-dsl ...` line
    too), with the `#   ...` output lines written under it."""
    out = []
    for line_no, code, _ in _blocks(path, "bash"):
        lines = code.splitlines()
        for i, line in enumerate(lines):
            command = line.split("&&")[-1].split(" #")[0].strip()
            if not command.startswith("flexsn-dsl "):
                continue
            shown = []
            for later in lines[i + 1:]:
                if not later.startswith("#   "):
                    break
                shown.append(later[4:].strip())
            out.append(pytest.param(command, shown, id=f"{path.name}:{line_no + i + 1}"))
    return out


@pytest.fixture
def newcomer_folder(tmp_path, monkeypatch):
    """A folder with the bundled neurons (as a checkout has them), the files docs/cli.md's examples read
    (drive.npy, my_surrogates.py: the README's plugin), as the working directory."""
    (tmp_path / "neurons").symlink_to(ROOT / "neurons", target_is_directory=True)
    np.save(tmp_path / "drive.npy", np.linspace(0.0, 2.0, 50))
    plugin = next(code for _, code, _ in _blocks(ROOT / "README.md", "python") if "hookimpl" in code)
    (tmp_path / "my_surrogates.py").write_text(plugin)
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("command, shown", _commands(ROOT / "README.md") + _commands(ROOT / "docs" / "cli.md"))
def test_the_commands_run_as_written(command, shown, newcomer_folder, capsys):
    argv = shlex.split(command)[1:]
    if argv[0] == "bench":  # a timing run sized for a GPU: its options are checked, not timed here
        args = _parser().parse_args(argv)
        assert all(Path(spec).is_file() for spec in args.specs)
        return
    assert main(argv) == 0, capsys.readouterr().err
    printed = [line.strip() for line in capsys.readouterr().out.splitlines()]
    assert [line for line in shown if line not in printed] == []


@pytest.mark.parametrize("code, shown", [pytest.param(code, shown, id=f"README.md:{line}")
                                         for line, code, shown in _blocks(ROOT / "README.md", "python")])
def test_the_python_blocks_run_as_written(code, shown, newcomer_folder):
    if "nir" in code:
        pytest.importorskip("nir")
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    printed = out.getvalue()
    if shown and torch.get_default_device().type == "cpu":  # (a GPU draws other random numbers)
        assert printed == shown
    for expected in (m.group(2) for m in PRINTED.finditer(code)):
        assert expected in printed.splitlines(), printed


@pytest.mark.parametrize("spec", sorted((ROOT / "neurons").glob("*.yaml")), ids=lambda p: p.stem)
def test_every_zoo_neuron_spikes_with_its_defaults(spec, newcomer_folder, capsys):
    """`flexsn-dsl simulate neurons/X.yaml`, nothing more: spikes (a read-out neuron has no spike output)."""
    assert main(["simulate", f"neurons/{spec.name}", "--seed", "0"]) == 0
    out = capsys.readouterr().out
    assert "hint:" not in out, out
    count = re.search(r"^spikes \(\w+\): (\d+),", out, re.M)
    assert (count is not None and int(count.group(1)) > 0) or "no spike output" in out, out
