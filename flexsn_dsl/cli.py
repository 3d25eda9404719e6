"""The ``flexsn-dsl`` command: check, build, show, simulate, plugins, bench."""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
import warnings
from pathlib import Path
from typing import Callable, Sequence

from .cli_simulate import cmd_simulate
from .console import (UsageError, add_spec_options, at_least, check_size_names, compile_with_options, escaped_output,
                      parse_params, parse_sizes, refuse_overwriting_inputs, table)
from .errors import MissingDependency, NIRError, ShapeError, SpecError, SpecWarning, printable

SPEC_SUFFIXES = (".yaml", ".yml")
KERNEL_CHOICES = ("model", "torch", "cores", "forward_core", "backward_core", "info", "module",
                  "inference", "inference_final_state", "forward", "forward_final_state", "backward", "plastic")


def _specs(paths: Sequence[str]) -> tuple[list[Path], list[SpecError]]:
    """Spec files named directly or found (recursively, sorted) in folders, each once;
    and a problem for each path that names none."""
    found: list[Path] = []
    problems: list[SpecError] = []
    seen: set[Path] = set()
    for raw in paths:
        path = Path(raw)
        candidates: list[Path] = []
        if path.is_dir():
            candidates = sorted(p for p in path.rglob("*") if p.suffix in SPEC_SUFFIXES and p.is_file())
            if not candidates:
                problems.append(SpecError(f"no *.yaml or *.yml spec files in folder {path}",
                                          hint="give a folder that holds specs, or the spec files themselves"))
        elif path.exists():
            candidates = [path]  # read as load() reads it: a FIFO or a device is refused there
        else:
            problems.append(SpecError(f"{path} does not exist", hint=_missing_hint(path)))
        for candidate in candidates:
            key = candidate.resolve()
            if key not in seen:
                seen.add(key)
                found.append(candidate)
    return found, problems


def _missing_hint(path: Path) -> str:
    import difflib
    try:
        names = sorted(p.name for p in path.parent.iterdir())[:10_000] if path.parent.is_dir() else []
    except OSError:
        names = []
    match = difflib.get_close_matches(path.name, names, n=1, cutoff=0.6)
    if match:
        return f"did you mean {path.parent / match[0]}?"
    return "give a spec file or a folder of specs"


def _warn_plugins(args) -> None:
    from .plugins import get_plugins
    for error in get_plugins(args.plugin, warn=False).errors:
        print(f"warning: {error.message}", file=sys.stderr)


def _synapse(path: Path):
    """The validated model of ``path`` if it is a synapse spec (``kind: synapse``), else None."""
    from .source import read_spec
    from .synapse import build_synapse, synapse_text
    text = read_spec(path)
    return build_synapse(text, str(path)) if synapse_text(text, str(path)) else None


def _synapse_summary(m) -> str:
    return (f"synapse {m.name}: pre traces {list(m.pre)}, post traces {list(m.post)}, "
            f"on_pre {len(m.on_pre)} lines, on_post {len(m.on_post)} lines")


def cmd_check(args) -> int:
    _warn_plugins(args)
    specs, problems = _specs(args.paths)
    for problem in problems:
        print(problem.format(), file=sys.stderr)
    failed = len(problems)
    models = []
    for path in specs:
        try:
            synapse = _synapse(path)
            if synapse is not None:
                print(f"ok  {printable(path)}  {_synapse_summary(synapse)}")
                continue
            with warnings.catch_warnings():
                warnings.simplefilter("ignore", SpecWarning)  # printed below, once, in the same form as errors
                compiled = compile_with_options(path, args)
                compiled.lower()
        except SpecError as exc:
            failed += 1
            print(exc.format(), file=sys.stderr)
            continue
        m = compiled.model
        models.append(m)
        for warning in m.warnings:
            print(warning.format(), file=sys.stderr)
        print(f"ok  {printable(path)}  neuron {m.name}: inputs {m.inputs}, states {list(m.states)}, "
              f"outputs {[n for n, _ in m.outputs]}, surrogate {m.surrogate.name}")
    return 1 if failed or not _sizes_known(args, models) else 0


