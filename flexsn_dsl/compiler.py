"""The pipeline, top to bottom: spec text -> model -> IR (+ passes) -> torch and Triton
source -> cached, importable modules."""
from __future__ import annotations

import ast
import atexit
import contextlib
import hashlib
import json
import linecache
import os
import shutil
import stat
import sys
import tempfile
import threading
import warnings
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from types import ModuleType
from typing import Iterable

import sympy

from .version import __version__
from .codegen_torch import torch_source
from .codegen_triton import Cores, build_cores
from .errors import PluginError, SourcePos, SpecError
from .interpreter import use_interpreter_without_gpu
from .ir import StepIR, build_ir, resolve_params
from .literals import identifier
from .model import RESERVED_NAMES, NeuronModel, build_model, read_model
from .model.language import CANONICAL_LOOP_HINT
from .names import VARIANTS, generated_names, kernel_name
from .plugins import X, Pass, Plugins, describe_exception, get_plugins, plugin_error, source_path
from .parallel import Affine, analyse
from .printer import TORCH, TRITON, Printer, float_literal
from .scan_templates import scan_source
from .symbolic import SurrogateGrad
from .templates import module_source

CACHE_ENV = "FLEXSN_DSL_CACHE"
MAX_CACHE_FILE = 64 << 20  # bytes: a bigger file in the cache is not one this package wrote


def _package_sources(root: Path) -> list[tuple[str, bytes]]:
    """Every source file of the package, its subpackages' too: the code generator is all of them."""
    return [(p.relative_to(root).as_posix(), p.read_bytes()) for p in sorted(root.rglob("*.py"))]


def generator_fingerprint(root: Path = Path(__file__).parent) -> str:
    """A hash of the package's version and source files: generated code is cached under it."""
    digest = hashlib.sha256(__version__.encode())
    for name, data in _package_sources(root):
        digest.update(f"\0{name}\0{len(data)}\0".encode() + data)
    return digest.hexdigest()[:16]


GENERATOR_VERSION = f"{__version__}+{generator_fingerprint()}"
_LOCK = threading.RLock()  # re-entrant: a pass may load another spec
_FALLBACK_DIRS: dict[str, Path] = {}


def _dir_problem(folder: Path) -> str:
    """Why ``folder`` cannot hold the cache ('' when it can): it must be (or be creatable as) a folder
    owned by this user that nobody else can write to, as Triton and pip require of theirs."""
    try:
        folder.mkdir(mode=0o700, parents=True, exist_ok=True)
        info = os.stat(folder)
    except FileExistsError:
        return "is not a folder"
    except OSError as exc:
        return f"cannot be created ({exc.strerror or exc})"
    if not stat.S_ISDIR(info.st_mode):
        return "is not a folder"
    if hasattr(os, "getuid") and info.st_uid != os.getuid():
        return "is owned by another user"
    if info.st_mode & 0o022:
        return f"is writable by group or others (mode {stat.S_IMODE(info.st_mode):o})"
    if not os.access(folder, os.W_OK | os.X_OK):
        return "is not writable"
    return ""


def cache_dir() -> Path:
    """Where generated modules are kept: $FLEXSN_DSL_CACHE, else ~/.cache/flexsn_dsl. A folder that
    cannot be used safely is replaced (with a warning, once per process) by a private temporary one."""
    root = Path(os.environ.get(CACHE_ENV) or os.path.join(os.path.expanduser("~"), ".cache", "flexsn_dsl"))
    problem = _dir_problem(root)
    if not problem:
        return root
    if str(root) not in _FALLBACK_DIRS:
        fallback = Path(tempfile.mkdtemp(prefix="flexsn-dsl-cache-"))
        atexit.register(shutil.rmtree, fallback, ignore_errors=True)
        warnings.warn(f"flexsn-dsl: the cache folder {str(root)!r} {problem}; generated kernels are kept in "
                      f"{str(fallback)!r} until this process ends (set {CACHE_ENV} to a private folder)",
                      stacklevel=3)
        _FALLBACK_DIRS[str(root)] = fallback
    return _FALLBACK_DIRS[str(root)]


def _first_line(key: str, body: bytes) -> bytes:
    return f"# flexsn-dsl cache key={_hex(key)} sha256={hashlib.sha256(body).hexdigest()}\n".encode()


