"""The ``flexsn-dsl`` command line, run as users run it: a separate process.

Each subprocess costs a second or two (torch is imported), so several specs go to one
``check`` call; the per-option sweeps call ``flexsn_dsl.cli.main`` in-process.
"""
from __future__ import annotations

import argparse
import ast
import importlib.util
import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from flexsn_dsl import triton_runtime
from flexsn_dsl.cli import KERNEL_CHOICES, main

ROOT = Path(__file__).resolve().parents[1]
NEURONS = ROOT / "neurons"
SPECS = sorted([*NEURONS.glob("*.yaml"), *NEURONS.glob("*.yml")])
NAMES = [yaml.safe_load(p.read_text())["neuron"] for p in SPECS]
SUBCOMMANDS = ("check", "build", "show", "simulate", "plugins", "bench")


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FLEXSN_DSL_")}
    env["FLEXSN_DSL_CACHE"] = str(tmp_path / "cache")
    return env


def run(tmp_path: Path, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "flexsn_dsl", *map(str, args)], cwd=ROOT, env=_env(tmp_path),
                          capture_output=True, text=True, timeout=timeout)


def _takewhile_indented(lines):
    for line in lines:
        if not line.startswith(" "):
            return
        yield line


def no_traceback(proc: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in proc.stderr + proc.stdout, proc.stderr
    assert "internal error" not in proc.stderr, proc.stderr


# --------------------------------------------------------------------------
# check
# --------------------------------------------------------------------------
def test_check_reports_every_bad_spec_with_file_line_and_column(tmp_path):
    pwned = tmp_path / "PWNED"
    specs = {
        # name: (text, line, col, message)
        "unknown_name.yaml": ("neuron: n\nstates: {v: 0}\nstep:\n  s: spike(vv)\n", 4, 12, "did you mean 'v'"),
        "assigned_twice.yaml": ("neuron: n\nstates: {v: 0}\nstep:\n  s: spike(v)\n  v: 1\n  v: 2\n", 6, 3,
                                "'v' is assigned twice"),
        "evil.yaml": (f'neuron: !!python/object/apply:os.system ["touch {pwned}"]\n', 1, 9, "not allowed"),
        "yaml_syntax.yaml": ("neuron: n\nstates: {v: 0\nstep:\n  s: spike(x)\n", 3, 5, "YAML syntax error"),
        "empty.yaml": ("", 1, 1, "the spec is empty"),
        "deep.yaml": ("neuron: n\nstates: {v: 0}\nstep:\n  s: " + "(" * 5000 + "x" + ")" * 5000 + "\n", 4, 6,
                      "more than the limit"),
        "tab.yml": ("neuron: n\nstates:\n\tv: 0\n", 3, 1, "tab"),
        "unknown_surrogate.yaml": ("neuron: n\nstates: {v: 0}\nstep: {s: spike(x)}\nsurrogate: atn\n", 4, 12,
                                   "did you mean 'atan'"),
    }
    for name, (text, *_rest) in specs.items():
        (tmp_path / name).write_text(text)
    (tmp_path / "binary.yaml").write_bytes(b"neuron: n\n\xff\n")
    (tmp_path / "good.yaml").write_text("neuron: good\nstates: {v: 0}\nstep:\n  s: spike(v + x - 1)\n")
    (tmp_path / "empty_folder").mkdir()
    missing = tmp_path / "missing.yaml"

    proc = run(tmp_path, "check", *[tmp_path / n for n in specs], tmp_path / "binary.yaml",
               tmp_path / "good.yaml", missing, tmp_path / "empty_folder")
    assert proc.returncode == 1, proc.stderr
    no_traceback(proc)
    for name, (_text, line, col, message) in specs.items():
        head = f"{tmp_path / name}:{line}:{col}: error: "
        assert head in proc.stderr, f"{head}\n{proc.stderr}"
        rest = proc.stderr.split(head, 1)[1].splitlines()  # the message, then its indented lines
        block = "\n".join([rest[0]] + [line for line in _takewhile_indented(rest[1:])])
        assert message in block and "hint: " in block, block
    assert f"{tmp_path / 'binary.yaml'} is not UTF-8" in proc.stderr
    assert f"{missing} does not exist" in proc.stderr
    assert f"no *.yaml or *.yml spec files in folder {tmp_path / 'empty_folder'}" in proc.stderr
    assert f"ok  {tmp_path / 'good.yaml'}  neuron good" in proc.stdout  # the good one is still checked
    assert proc.stdout.count("ok  ") == 1
    assert not pwned.exists()


def test_check_the_zoo(tmp_path):
    proc = run(tmp_path, "check", "neurons/")
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    for path, name in zip(SPECS, NAMES):
        assert f"ok  {path.relative_to(ROOT)}  neuron {name}:" in proc.stdout


def test_check_needs_neither_torch_nor_triton(tmp_path):
    """`check` parses, validates and derives, without importing the runtime (it is what makes it fast)."""
    code = ("import sys\nfrom flexsn_dsl.cli import main\n"
            f"code = main(['check', {str(NEURONS / 'hh.yaml')!r}, {str(NEURONS / 'lif.yaml')!r}])\n"
            "print(code, sorted(m for m in ('torch', 'triton') if m in sys.modules))\n")
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env=dict(os.environ, FLEXSN_DSL_CACHE=str(tmp_path)))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines()[-1] == "0 []"
    assert "ok  " in proc.stdout and "neuron hh:" in proc.stdout