def _sizes_known(args, models: list) -> bool:
    """Whether every --size names a size of one of ``models`` (else the error is printed)."""
    try:
        check_size_names(parse_sizes(args.size), models)
    except SpecError as exc:
        print(exc.format(), file=sys.stderr)
        return False
    return True


def cmd_build(args) -> int:
    _warn_plugins(args)
    out = Path(args.out)
    specs, problems = _specs(args.paths)
    for problem in problems:
        print(problem.format(), file=sys.stderr)
    if specs:
        try:
            out.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise SpecError(f"cannot create the output folder {out}: {exc.strerror or exc}",
                            hint="give -o a folder that can be created and written") from None
    rows, failed = [], len(problems)
    built: dict[str, Path] = {}  # neuron name -> the spec it was built from
    models = []
    for index, path in enumerate(specs, 1):
        print(f"[{index}/{len(specs)}] {printable(path)} ...", end="", flush=True, file=sys.stderr)
        start = time.perf_counter()
        try:
            synapse = _synapse(path)
            if synapse is not None:  # its torch functions (the module compiles them again when it loads the spec)
                from .synapse_torch import torch_source
                synapse_path = out / f"{synapse.name}_synapse_torch.py"
                _write(out, synapse_path, torch_source(synapse))
                print(f" ok ({time.perf_counter() - start:.2f} s)", file=sys.stderr)
                rows.append([str(path), f"{synapse.name} (synapse)", ",".join(synapse.inputs) or "-",
                             ",".join(synapse.traces), "-", "-", "-", str(synapse_path),
                             f"{time.perf_counter() - start:.2f}"])
                continue
            compiled = compile_with_options(path, args)
            models.append(compiled.model)
            name = compiled.model.name
            if name in built:
                raise SpecError(f"neuron {name!r} is also built from {built[name]}: their files in {out} would "
                                "overwrite each other", compiled.model.positions.get("neuron"),
                                "give each spec its own `neuron:` name").with_source(compiled.model.text.splitlines())
            built[name] = path
            kernel_path = out / f"{name}.py"
            _write(out, kernel_path, compiled.triton_source)
            _write(out, out / f"{name}_torch.py", compiled.torch_source)
            _write(out, out / f"{name}.info.json", json.dumps(compiled.cores.info.to_dict(), indent=2) + "\n")
            compile(compiled.triton_source, str(kernel_path), "exec")  # the module must at least parse
        except SpecError as exc:
            failed += 1
            print(" failed", file=sys.stderr)
            print(exc.format(), file=sys.stderr)
            rows.append([str(path), "-", "-", "-", "-", "-", "-", "FAILED (error above)", "-"])
            continue
        seconds = time.perf_counter() - start
        print(f" ok ({seconds:.2f} s)", file=sys.stderr)
        info = compiled.cores.info
        rows.append([str(path), info.neuron, ",".join(info.input_names), ",".join(info.state_names),
                     ",".join(info.output_names), ",".join(info.param_names) or "-",
                     ",".join(n for n in _saved_labels(info)) or "-", str(kernel_path), f"{seconds:.2f}"])
    if rows:
        print(table(rows, ["spec", "neuron", "inputs", "states", "outputs", "learnable", "saved/step", "kernels",
                            "s"]))
    print(f"{len(specs) + len(problems) - failed} built, {failed} failed; output in {printable(out)}/", file=sys.stderr)
    return 1 if failed or not _sizes_known(args, models) else 0


def _write(out: Path, path: Path, text: str) -> None:
    try:
        path.write_text(text)
    except OSError as exc:
        raise SpecError(f"cannot write to {printable(out)}: {exc.strerror or exc}",
                        hint="give -o a folder that can be written") from None


def _saved_labels(info) -> list[str]:
    names = {"saved": info.saved_names, "input": info.input_names, "output": info.output_names}
    return [f"{names[k][i]}" + ("" if k == "saved" else f"({k})") for k, i in info.c2k_return_mapping]