def read_cached(path: Path, key: str) -> str | None:
    """The module text cached at ``path`` for ``key``, or None unless the file is a regular file of
    this user that nobody else can write to, and its first line holds ``key`` and the sha256 of the rest."""
    flags = os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0)
    try:
        fd = os.open(path, flags)  # a symlink fails (ELOOP), a FIFO opens without blocking
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_mode & 0o022 or info.st_size > MAX_CACHE_FILE or \
                (hasattr(os, "getuid") and info.st_uid != os.getuid()):
            return None
        with os.fdopen(os.dup(fd), "rb") as f:
            data = f.read(MAX_CACHE_FILE + 1)
    except OSError:
        return None
    finally:
        os.close(fd)
    head, _, body = data.partition(b"\n")
    if head + b"\n" != _first_line(key, body):
        return None
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError:
        return None


def write_cached(path: Path, key: str, text: str) -> None:
    """Write ``text`` for ``key`` atomically (a private temporary file renamed over ``path``, mode 0600)."""
    body = text.encode("utf-8")
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.stem}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(_first_line(key, body) + body)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def import_source(name: str, text: str, filename: str) -> ModuleType:
    """Run ``text`` as module ``name`` (in sys.modules) from these very bytes, never re-read from disk;
    linecache holds the text so tracebacks, ``inspect.getsource`` and ``triton.jit`` see it."""
    module = ModuleType(name)
    linecache.cache[filename] = (len(text), None, text.splitlines(True), filename)
    sys.modules[name] = module
    try:
        exec(compile(text, filename, "exec"), module.__dict__)
    except BaseException:
        del sys.modules[name]
        raise
    return module


def _requested_passes(model: NeuronModel, plugins: Plugins, extra: Iterable[str] | str) -> tuple[str, ...]:
    """The passes the spec (``passes:``) and the build (``--pass``, ``passes=``) ask for, checked."""
    extra = [extra] if isinstance(extra, str) else list(extra or ())
    requested: list[str] = []
    for name in [*model.passes, *extra]:
        if not isinstance(name, str) or name not in plugins.passes:
            raise plugins.unknown_pass(str(name))
        if name not in requested:
            requested.append(name)
    return tuple(requested)


def _select_passes(model: NeuronModel, plugins: Plugins, extra: Iterable[str] | str) -> list[Pass]:
    """The passes to run, in run order: the requested ones and every ``default=True`` pass,
    sorted by stage (``ir`` then ``source``), then ``order``, then name."""
    names = set(_requested_passes(model, plugins, extra)) | {n for n, p in plugins.passes.items() if p.default}
    return sorted((plugins.passes[n] for n in names), key=lambda p: p.sort_key)