# --------------------------------------------------------------------------
# build
# --------------------------------------------------------------------------
def test_build_the_zoo(tmp_path):
    out = tmp_path / "out"
    proc = run(tmp_path, "build", "neurons/", "-o", out)
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    assert f"{len(SPECS)} built, 0 failed" in proc.stderr
    rows = {line.split()[1]: line for line in proc.stdout.splitlines()[2:] if line.strip()}
    assert sorted(rows) == sorted(NAMES), proc.stdout  # the summary lists every neuron, once
    assert all(line.split()[0] == str(p.relative_to(ROOT)) for p, line in zip(SPECS, proc.stdout.splitlines()[2:]))
    for name in NAMES:
        kernels, torch_step, info = out / f"{name}.py", out / f"{name}_torch.py", out / f"{name}.info.json"
        assert str(kernels) in rows[name]
        for source in (kernels, torch_step):
            ast.parse(source.read_text(), str(source))
        assert json.loads(info.read_text())
        assert f"def {name}_forward_kernel" in kernels.read_text()
    for name in NAMES:  # the generated modules import (Triton kernels run in the interpreter on the CPU)
        for path in (out / f"{name}.py", out / f"{name}_torch.py"):
            spec = importlib.util.spec_from_file_location(f"built_{path.stem}", path)
            spec.loader.exec_module(importlib.util.module_from_spec(spec))
    assert sorted(p.name for p in out.iterdir()) == sorted(
        f"{n}{suffix}" for n in NAMES for suffix in (".py", "_torch.py", ".info.json"))


def test_build_refuses_two_specs_with_one_name_and_a_bad_output_folder(tmp_path, capsys):
    folder = tmp_path / "specs"
    folder.mkdir()
    for name in ("a.yaml", "b.yaml"):
        (folder / name).write_text((NEURONS / "lif.yaml").read_text())
    assert main(["build", str(folder), "-o", str(tmp_path / "out")]) == 1
    out, err = capsys.readouterr()
    assert f"{folder / 'b.yaml'}:1:1: error: neuron 'lif' is also built from {folder / 'a.yaml'}" in err
    assert "1 built, 1 failed" in err
    table = [line.split() for line in out.splitlines()[2:]]
    assert table[0][:2] == [str(folder / "a.yaml"), "lif"] and "FAILED" not in out.splitlines()[2]
    assert table[1][:2] == [str(folder / "b.yaml"), "-"] and "FAILED (error above)" in out.splitlines()[3]
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert main(["build", str(NEURONS / "lif.yaml"), "-o", str(blocker)]) == 1
    assert f"cannot create the output folder {blocker}" in capsys.readouterr().err


def test_build_and_check_of_missing_things(tmp_path, capsys):
    assert main(["build", str(tmp_path / "nope.yaml"), "-o", str(tmp_path / "out")]) == 1
    err = capsys.readouterr().err
    assert "nope.yaml does not exist" in err and "0 built, 1 failed" in err
    assert not (tmp_path / "out").exists()
    assert main(["check", str(NEURONS / "liff.yaml")]) == 1
    assert f"hint: did you mean {NEURONS / 'lif.yaml'}?" in capsys.readouterr().err
    assert main(["check", str(NEURONS / "lif.yaml"), "--param", "tau"]) == 1
    assert "is not NAME=NUMBER" in capsys.readouterr().err