def cmd_show(args) -> int:
    from .names import core_name
    from .ir import resolve_shapes
    from .parallel import verdict
    from .symbolic import language_text
    from .templates import kernel_source
    synapse = _synapse(Path(args.spec))
    plastic = (args.kernel == "plastic", args.neuron is not None)
    if any(plastic) and (synapse is None or not all(plastic)):
        raise SpecError("--kernel plastic prints the fused kernel of a synapse spec driving a neuron spec",
                        hint="give both: flexsn-dsl show SYNAPSE.yaml --kernel plastic --neuron NEURON.yaml")
    if synapse is not None and args.kernel == "plastic":
        from .plastic_kernels import plastic_source, unsupported
        compiled = compile_with_options(Path(args.neuron), args)
        reason = unsupported(compiled)
        if reason is not None:
            raise SpecError(f"synapse {synapse.name} cannot drive neuron {compiled.model.name} in a fused kernel: {reason}",
                            hint="PlasticLinear runs such a neuron with backend='torch'")
        print(plastic_source(synapse, compiled))
        return 0
    if synapse is not None:
        from .synapse_torch import torch_source
        print(torch_source(synapse) if args.kernel == "torch" else
              f"{_synapse_summary(synapse)} ({printable(synapse.file)})\n  {synapse.description}".rstrip())
        return 0
    compiled = compile_with_options(Path(args.spec), args)
    check_size_names(parse_sizes(args.size), [compiled.model])
    what = args.kernel
    if what == "model":
        m = compiled.model
        print(f"neuron {m.name} ({printable(m.file)})\n  {m.description}")
        print(f"  inputs: {m.inputs}")
        shapes = resolve_shapes(m, parse_sizes(args.size), {}, require=False)
        for p in m.parameters.values():
            shape = f", shape {list(shapes[p.name])}" if p.shaped else ""
            print(f"  parameter {p.name} = {compiled.values[p.name]!r}{shape}{' (learnable)' if p.learnable else ''}")
        for s in m.states.values():
            print(f"  state {s.name}: init {s.init}")
        print(f"  surrogate: {m.surrogate.name} {m.surrogate_params}  g(x) = {compiled.ir.surrogate}")
        c = m.continuous
        if c is not None:
            print(f"  equations (method {c.method}):")
            for eq in c.equations.values():
                print(f"    d{eq.name}/dt = {language_text(eq.expr)}")
            if c.threshold is not None:
                print(f"  threshold: spike({language_text(c.threshold)})")
            for line in c.reset.values():
                print(f"  reset {line.name}: {language_text(line.expr)}" + (" (detached)" if c.detach_reset else ""))
            if c.period is not None:
                print(f"  refractory: period {c.period}, hold {list(c.hold)}")
            if c.condition is not None:
                print(f"  refractory: while {language_text(c.condition)} after a spike, hold {list(c.hold)}")
        print("  step:" if c is None else "  derived step (one step of dt):")
        for sym, expr in compiled.ir.assignments:
            print(f"    {sym.name} = {language_text(expr)}")
        print(f"  outputs: {[n for n, _ in m.outputs]}")
        print(f"  time steps: {verdict(compiled.ir)}")
    elif what == "torch":
        print(compiled.torch_source)
    elif what == "module":
        print(compiled.triton_source)
    elif what == "cores":
        print(compiled.cores.source)
    elif what in ("forward_core", "backward_core"):
        source = compiled.cores.source
        start = source.index(f"def {core_name(compiled.model.name, what.split('_')[0])}")
        end = source.find("\n\n\n", start)
        print("@triton.jit\n" + source[start:end if end > 0 else None].rstrip())
    elif what == "info":
        print(json.dumps(compiled.cores.info.to_dict(), indent=2))
    else:
        print(kernel_source(compiled.cores, what))
    return 0


