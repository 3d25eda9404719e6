"""The ``flexsn-dsl`` command: check, build, show, plugins, bench."""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

from .errors import SpecError

SPEC_SUFFIXES = (".yaml", ".yml")
KERNEL_CHOICES = ("model", "torch", "cores", "forward_core", "backward_core", "info", "module",
                  "inference", "inference_final_state", "forward", "forward_final_state", "backward")


def _specs(paths: Sequence[str]) -> list[Path]:
    """Spec files named directly or found (recursively, sorted) in folders."""
    found: list[Path] = []
    for raw in paths:
        path = Path(raw)
        if path.is_dir():
            matches = sorted(p for p in path.rglob("*") if p.suffix in SPEC_SUFFIXES and p.is_file())
            if not matches:
                raise SpecError(f"no *.yaml or *.yml spec files in folder {path}", hint="check the path")
            found += matches
        elif path.is_file():
            found.append(path)
        else:
            raise SpecError(f"{path} does not exist", hint="give a spec file or a folder of specs")
    return found


def _params(items: Sequence[str]) -> dict[str, float]:
    out = {}
    for item in items:
        name, sep, value = item.partition("=")
        try:
            out[name.strip()] = float(value)
        except ValueError:
            raise SpecError(f"--param {item!r} is not NAME=NUMBER", hint="e.g. --param tau=3.0") from None
        if not sep:
            raise SpecError(f"--param {item!r} is not NAME=NUMBER", hint="e.g. --param tau=3.0")
    return out


def _compile(path: Path, args):
    from .compiler import compile_spec
    return compile_spec(path, params=_params(args.param), plugins=args.plugin, passes=getattr(args, "passes", []))


def _warn_plugins(args) -> None:
    from .plugins import get_plugins
    for error in get_plugins(args.plugin, warn=False).errors:
        print(f"warning: {error.message}", file=sys.stderr)


def cmd_check(args) -> int:
    _warn_plugins(args)
    failed = 0
    for path in _specs(args.paths):
        try:
            compiled = _compile(path, args)
        except SpecError as exc:
            failed += 1
            print(exc.format(), file=sys.stderr)
            continue
        m = compiled.model
        print(f"ok  {path}  neuron {m.name}: inputs {m.inputs}, states {list(m.states)}, "
              f"outputs {[n for n, _ in m.outputs]}, surrogate {m.surrogate.name}")
    return 1 if failed else 0


def _table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(r[i])) for r in rows + [header]) for i in range(len(header))]
    line = lambda r: "  ".join(str(c).ljust(w) for c, w in zip(r, widths)).rstrip()  # noqa: E731
    return "\n".join([line(header), line(["-" * w for w in widths])] + [line(r) for r in rows])


def cmd_build(args) -> int:
    _warn_plugins(args)
    out = Path(args.out)
    specs = _specs(args.paths)
    rows, failed = [], 0
    for index, path in enumerate(specs, 1):
        print(f"[{index}/{len(specs)}] {path} ...", end="", flush=True, file=sys.stderr)
        start = time.perf_counter()
        try:
            compiled = _compile(path, args)
            out.mkdir(parents=True, exist_ok=True)
            kernel_path = out / f"{compiled.model.name}.py"
            kernel_path.write_text(compiled.triton_source)
            (out / f"{compiled.model.name}_torch.py").write_text(compiled.torch_source)
            (out / f"{compiled.model.name}.info.json").write_text(json.dumps(compiled.cores.info.to_dict(), indent=2) + "\n")
            compile(compiled.triton_source, str(kernel_path), "exec")  # the module must at least parse
        except SpecError as exc:
            failed += 1
            print(" failed", file=sys.stderr)
            print(exc.format(), file=sys.stderr)
            continue
        seconds = time.perf_counter() - start
        print(f" ok ({seconds:.2f} s)", file=sys.stderr)
        info = compiled.cores.info
        rows.append([info.neuron, ",".join(info.input_names), ",".join(info.state_names),
                     ",".join(info.output_names), ",".join(info.param_names) or "-",
                     ",".join(n for n in _saved_labels(info)) or "-", str(kernel_path), f"{seconds:.2f}"])
    if rows:
        print(_table(rows, ["neuron", "inputs", "states", "outputs", "learnable", "saved/step", "kernels", "s"]))
    print(f"{len(rows)} built, {failed} failed; output in {out}/", file=sys.stderr)
    return 1 if failed else 0