# --------------------------------------------------------------------------
# show
# --------------------------------------------------------------------------
def test_show_a_kernel(tmp_path):
    proc = run(tmp_path, "show", "neurons/lif.yaml", "--kernel", "forward")
    assert proc.returncode == 0, proc.stderr
    no_traceback(proc)
    assert proc.stdout.startswith("@triton.jit\ndef lif_forward_kernel(")
    ast.parse(proc.stdout)


@pytest.mark.parametrize("kernel", KERNEL_CHOICES)
def test_show_every_kernel_choice(kernel, capsys):
    """Every choice prints (plastic: a synapse spec's fused kernel driving alif)."""
    alif = str(NEURONS / "alif.yaml")
    spec = [str(Path(__file__).parent / "specs" / "stdp_pair.yaml"), "--neuron", alif] if kernel == "plastic" else [alif]
    assert main(["show", *spec, "--kernel", kernel]) == 0
    out = capsys.readouterr().out
    assert out.strip()
    if kernel == "info":
        assert json.loads(out)["neuron"] == "alif"
    elif kernel == "model":  # the summary, not the generated source
        assert out.startswith("neuron alif (") and "  step:\n" in out and "import torch" not in out
    else:
        ast.parse(out)


def test_show_a_bad_spec(tmp_path, capsys):
    spec = tmp_path / "bad.yaml"
    spec.write_text("neuron: n\nstates: {v: 0}\nstep:\n  s: spike(vv)\n")
    assert main(["show", str(spec), "--kernel", "forward"]) == 1
    assert f"{spec}:4:12: error: unknown name 'vv'" in capsys.readouterr().err