def cmd_plugins(args) -> int:
    """List every plugin, surrogate and pass with where it came from; exit 1 if a plugin is broken."""
    from .plugins import get_plugins
    plugins = get_plugins(args.plugin, warn=False)
    if args.json:
        data = {
            "plugins": [{"name": name, "from": where} for name, where in plugins.sources],
            "surrogates": [{"name": s.name, "params": s.params, "gradient": str(s.gradient), "plugin": s.origin,
                            "description": s.description} for s in sorted(plugins.surrogates.values(),
                                                                          key=lambda s: s.name)],
            "passes": [{"name": p.name, "stage": p.stage, "order": p.order, "default": p.default,
                        "plugin": p.origin, "description": p.description}
                       for p in sorted(plugins.passes.values(), key=lambda p: p.sort_key)],
            "errors": [{"plugin": getattr(e, "plugin", None), "message": e.message, "hint": e.hint}
                       for e in plugins.errors],
        }
        print(json.dumps(data, indent=2))
        return 1 if plugins.errors else 0
    print("plugins (in load order):")
    for name, where in plugins.sources:
        print(f"  {name}  ({where})")
    print("surrogates (name(defaults)  g(x)  [plugin]):")
    for s in sorted(plugins.surrogates.values(), key=lambda s: s.name):
        params = ", ".join(f"{k}={v:g}" for k, v in s.params.items())
        print(f"  {s.name}({params})  g(x) = {s.gradient}  [{s.origin}]")
        if s.description:
            print(f"      {s.description}")
    print("passes (in run order: stage ir, then source; then order, then name):" + ("" if plugins.passes else " none"))
    for p in sorted(plugins.passes.values(), key=lambda p: p.sort_key):
        default = ", on by default" if p.default else ""
        print(f"  {p.name}  (stage {p.stage}, order {p.order}{default})  [{p.origin}]")
        if p.description:
            print(f"      {p.description}")
    for error in plugins.errors:
        print(f"error: {error.message}" + (f"\n  hint: {error.hint}" if error.hint else ""), file=sys.stderr)
    return 1 if plugins.errors else 0


def cmd_nir(args) -> int:
    """NIR files: show one, import one as a network (and run it once), export a spec as a NIR graph."""
    from . import nir as nir_module
    try:
        if args.nir_command == "import":
            at_least("--steps", args.steps, 0)
        if getattr(args, "dt", None) is not None and not (math.isfinite(args.dt) and args.dt >= sys.float_info.min):
            raise UsageError(f"--dt {args.dt!r}: give the step length, a positive number")
        if args.nir_command == "export":
            refuse_overwriting_inputs({"-o/--out": args.out}, [args.spec, *args.plugin])
        nir = nir_module._nir()
        if args.nir_command == "export":
            from .runtime import load
            module = load(args.spec, params=parse_params(args.param), backend="torch", plugins=args.plugin,
                          sizes=parse_sizes(args.size))
            check_size_names(parse_sizes(args.size), [module.spec])
            shape = _shape(args.shape)
            import torch
            graph = nir_module.to_nir(module, torch.zeros(1, 2, *shape), dt=args.dt)
            nir.write(args.out, graph)
            kind = next(n for n in graph.nodes.values() if type(n).__name__ in nir_module.NEURONS)
            print(f"{module.spec.name} is NIR {type(kind).__name__}; written to {printable(args.out)}")
            _print_graph(graph)
            return 0
        graph = nir_module.read_graph(args.file)
        if args.nir_command == "show":
            _print_graph(graph)
            return 0
        net = nir_module.from_nir(graph, dt=args.dt, method=args.method, backend=args.backend)
        print(net)
        (_, node), = graph.inputs.items() if len(graph.inputs) == 1 else (("", None),)
        if node is not None and args.steps:
            import numpy as np
            import torch
            shape = np.asarray(node.input_type["input"]).reshape(-1)
            if shape.dtype.kind not in "iu" or np.any(shape < 1) or args.steps * np.prod(shape, dtype=float) > 2 ** 27:
                raise NIRError(f"the Input node's shape {shape.tolist()[:8]} times --steps {args.steps} is not a run of "
                               f"at most {2 ** 27} positive values: give --steps 0 (build only), or fewer steps")
            try:
                with torch.no_grad():
                    out = net(torch.zeros(args.steps, 1, *(int(n) for n in shape)))
            except (RuntimeError, MemoryError) as exc:  # (what the network makes of the input does not fit)
                raise NIRError(f"running {args.steps} steps of zero input failed: {str(exc).splitlines()[0]}; give "
                               "--steps 0 (build only), or fewer steps") from None
            print(f"ran {args.steps} steps of zero input: output shape {list(out.shape)}, "
                  f"{float(out.sum()):g} summed")
        return 0
    except NIRError as exc:
        raise SpecError(str(exc)) from None
    except (OSError, KeyError, ValueError, AssertionError) as exc:
        what = getattr(args, "file", None) or getattr(args, "out", None)
        raise SpecError(f"{what}: {type(exc).__name__}: {exc}", hint="give a NIR file written by nir.write") from None