@dataclass(eq=False)
class Compiled:
    """One spec with fixed parameter values, lowered as far as has been asked."""

    model: NeuronModel
    values: dict[str, float]
    passes: list[Pass] = field(default_factory=list)
    requested: tuple[str, ...] = ()  # passes asked for by name; the others in ``passes`` are defaults
    plugin_code: str = ""            # Plugins.code: a hash of every plugin module's source

    @cached_property
    def ir(self) -> StepIR:
        """The step IR after the ``ir``-stage passes."""
        with self._lowering():
            ir = build_ir(self.model, self.values)
        return self._run_stage("ir", ir)

    @contextlib.contextmanager
    def _lowering(self):
        """Report a failure of sympy or of a printer while lowering as a SpecError at the line that causes it."""
        try:
            yield
        except (ValueError, TypeError, ArithmeticError, NotImplementedError, RecursionError) as exc:
            lines = [(a.expr, a.pos) for a in self.model.checked_lines] if "ir" not in self.__dict__ else \
                [(expr, pos) for (_, expr), pos in zip(self.ir.assignments, self.ir.positions)]
            raise lowering_error(self.model, lines, exc).with_source(self.model.text.splitlines()) from None

    def lower(self) -> None:
        """Print the code of both backends (before ``source`` passes), as a build would: what cannot be compiled
        is a SpecError now (``flexsn-dsl check``)."""
        self.torch_source  # noqa: B018
        self.kernel_text  # noqa: B018

    def _run_stage(self, stage: str, value, *args):
        for p in self.passes:
            if p.stage != stage:
                continue
            try:
                value = _run_pass(p, value, *args, neuron=self.model.name)
            except PluginError as exc:
                if not p.default or p.name in self.requested:
                    raise
                warnings.warn(f"flexsn-dsl: {exc.message} (a default pass: skipped for {self.model.name!r})",
                              stacklevel=3)
        return value

    @cached_property
    def key(self) -> str:
        """A hash of everything the generated text depends on: the package's source, the spec text,
        parameter values, the surrogate (formula and merged parameters), every plugin module's source,
        the passes' code and, when IR passes ran, the IR they returned (whatever code they import)."""
        ir_passes = any(p.stage == "ir" for p in self.passes)
        blob = json.dumps([GENERATOR_VERSION, self.model.text, sorted(self.values.items()),
                           _plugin_identity(self.model, self.passes), self.plugin_code,
                           _ir_identity(self.ir) if ir_passes else None])
        return hashlib.sha256(blob.encode()).hexdigest()

    @property
    def header(self) -> str:
        """The generated modules' comment header: fixed text, checked names and numbers only (never
        the spec's file name or any other text from the spec, a plugin or a pass)."""
        values = ", ".join(f"{identifier(k)}={float_literal(v)}" for k, v in self.values.items()) or "none"
        learnable = ", ".join(identifier(n) for n in self.model.learnable) or "none"
        passes = ", ".join(identifier(p.name) for p in self.passes) or "none"
        surrogate = self.model.surrogate
        surrogate_params = ", ".join(f"{identifier(k)}={float_literal(v)}"
                                     for k, v in self.model.surrogate_params.items())
        return (f"# Generated by flexsn-dsl {__version__} for neuron {identifier(self.model.name, True)}. "
                f"Do not edit.\n# Cache key: {_hex(self.key)}\n"
                f"# Parameter values: {values}; learnable: {learnable}; passes: {passes}.\n"
                f"# Surrogate: {identifier(surrogate.name)}({surrogate_params})")

    @cached_property
    def torch_source(self) -> str:
        with self._lowering():
            return torch_source(self.model, self.ir, self.header)

    @cached_property
    def torch_namespace(self) -> dict:
        """The generated torch step as an importable module's namespace (torch.compile needs one)."""
        name = f"flexsn_dsl_torch_{self.module_name}"
        with _LOCK:
            if name not in sys.modules:
                import_source(name, self.torch_source, f"<flexsn-dsl torch step {self.module_name}>")
            return sys.modules[name].__dict__

    @cached_property
    def cores(self) -> Cores:
        with self._lowering():
            return build_cores(self.ir)

    @cached_property
    def parallel(self) -> Affine | str:
        """The step as an affine map of the states (time-parallel kernels), or why it runs sequentially."""
        with self._lowering():
            return analyse(self.ir)

    @cached_property
    def kernel_text(self) -> str:
        """The Triton module's text before the ``source``-stage passes; with the time-parallel kernels
        (:mod:`flexsn_dsl.scan_templates`) for a step affine in its states."""
        text = module_source(self.cores, self.header)
        if isinstance(self.parallel, Affine):
            with self._lowering():
                text += "\n\n" + scan_source(self.cores, self.parallel)
        return text

    @cached_property
    def triton_source(self) -> str:
        """The Triton module's text after the ``source``-stage passes."""
        return self._run_stage("source", self.kernel_text, self.module_name)

    @property
    def module_name(self) -> str:
        return f"{self.model.name}_{self.key[:16]}"

    def write(self, folder: Path | None = None) -> Path:
        """Write the Triton module to the cache (or ``folder``) under its key and return its path."""
        path = (folder or cache_dir()) / f"{self.module_name}.py"
        write_cached(path, self.key, self.triton_source)
        return path

    def triton_module(self) -> ModuleType:
        """Import the generated kernels. A cached module whose first line holds this key and the hash
        of the rest is run from the bytes read (no sympy work); anything else in its place is
        regenerated and replaced. With ``source`` passes the text is always regenerated (a pass may
        depend on more than the key covers). The module runs from memory: nothing is re-read."""
        name = f"flexsn_dsl_kernels_{self.module_name}"
        with _LOCK:
            if name not in sys.modules:
                path = cache_dir() / f"{self.module_name}.py"
                source_passes = any(p.stage == "source" for p in self.passes)
                text = None if source_passes else read_cached(path, self.key)
                if text is None:
                    text = self.triton_source
                    try:
                        write_cached(path, self.key, text)
                    except OSError as exc:
                        warnings.warn(f"flexsn-dsl: cannot write the kernel cache file {str(path)!r} "
                                      f"({exc.strerror or exc}); the kernels run from memory", stacklevel=3)
                use_interpreter_without_gpu()  # (before the module imports Triton)
                import_source(name, text, f"<flexsn-dsl kernels {path}>")
            return sys.modules[name]

    @property
    def info(self):
        """The FlexSNInfo of the generated kernels."""
        return self.triton_module().INFO