def _saved_labels(info) -> list[str]:
    names = {"saved": info.saved_names, "input": info.input_names, "output": info.output_names}
    return [f"{names[k][i]}" + ("" if k == "saved" else f"({k})") for k, i in info.c2k_return_mapping]


def cmd_show(args) -> int:
    from .templates import kernel_source
    compiled = _compile(Path(args.spec), args)
    what = args.kernel
    if what == "model":
        m = compiled.model
        print(f"neuron {m.name} ({m.file})\n  {m.description}")
        print(f"  inputs: {m.inputs}")
        for p in m.parameters.values():
            print(f"  parameter {p.name} = {compiled.values[p.name]!r}{' (learnable)' if p.learnable else ''}")
        for s in m.states.values():
            print(f"  state {s.name}: init {s.init}")
        print(f"  surrogate: {m.surrogate.name} {m.surrogate_params}  g(x) = {compiled.ir.surrogate}")
        print("  step:")
        for sym, expr in compiled.ir.assignments:
            print(f"    {sym.name} = {expr}")
        print(f"  outputs: {[n for n, _ in m.outputs]}")
        print(f"\n{compiled.torch_source}")
    elif what == "torch":
        print(compiled.torch_source)
    elif what == "module":
        print(compiled.triton_source)
    elif what == "cores":
        print(compiled.cores.source)
    elif what in ("forward_core", "backward_core"):
        source = compiled.cores.source
        start = source.index(f"def {compiled.model.name}_{what}")
        end = source.find("\n\n\n", start)
        print("@triton.jit\n" + source[start:end if end > 0 else None].rstrip())
    elif what == "info":
        print(json.dumps(compiled.cores.info.to_dict(), indent=2))
    else:
        print(kernel_source(compiled.cores, what))
    return 0


def cmd_plugins(args) -> int:
    from .plugins import get_plugins
    plugins = get_plugins(args.plugin, warn=False)
    print("plugins:")
    for name, where in plugins.sources:
        print(f"  {name}  ({where})")
    print("surrogates:")
    for s in sorted(plugins.surrogates.values(), key=lambda s: s.name):
        params = ", ".join(f"{k}={v:g}" for k, v in s.params.items())
        print(f"  {s.name}({params})  g(x) = {s.gradient}  [{s.origin}]")
    print("passes:" + ("" if plugins.passes else " none"))
    for p in sorted(plugins.passes.values(), key=lambda p: (p.stage, p.order, p.name)):
        print(f"  {p.name}  stage={p.stage} order={p.order}{' default' if p.default else ''}  {p.description}  [{p.origin}]")
    for error in plugins.errors:
        print(f"error: {error.message}", file=sys.stderr)
    return 1 if plugins.errors else 0


def cmd_bench(args) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexsn-dsl", description="Spiking neurons as YAML equations, "
                                     "compiled into fused Triton kernels.")
    from . import __version__
    parser.add_argument("--version", action="version", version=f"flexsn-dsl {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    def command(name: str, handler: Callable, help: str) -> argparse.ArgumentParser:
        p = sub.add_parser(name, help=help, description=help)
        p.set_defaults(handler=handler)
        p.add_argument("--plugin", action="append", default=[], metavar="FILE",
                       help="load a plugin from a Python file (repeatable)")
        return p

    p = command("check", cmd_check, "validate spec files or folders of specs")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    p = command("build", cmd_build, "validate specs and write their Triton kernels, torch step and FlexSNInfo")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-o", "--out", default="build", help="output folder (default: build)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME",
                   help="enable a code-generation pass for every spec (repeatable)")
    p = command("show", cmd_show, "print a spec's parsed model or one piece of its generated code")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--kernel", choices=KERNEL_CHOICES, default="model", help="what to print (default: model)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="override a parameter")
    p.add_argument("--pass", dest="passes", action="append", default=[], metavar="NAME",
                   help="enable a code-generation pass (repeatable)")
    command("plugins", cmd_plugins, "list plugins, surrogates and code-generation passes, with their origin")
    p = command("bench", cmd_bench, "time the generated kernels against torch loops and peers")
    from .bench import add_arguments
    add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        return args.handler(args)
    except SpecError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback for users; FLEXSN_DSL_DEBUG=1 shows it
        if os.environ.get("FLEXSN_DSL_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc}\n  hint: set FLEXSN_DSL_DEBUG=1 for the traceback "
              "and report it", file=sys.stderr)
        return 2