# --------------------------------------------------------------------------
# help
# --------------------------------------------------------------------------
def test_help(tmp_path):
    proc = run(tmp_path, "--help")
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    for sub in SUBCOMMANDS:
        assert sub in proc.stdout
    # every subcommand's --help, through the real entry point in one process
    script = (
        "import contextlib, io, json\n"
        "from flexsn_dsl.cli import main\n"
        "results = {}\n"
        f"for sub in {SUBCOMMANDS!r}:\n"
        "    out = io.StringIO()\n"
        "    with contextlib.redirect_stdout(out):\n"
        "        try:\n"
        "            main([sub, '--help'])\n"
        "            code = None\n"
        "        except SystemExit as exc:\n"
        "            code = exc.code\n"
        "    results[sub] = [code, out.getvalue()]\n"
        "print(json.dumps(results))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=_env(tmp_path), capture_output=True,
                          text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    results = json.loads(proc.stdout)
    for sub in SUBCOMMANDS:
        code, text = results[sub]
        assert code == 0, (sub, text)
        assert text.startswith(f"usage: flexsn-dsl {sub}"), text
        assert "--plugin" in text
    for sub in ("check", "build"):
        assert "PATH" in results[sub][1] and "--param" in results[sub][1]
    assert "--out" in results["build"][1]
    assert "--kernel" in results["show"][1] and "forward_core" in results["show"][1]


def test_no_command_prints_usage(capsys):
    assert main([]) == 2
    assert "usage: flexsn-dsl" in capsys.readouterr().out
    with pytest.raises(SystemExit) as info:
        main(["--version"])
    assert info.value.code == 0
    assert capsys.readouterr().out.startswith("flexsn-dsl ")
    with pytest.raises(SystemExit) as info:
        main(["show", str(NEURONS / "lif.yaml"), "--kernel", "nope"])
    assert info.value.code == 2
    assert "invalid choice" in capsys.readouterr().err


# --------------------------------------------------------------------------
# bench options
# --------------------------------------------------------------------------
def _bench_errors(tmp_path: Path) -> list[tuple[list[str], str]]:
    (tmp_path / "text.json").write_text("not json\n")
    (tmp_path / "object.json").write_text('{"runs": []}\n')
    (tmp_path / "binary.json").write_bytes(b"\xff\xfe[]")
    return [
        (["--device", "foo"], "--device 'foo' is not cuda, cuda:N, cpu or auto"),
        (["--device", "meta"], "--device 'meta' is not cuda, cuda:N, cpu or auto"),
        (["--device", ""], "--device '' is not cuda"),
        (["--device", "cuda:999"], "--device 'cuda:999': "),
        (["-n", "-5"], "-n/--neurons -5: give whole numbers of at least 1"),
        (["-n", "64", "0"], "-n/--neurons 0: give whole numbers of at least 1"),
        (["-T", "0"], "-T/--steps 0: give whole numbers of at least 1"),
        (["-T", "4", "-2"], "-T/--steps -2: give whole numbers of at least 1"),
        (["--compile-max-T", "-1"], "--compile-max-T -1: give a whole number of at least 0"),
        (["--rounds", "0"], "--rounds 0: give a whole number of at least 1"),
        (["--json", str(tmp_path / "text.json")], "(invalid JSON at line 1, column 1)"),
        (["--json", str(tmp_path / "binary.json")], "(not UTF-8)"),
        (["--json", str(tmp_path / "object.json")], "holds a JSON object, not the list of runs bench writes"),
        (["--json", str(tmp_path)], "is not a JSON file bench can append to"),
        (["--json", str(tmp_path / "missing" / "out.json")], "does not exist"),
        (["--long", "-T", "500"], "--long sets the steps and neurons of its cases itself: leave out -T, -n and --shape"),
        (["--long", "--shape", "2", "8"], "--long sets the steps and neurons"),
    ]


def test_bench_refuses_bad_options_in_one_line_before_any_work(tmp_path, capsys):
    for options, message in _bench_errors(tmp_path):
        assert main(["bench", str(NEURONS / "lif.yaml"), *options]) == 2, options
        out, err = capsys.readouterr()
        assert out == "", options  # nothing was timed
        assert err.count("\n") == 1 and err.startswith("flexsn-dsl bench: error: ") and message in err, err
    assert (tmp_path / "text.json").read_text() == "not json\n"  # a file bench cannot read is left alone


def test_bench_refuses_cpu_where_triton_compiles_for_the_gpu(monkeypatch, capsys):
    """On a GPU machine Triton's interpreter is off: --device cpu cannot run our kernels, and says so."""
    monkeypatch.setattr(triton_runtime, "interpreting", lambda: False)
    assert main(["bench", str(NEURONS / "lif.yaml"), "--device", "cpu"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err == ("flexsn-dsl bench: error: --device 'cpu': our kernels run on CPU tensors only in "
                                 "Triton's interpreter, which is off in this process (a GPU is present): give --device "
                                 "cuda, or run with TRITON_INTERPRET=1\n")


def test_bench_refuses_a_bad_option_as_a_process(tmp_path):
    proc = run(tmp_path, "bench", "neurons/lif.yaml", "-n", "-5")
    assert proc.returncode == 2 and proc.stdout == ""
    no_traceback(proc)
    assert proc.stderr == "flexsn-dsl bench: error: -n/--neurons -5: give whole numbers of at least 1\n"


def test_bench_honours_plugins_and_params(tmp_path, capsys):
    plugin = tmp_path / "tri.py"
    plugin.write_text("import flexsn_dsl\n\n\n@flexsn_dsl.hookimpl\ndef flexsn_dsl_register_surrogates(registry):\n"
                      "    registry.register('bench_tri', gradient='alpha * Max(0, 1 - alpha * Abs(x))', "
                      "params={'alpha': 1.0})\n")
    spec = tmp_path / "tri.yaml"
    spec.write_text((NEURONS / "lif.yaml").read_text().replace("{name: sigmoid, alpha: 4.0}", "bench_tri"))
    options = ["bench", str(spec), "-T", "2", "-n", "16", "--peers", "torch", "--mode", "inference"]
    assert main(options) == 1  # the spec needs the plugin
    assert "bench_tri" in capsys.readouterr().err
    assert main([*options, "--plugin", str(plugin), "--param", "nope=1"]) == 1  # --param reaches the spec
    assert "'nope', which is not a parameter of 'lif'" in capsys.readouterr().err
    out = tmp_path / "runs.json"
    assert main([*options, "--plugin", str(plugin), "--param", "tau=3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())[-1]["results"]
    assert {r["impl"] for r in rows} == {"flexsn-dsl", "torch loop"}
    assert all(r["max_abs_diff"] == 0.0 for r in rows)


def test_bench_long_times_few_neurons_over_many_steps():
    """--long: issue 27's cases, each in the modes asked for (batch-1 streaming: inference only)."""
    from flexsn_dsl.bench import add_arguments, cases
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    both = [(T, math.prod(shape), modes) for T, shape, modes in cases(parser.parse_args(["s", "--long"]), None)]
    assert both == [(100, 65536, ["inference", "training"]), (500, 65536, ["inference", "training"]),
                    (500, 8192, ["inference", "training"]), (1000, 8192, ["inference", "training"]),
                    (4096, 4096, ["inference", "training"]), (10000, 4096, ["inference"]), (1000, 256, ["inference"])]
    training = cases(parser.parse_args(["s", "--long", "--mode", "training"]), None)
    assert [(T, modes) for T, _, modes in training] == [(100, ["training"]), (500, ["training"]), (500, ["training"]),
                                                       (1000, ["training"]), (4096, ["training"])]
    assert cases(parser.parse_args(["s", "--long"]), None)[-1][1] == (1, 256)  # one sequence of 256 neurons
    # without it: every -T with every -n
    assert cases(parser.parse_args(["s", "-T", "3", "5", "-n", "7", "--mode", "training"]), None) == \
        [(3, (7,), ["training"]), (5, (7,), ["training"])]


def test_bench_records_the_launch_settings_it_ran_with(tmp_path, monkeypatch, capsys):
    out = tmp_path / "runs.json"
    monkeypatch.setenv("FLEXSN_DSL_TIME_TILE", "2")
    monkeypatch.setenv("FLEXSN_DSL_BLOCK", "16")
    assert main(["bench", str(NEURONS / "lif.yaml"), "-T", "5", "-n", "40", "--peers", "torch", "--mode", "inference",
                 "--json", str(out)]) == 0
    run = json.loads(out.read_text())[-1]
    assert run["launch"] == {"FLEXSN_DSL_BLOCK": "16", "FLEXSN_DSL_TIME_TILE": "2"}
    assert all(r["max_abs_diff"] == 0.0 for r in run["results"])
    assert "FLEXSN_DSL_BLOCK=16 FLEXSN_DSL_TIME_TILE=2" in capsys.readouterr().err


def test_bench_rounds_report_the_median_of_alternating_timings(tmp_path):
    out = tmp_path / "runs.json"
    assert main(["bench", str(NEURONS / "lif.yaml"), "-T", "2", "-n", "16", "--peers", "torch", "--device", "auto",
                 "--rounds", "3", "--json", str(out)]) == 0
    rows = json.loads(out.read_text())[-1]["results"]
    assert {(r["impl"], r["mode"]) for r in rows} == {(impl, mode) for impl in ("flexsn-dsl", "torch loop")
                                                      for mode in ("inference", "training")}
    for r in rows:
        times = r["extra"]["ms_rounds"]
        assert len(times) == 3 and all(t > 0 for t in times)
        assert r["ms"] == sorted(times)[1]


# --------------------------------------------------------------------------
# what the CLI echoes: terminal controls escaped; a closed pipe ends it quietly
# --------------------------------------------------------------------------
CONTROLS = ["\x1b[31m", "\x1b]0;title\x07", "\x9b2J", "\x07", "\r", "\x08", "\x00", "\x7f", "\x85", "\u202e",
            "\u2066"]


def test_escape_controls_escapes_every_control_but_newline_and_tab():
    from flexsn_dsl.console import escape_controls
    assert escape_controls("a\tb\nc é 中 ✓") == "a\tb\nc é 中 ✓"
    assert escape_controls("\x1b[31mred\x9b2J\r\x7f\u202e") == "\\x1b[31mred\\x9b2J\\x0d\\x7f\\u202e"
    for code in [*range(0x20), *range(0x7f, 0xa0)]:
        if chr(code) not in "\n\t":
            assert escape_controls(f"<{chr(code)}>") == f"<\\x{code:02x}>"


def _raw_controls(text: str) -> list[str]:
    return [c for c in CONTROLS if c in text]


@pytest.mark.parametrize("control", CONTROLS, ids=ascii)
def test_the_cli_escapes_controls_in_descriptions_file_names_and_plugins(control, tmp_path, capsys):
    description = json.dumps(f"before {control} after")  # JSON strings are YAML double-quoted strings
    folder = tmp_path / f"dir{control}" if "\x00" not in control else tmp_path / "dir"
    folder.mkdir()
    good = folder / f"good{control.replace(chr(0), '')}.yaml"
    good.write_text(f"neuron: ctl\ndescription: {description}\nstates: {{v: 0}}\nstep:\n  s: spike(v + x - 1)\n")
    bad = folder / "bad.yaml"  # the control in a comment: the YAML reader refuses most, and the error shows the line
    bad.write_text(f"neuron: n\nstates: {{v: 0}}\nstep:\n  s: spike(vv) # {control.replace(chr(0), '')}\n")
    plugin = tmp_path / "plugin.py"
    plugin.write_text("import flexsn_dsl\n\n\n@flexsn_dsl.hookimpl\ndef flexsn_dsl_register_surrogates(registry):\n"
                      f"    registry.register('ctl', gradient='1 + 0*x', params={{}}, description={description})\n")
    codes = [main(["check", str(folder)]), main(["show", str(good)]), main(["plugins", "--plugin", str(plugin)]),
             main(["check", str(folder / f"missing{control.replace(chr(0), '')}.yaml")])]
    out, err = capsys.readouterr()
    assert codes == [1, 0, 0, 1], (codes, err)
    assert not _raw_controls(out + err), ascii(out + err)
    from flexsn_dsl.console import escape_controls
    shown = escape_controls(control)
    assert f"before {shown} after" in out  # the description, in show and in plugins
    assert out.count(f"before {shown} after") == 2
    if control != "\x00":
        assert f"good{shown}.yaml" in out  # check's ok line
        assert f"missing{shown}.yaml does not exist" in err
    assert "bad.yaml:4:" in err


@pytest.mark.parametrize("command", [["plugins"], ["check", "neurons/"], ["show", "neurons/lif.yaml", "--kernel", "module"]])
def test_a_closed_pipe_ends_the_cli_quietly(command, tmp_path):
    """As `flexsn-dsl plugins | head` when head has already left: no error, no traceback."""
    read, write = os.pipe()
    os.close(read)  # the reader is gone before the first line
    try:
        proc = subprocess.run([sys.executable, "-m", "flexsn_dsl", *command], cwd=ROOT, env=_env(tmp_path),
                              stdout=write, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write)
    assert proc.stderr == "" and proc.returncode == 141, proc.stderr


STDP = """\
kind: synapse
name: stdp
params: {tau_pre: 20.0e-3, tau_post: 20.0e-3, a_plus: 0.01, a_minus: -0.0105, w_max: 1.0}
dt: 1.0e-3
pre:
  apre: {decay: exp(-dt / tau_pre)}
post:
  apost: {decay: exp(-dt / tau_post)}
on_pre:
  - apre: apre + a_plus
  - w: clip(w + apost, 0, w_max)
on_post:
  - apost: apost + a_minus
  - w: clip(w + apre, 0, w_max)
"""


def test_check_build_and_show_take_synapse_specs(tmp_path, capsys):
    """A synapse spec beside neuron specs: check validates it, build writes its torch functions (which load
    as a module defining on_pre and on_post), show prints its traces and lines; a mistake is an error at its
    line, as for neurons."""
    spec = tmp_path / "stdp.yaml"
    spec.write_text(STDP)
    assert main(["check", str(spec), str(NEURONS / "lif.yaml")]) == 0
    assert "synapse stdp: pre traces ['apre'], post traces ['apost'], on_pre 2 lines, on_post 2 lines" in \
        capsys.readouterr().out
    assert main(["build", str(spec), "-o", str(tmp_path / "out")]) == 0
    built = tmp_path / "out" / "stdp_synapse_torch.py"
    namespace: dict = {}
    exec(compile(built.read_text(), str(built), "exec"), namespace)
    assert callable(namespace["on_pre"]) and callable(namespace["on_post"])
    assert main(["show", str(spec), "--kernel", "torch"]) == 0 and "def on_post(" in capsys.readouterr().out
    spec.write_text(STDP.replace("  - w: clip(w + apre, 0, w_max)", "  - w: clip(w + apre, 0, w_mx)"))
    assert main(["check", str(spec)]) == 1
    assert f"{spec}:14:26: error: unknown name 'w_mx'" in capsys.readouterr().err