def _shape(text: str) -> list[int]:
    try:
        shape = [int(n) for n in text.split(",") if n.strip()]
    except ValueError:
        shape = []
    if not shape or any(n <= 0 for n in shape):
        raise UsageError(f"--shape {text!r}: give the layer's sizes as positive integers, e.g. --shape 128 or 3,32,32")
    return shape


def _print_graph(graph) -> None:
    """The nodes (kind, input and output shapes, parameters) and edges of a NIR graph."""
    import numpy as np
    rows = []
    for name, node in graph.nodes.items():
        shapes = [list(np.asarray(t).tolist()) if t is not None else "?" for t in
                  ((node.input_type or {}).get("input"), (node.output_type or {}).get("output"))]
        params = []
        for key, value in vars(node).items():
            if isinstance(value, np.ndarray) and key not in ("input_type", "output_type") and value.size:
                if value.dtype.kind not in "biuf":
                    params.append(f"{printable(key)}=({value.dtype.kind} values)")
                    continue
                lo, hi = float(value.min()), float(value.max())
                params.append(f"{printable(key)}={lo:g}" if lo == hi else f"{printable(key)}={lo:g}..{hi:g}")
        rows.append([printable(name), type(node).__name__, str(shapes[0]), str(shapes[1]), " ".join(params)])
    print(table(rows, ["node", "kind", "input", "output", "parameters (min..max)"]))
    print("edges: " + ", ".join(f"{printable(a)} -> {printable(b)}" for a, b in graph.edges))