def _hex(key: str) -> str:
    """A cache key (a sha256 hex digest) checked before it is printed."""
    if not isinstance(key, str) or not key or key.strip("0123456789abcdef"):
        raise ValueError(f"{key!r} is not a cache key")
    return key


def _plugin_identity(model: NeuronModel, passes: Iterable[Pass]) -> list:
    """What plugins contribute to generated code: the surrogate's formula and each pass's code."""
    surrogate = model.surrogate
    return [[surrogate.name, surrogate.origin, sympy.srepr(surrogate.gradient), sorted(surrogate.params.items()),
             sorted(model.surrogate_params.items())],
            [[p.name, p.stage, p.origin, p.fingerprint] for p in passes]]


def _ir_identity(ir: StepIR) -> str:
    """The IR as text (for the cache key when IR passes rewrote it)."""
    return sympy.srepr([ir.name, list(ir.inputs), list(ir.states), list(ir.params), [list(a) for a in ir.assignments],
                        list(ir.outputs), list(ir.next_states), ir.surrogate, list(ir.output_names),
                        list(ir.initial_states)])


def _run_pass(p: Pass, value, *args, neuron: str):
    """Run one pass on ``value`` (a StepIR or the module text of ``neuron``) and check what it returns."""
    what = f"code-generation pass {p.name!r} (stage {p.stage})"
    try:
        result = p.function(value, *args)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - any failure of plugin code (SystemExit too) is the plugin's
        raise plugin_error(p.origin, f"{what} raised {describe_exception(exc, source_path(p.function))}",
                           "fix the pass, or build without it") from None
    if p.stage == "ir":
        if not isinstance(result, StepIR):
            raise plugin_error(p.origin, f"{what} returned {type(result).__name__}, expected a StepIR",
                               "return the rewritten IR, e.g. `return ir.replace_exprs(rewrite)`")
        problem = _ir_problem(result, value)
        if problem:
            raise plugin_error(p.origin, f"{what} returned an invalid IR: {problem}")
    else:
        if not isinstance(result, str):
            raise plugin_error(p.origin, f"{what} returned {type(result).__name__}, expected str (the module text)",
                               "return the rewritten source text")
        try:
            tree = ast.parse(result, f"<{p.name} output>")
        except (SyntaxError, ValueError) as exc:
            where = f" at line {exc.lineno}: {(exc.text or '').strip()!r}" if isinstance(exc, SyntaxError) else ""
            raise plugin_error(p.origin, f"{what} returned text that is not valid Python: "
                                         f"{getattr(exc, 'msg', exc)}{where}") from None
        missing = sorted({"INFO", *(kernel_name(neuron, v) for v in VARIANTS)} - _top_level_names(tree))
        if missing:
            raise plugin_error(p.origin, f"{what} returned a module without {', '.join(missing)}",
                               "rewrite the module's text, keeping INFO and every kernel")
    return result


def _top_level_names(tree: ast.Module) -> set[str]:
    """The names a module's top-level statements define."""
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, (ast.Assign, ast.AnnAssign)):
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                names |= {n.id for n in ast.walk(target) if isinstance(n, ast.Name)}
        elif isinstance(node, (ast.Import, ast.ImportFrom)):
            names |= {(a.asname or a.name).split(".")[0] for a in node.names}
    return names


def _name_problem(name: object, neuron: str) -> str:
    """Why an IR name cannot be printed ('' when it can)."""
    try:
        identifier(name)
    except ValueError as exc:
        return str(exc)
    if name in RESERVED_NAMES or name in generated_names(neuron) or name.startswith("_"):
        return f"{name!r} is reserved for the generated code"
    return ""