def cmd_bench(args) -> int:
    from .bench import main as bench_main
    return bench_main(args)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="flexsn-dsl", description="Spiking neurons as YAML equations, "
                                     "compiled into fused Triton kernels.")
    from .version import __version__
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
    add_spec_options(p, passes="enable a code-generation pass for every spec and check that its IR stage runs "
                     "(repeatable)")
    p = command("build", cmd_build, "validate specs and write their Triton kernels, torch step and FlexSNInfo")
    p.add_argument("paths", nargs="+", metavar="PATH")
    p.add_argument("-o", "--out", default="build", help="output folder (default: build)")
    add_spec_options(p, passes="enable a code-generation pass for every spec (repeatable)")
    p = command("show", cmd_show, "print a spec's parsed model or one piece of its generated code")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--kernel", choices=KERNEL_CHOICES, default="model", help="what to print (default: model; "
                   "plastic: a synapse spec's fused kernel driving the neuron of --neuron)")
    p.add_argument("--neuron", metavar="NEURON", help="with a synapse spec and --kernel plastic: the neuron spec it drives")
    add_spec_options(p, passes="enable a code-generation pass (repeatable)")
    p = command("simulate", cmd_simulate, "run a neuron on a driving input: spike count, rate, final states; "
                "plot the traces or an f-I curve")
    p.add_argument("spec", metavar="SPEC")
    p.add_argument("--input", action="append", default=[], metavar="[NAME=]VALUE|FILE.npy",
                   help="drive an input (default: the first) with a constant or a .npy array of shape [T] or [T, N]; "
                   "repeatable; inputs not given are 0 (default: the first input held at 1.0)")
    p.add_argument("--steps", type=int, metavar="T", help="number of steps (default: 100, or the array's length)")
    p.add_argument("--neurons", type=int, metavar="N", help="number of neurons (default: 1, or the array's N)")
    p.add_argument("--fi", metavar="LO:HI:K", help="f-I curve: the firing rate for K constant inputs from LO to HI")
    p.add_argument("--plot", metavar="FILE.png", help="draw the inputs, each state's trace and the spike raster "
                   "(with --fi: the f-I curve); needs matplotlib")
    p.add_argument("--csv", metavar="FILE", help="write the traces (with --fi: input and rate) as CSV")
    p.add_argument("--seed", type=int, metavar="N", help="seed the random draws (rand(), randn(), xi) of a noisy "
                   "spec; default: a fresh seed, printed so that the run can be repeated")
    add_spec_options(p, passes="enable a code-generation pass (repeatable)")
    p = command("plugins", cmd_plugins, "list plugins, surrogates and code-generation passes, with where each "
                "came from (exit 1 if a plugin is broken)")
    p.add_argument("--json", action="store_true", help="print JSON instead of text")
    p = command("nir", cmd_nir, "NIR graphs: show a file, import it as a network, export a spec "
                "(needs pip install flexsn-dsl[nir])")
    nir_sub = p.add_subparsers(dest="nir_command", metavar="ACTION", required=True)
    q = nir_sub.add_parser("show", help="print a NIR file's nodes, shapes, parameters and edges")
    q.add_argument("file", metavar="FILE")
    q = nir_sub.add_parser("import", help="build the network of a NIR file with flexsn-dsl neurons; print it and "
                           "run it on zero input")
    q.add_argument("file", metavar="FILE")
    q.add_argument("--dt", type=float, required=True, help="the step length, in the graph's time unit")
    q.add_argument("--method", default="exact", help="the integrator: exact (default), euler, rk2, rk4, "
                   "exponential_euler")
    q.add_argument("--backend", default="torch", help="torch (default), triton or auto")
    q.add_argument("--steps", type=int, default=4, metavar="T", help="steps of zero input to run (default 4; 0: none)")
    q = nir_sub.add_parser("export", help="write a spec's neuron as a NIR graph (input -> neuron -> output)")
    q.add_argument("spec", metavar="SPEC")
    q.add_argument("-o", "--out", required=True, metavar="FILE.nir")
    q.add_argument("--shape", required=True, metavar="N[,N...]", help="the layer's shape, e.g. 128 or 3,32,32")
    q.add_argument("--dt", type=float, help="a `step` spec's step length (it is exported as an Euler step)")
    add_spec_options(q)
    p = command("bench", cmd_bench, "time the generated kernels against torch loops and peers")
    from .bench import add_arguments
    add_arguments(p)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; control characters in what it prints are escaped."""
    with escaped_output():
        return _main(argv)


def _main(argv: Sequence[str] | None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    if not getattr(args, "handler", None):
        parser.print_help()
        return 2
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a closed pipe shows here, not at exit
        return code
    except SpecError as exc:
        print(exc.format(), file=sys.stderr)
        return 1
    except (MissingDependency, ShapeError) as exc:  # (a ShapeError: sizes given that do not fit)
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except UsageError as exc:
        print(f"flexsn-dsl {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except BrokenPipeError:  # the reader left (`flexsn-dsl plugins | head`): stop quietly
        _silence_stdout()
        return 141  # as a shell reports a process that SIGPIPE ended
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # never a traceback for users; FLEXSN_DSL_DEBUG=1 shows it
        if os.environ.get("FLEXSN_DSL_DEBUG"):
            raise
        print(f"internal error: {type(exc).__name__}: {exc}\n  hint: set FLEXSN_DSL_DEBUG=1 for the traceback "
              "and report it", file=sys.stderr)
        return 2


def _silence_stdout() -> None:
    """Point stdout at /dev/null, so that the interpreter's last flush does not fail on the closed pipe."""
    try:
        fd = sys.stdout.fileno()
    except (AttributeError, OSError, ValueError):
        return  # not a real file (a test capturing the output)
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, fd)
    os.close(devnull)