def _ir_problem(ir: StepIR, before: StepIR) -> str:
    """Why an IR returned by a pass (given ``before``) cannot be compiled ('' when it can)."""
    for field_name in ("name", "input_names", "state_names", "param_names", "fixed_names", "shaped",
                       "output_names"):
        if getattr(ir, field_name) != getattr(before, field_name):
            return f"{field_name} changed from {getattr(before, field_name)!r} to {getattr(ir, field_name)!r} " \
                   "(a pass may rewrite expressions, not the neuron's interface)"
    if not ir.outputs or len(ir.outputs) != len(ir.output_names) or len(ir.next_states) != len(ir.states):
        return f"{len(ir.outputs)} outputs for {len(ir.output_names)} output names and {len(ir.next_states)} " \
               f"next states for {len(ir.states)} states"
    defined = set(ir.inputs) | set(ir.states) | set(ir.params) | set(ir.fixed) | set(ir.draws)
    printer = Printer(TORCH)
    for sym, expr in ir.assignments:
        if not isinstance(sym, sympy.Symbol):
            return f"assignment target {sym!r} is not a sympy Symbol"
        problem = _name_problem(sym.name, ir.name)
        if problem:
            return f"assignment target: {problem}"
        if not isinstance(expr, sympy.Expr):
            return f"line {sym.name!r} is {type(expr).__name__} {expr}, not an expression"
        unknown = sorted(s.name for s in expr.free_symbols - defined)
        if unknown:
            return f"line {sym.name!r} uses {unknown}, which are not inputs, states, runtime parameters, " \
                   "draws or assigned before it"
        try:
            printer(expr)
        except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
            return f"line {sym.name!r} = {expr} cannot be printed: {exc}"
        defined.add(sym)
    for sym in (*ir.outputs, *ir.next_states):
        if sym not in defined:
            return f"output or next state {sym} is never assigned"
    if not isinstance(ir.surrogate, sympy.Expr) or ir.surrogate.free_symbols - {X}:
        return f"surrogate {ir.surrogate} must be an expression in x only"
    return ""


def _fails(expr: sympy.Expr) -> bool:
    """Whether printing ``expr`` or its first derivatives (by each of its symbols) fails in either dialect."""
    try:
        for e in [expr, *(expr.diff(s) for s in sorted(expr.free_symbols, key=str))]:
            e = e.replace(lambda f: isinstance(f, SurrogateGrad), lambda f: f.args[0])
            Printer(TORCH)(e), Printer(TRITON)(e)
    except (ValueError, TypeError, ArithmeticError, NotImplementedError, RecursionError):
        return True
    return False


def lowering_error(model: NeuronModel, lines: list[tuple[sympy.Expr, SourcePos | None]], exc: Exception) -> SpecError:
    """A failure while lowering ``lines`` (an expression, where it was written) as a SpecError at the line that
    causes it: the first whose expression alone fails to print or to differentiate, else the section of the
    lines (`step` or `equations`)."""
    text = "sympy rewrites one of its comparisons back and forth" if isinstance(exc, RecursionError) else str(exc)
    pos = next((pos for expr, pos in lines if pos is not None and _fails(expr)), None) or \
        model.positions.get("equations" if model.continuous else "step")
    hint = CANONICAL_LOOP_HINT if isinstance(exc, RecursionError) else \
        "rewrite the line with other functions, and report the message to the maintainers of flexsn-dsl"
    return SpecError(f"cannot compile neuron {model.name!r}: {text}", pos, hint)


_COMPILED: dict[tuple, Compiled] = {}


def compile_spec(source: str | os.PathLike | None = None, *, text: str | None = None,
                 params: dict[str, float] | None = None, plugins: Iterable[str] = (),
                 passes: Iterable[str] = ()) -> Compiled:
    """Validate a spec (a path, or ``text=``) and prepare its lowering (cached in memory)."""
    registry = get_plugins(plugins)
    if text is None:
        model = read_model(source, registry)
    else:
        model = build_model(text, str(source or "<string>"), registry)
    values = resolve_params(model, params)
    requested = _requested_passes(model, registry, passes)
    selected = _select_passes(model, registry, passes)
    key = (model.file, model.text, tuple(sorted(values.items())), requested,
           json.dumps(_plugin_identity(model, selected)), tuple(registry.sources), registry.code)
    if any(p.stage == "ir" for p in selected):
        # run the IR passes every time (what they return may depend on more than their code); a failing
        # pass is reported now, at load/check time; an identical IR reuses the lowering done for it
        fresh = Compiled(model, values, selected, requested, registry.code)
        return _COMPILED.setdefault((*key, fresh.key), fresh)
    if key not in _COMPILED:
        _COMPILED[key] = Compiled(model, values, selected, requested, registry.code)
    compiled = _COMPILED[key]
    if model.continuous is not None:
        compiled.ir  # noqa: B018 - lower now: a spec the lowering refuses is reported at load/check time
    return compiled
