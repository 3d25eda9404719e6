"""Plugin discovery and the registries plugins fill (surrogates, code-generation passes).

Plugins come from, in this order: the built-in catalogue, installed packages
(entry-point group ``flexsn_dsl``, sorted by entry-point name), then Python
files named by the user (the environment variable ``FLEXSN_DSL_PLUGINS``, a
``os.pathsep``-separated list, then ``flexsn-dsl ... --plugin FILE`` or
``flexsn_dsl.load(..., plugins=[FILE])``). Each plugin's hooks run in that
order, so on a name clash the earlier plugin keeps the name.

A plugin that fails to import, implements an unknown hook, raises in a hook or
registers something invalid is reported as a :class:`flexsn_dsl.PluginError`
whose message starts with ``plugin NAME`` (and whose ``plugin`` attribute is
that name); it is skipped and every other plugin still loads. The errors are
kept in :attr:`Plugins.errors`, shown as warnings by :func:`get_plugins`, by
``flexsn-dsl plugins``, and in the message for an unknown surrogate or pass.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import inspect
import keyword
import math
import os
import sys
import traceback
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pluggy
import sympy

from . import builtin_surrogates, hookspecs
from .errors import PluginError, SourcePos, SpecError
from .expressions import SURROGATE_FUNCTIONS, ExpressionParser, closest
from .symbolic import real_symbol

ENTRY_POINT_GROUP = "flexsn_dsl"
BUILTIN = "flexsn_dsl.builtin_surrogates"
PASS_STAGES = ("ir", "source")            # the order stages run in
PASS_ARGUMENTS = {"ir": ("ir",), "source": ("source", "module_name")}
X = real_symbol("x")
# where every registered gradient must be a finite real number (default parameters)
CHECK_POINTS = (-2.0, -1.0, -0.5, -0.1, 0.0, 0.1, 0.5, 1.0, 2.0)


def plugin_error(plugin: str, message: str, hint: str = "") -> PluginError:
    """A PluginError for ``plugin``: the message starts with ``plugin NAME``; ``.plugin`` is NAME."""
    error = PluginError(f"plugin {plugin}: {message}", hint=hint)
    error.plugin = plugin
    return error


def _check_identifier(kind: str, name: Any, origin: str) -> None:
    if not isinstance(name, str) or not name.isidentifier() or keyword.iskeyword(name):
        raise plugin_error(origin, f"{kind} name {name!r} is not an identifier",
                           "use letters, digits and underscores, not starting with a digit, and no Python keyword")


@dataclass(frozen=True)
class Surrogate:
    """A surrogate gradient g(x) with default parameter values."""

    name: str
    gradient: sympy.Expr
    params: dict[str, float]
    origin: str
    text: str
    description: str = ""

    def gradient_with(self, values: dict[str, float]) -> sympy.Expr:
        """g(x) with the given parameter values substituted."""
        return self.gradient.xreplace({real_symbol(k): sympy.Float(v) for k, v in values.items()})


@dataclass(frozen=True)
class Pass:
    """A code-generation pass (see :mod:`flexsn_dsl.hookspecs`)."""

    name: str
    stage: str
    function: Callable
    order: int
    default: bool
    origin: str
    description: str
    fingerprint: str = ""  # changes when the pass's code (or captured values) change: part of the cache key

    @property
    def sort_key(self) -> tuple:
        """Run order: stage (ir, then source), then ``order``, then name."""
        return (PASS_STAGES.index(self.stage), self.order, self.name)


def _stable_repr(value: Any, depth: int = 0) -> str:
    """A repr without memory addresses (for fingerprints that must hold across processes)."""
    if isinstance(value, (int, float, complex, str, bytes, bool, type(None))):
        return repr(value)
    if isinstance(value, (tuple, list, set, frozenset)) and depth < 3:
        items = sorted(_stable_repr(v, depth + 1) for v in value) if isinstance(value, (set, frozenset)) \
            else [_stable_repr(v, depth + 1) for v in value]
        return f"{type(value).__name__}({', '.join(items)})"
    if isinstance(value, dict) and depth < 3:
        return "{" + ", ".join(f"{_stable_repr(k, depth + 1)}: {_stable_repr(v, depth + 1)}"
                               for k, v in value.items()) + "}"
    if isinstance(value, sympy.Basic):
        return sympy.srepr(value)
    if callable(value):
        return f"<{getattr(value, '__module__', '?')}.{getattr(value, '__qualname__', type(value).__qualname__)}>"
    return f"<{type(value).__module__}.{type(value).__qualname__}>"


def fingerprint(function: Callable) -> str:
    """A hash of a pass function: its module's source file, its name, code, defaults and closure values."""
    digest = hashlib.sha256()
    target = inspect.unwrap(function) if inspect.isfunction(function) else function
    if not inspect.isfunction(target) and not inspect.ismethod(target):
        digest.update(_stable_repr(target).encode())
        target = getattr(type(target), "__call__", target)
    try:
        digest.update(Path(inspect.getsourcefile(target) or "").read_bytes())
    except (OSError, TypeError):
        pass
    code = getattr(target, "__code__", None)
    if code is not None:
        digest.update(code.co_code + _stable_repr(code.co_consts).encode())
    digest.update(_stable_repr(getattr(target, "__qualname__", "")).encode())
    digest.update(_stable_repr(getattr(target, "__defaults__", None)).encode())
    digest.update(_stable_repr(getattr(target, "__kwdefaults__", None)).encode())
    for cell in getattr(target, "__closure__", None) or ():
        try:
            digest.update(_stable_repr(cell.cell_contents).encode())
        except ValueError:  # an empty cell
            pass
    return digest.hexdigest()[:16]


class SurrogateRegistry:
    """What ``flexsn_dsl_register_surrogates(registry)`` receives."""

    def __init__(self) -> None:
        self.items: dict[str, Surrogate] = {}
        self.origin = "?"

    def __contains__(self, name: str) -> bool:
        return name in self.items

    def register(self, name: str, gradient: str | sympy.Expr, params: dict[str, float] | None = None,
                 description: str = "") -> None:
        """Register surrogate ``name`` with gradient g(x) (see the hookspec); raises PluginError."""
        origin = self.origin
        _check_identifier("surrogate", name, origin)
        if name in self.items:
            raise plugin_error(origin, f"surrogate {name!r} is already registered by plugin {self.items[name].origin}",
                               "choose another name (or set its parameters in the spec: "
                               f"surrogate: {{name: {name}, ...}})")
        if not isinstance(params, (dict, type(None))):
            raise plugin_error(origin, f"surrogate {name!r}: params must be a dict name -> number, got {params!r}")
        params = dict(params or {})
        for key, value in params.items():
            _check_identifier(f"surrogate {name!r} parameter", key, origin)
            if key == "x":
                raise plugin_error(origin, f"surrogate {name!r} may not have a parameter named 'x'",
                                   "x is the argument of spike; rename the parameter")
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise plugin_error(origin, f"surrogate {name!r} parameter {key!r} must be a finite number, got {value!r}")
            params[key] = float(value)
        env = {"x": X, "E": sympy.E, **{k: real_symbol(k) for k in params}}
        allowed = f"x and the parameters {sorted(params)}" if params else "x (declare parameters with params={...})"
        if isinstance(gradient, sympy.Basic):
            if not isinstance(gradient, sympy.Expr):
                raise plugin_error(origin, f"surrogate {name!r} gradient must be an expression, got {gradient!r}")
            by_name = {s.name: env.get(s.name) for s in gradient.free_symbols}
            unknown = sorted(n for n, s in by_name.items() if s is None)
            if unknown:
                raise plugin_error(origin, f"surrogate {name!r} gradient uses unknown names {unknown}", f"use {allowed}")
            expr = gradient.xreplace({s: by_name[s.name] for s in gradient.free_symbols})
            text = str(gradient)
        elif isinstance(gradient, str):
            parser = ExpressionParser(env, SURROGATE_FUNCTIONS, what=f"gradient of surrogate {name!r}")
            try:
                expr = parser.parse(gradient, lambda line, col: SourcePos(f"<plugin {origin}>", line, col + 1))
            except SpecError as exc:
                hint = exc.hint
                if "unknown name" in exc.message and not hint.startswith("did you mean"):
                    hint = f"use {allowed}"
                raise plugin_error(origin, f"surrogate {name!r}: {exc.message} at column {exc.col} of "
                                           f"{gradient!r}", hint) from None
            text = gradient
        else:
            raise plugin_error(origin, f"surrogate {name!r} gradient must be a string or a sympy expression, "
                                       f"got {type(gradient).__name__}")
        expr = sympy.sympify(expr)
        _check_gradient(origin, name, expr, params)
        self.items[name] = Surrogate(name, expr, params, origin, text, str(description or "").strip())


def _check_gradient(origin: str, name: str, expr: sympy.Expr, params: dict[str, float]) -> None:
    """The gradient must print for both backends and be finite and real near the threshold."""
    from .printer import TORCH, TRITON, Printer  # late: the printer is only needed here

    for dialect in (TORCH, TRITON):
        try:
            Printer(dialect)(expr)
        except (ValueError, TypeError, KeyError, NotImplementedError) as exc:
            raise plugin_error(origin, f"surrogate {name!r} gradient {expr} cannot be generated for "
                                       f"{dialect.name}: {exc}",
                               "use x, numbers and the functions of the language "
                               "(exp log sqrt abs tanh sigmoid min max clip where Abs Max Min Heaviside ...)") from None
    values = {real_symbol(k): sympy.Float(v) for k, v in params.items()}
    for point in CHECK_POINTS:
        try:
            value = complex(sympy.N(expr.xreplace({**values, X: sympy.Float(point)})))
        except (TypeError, ValueError, ZeroDivisionError, OverflowError):
            value = complex("nan")
        if not (math.isfinite(value.real) and abs(value.imag) < 1e-12):
            shown = "nan" if math.isnan(value.real) else value
            raise plugin_error(origin, f"surrogate {name!r} gradient {expr} is not a finite real number at "
                                       f"x={point:g} with the default parameters {params} (got {shown})",
                               "check the formula (e.g. a division by zero, or sqrt/log of a negative number)")


class PassRegistry:
    """What ``flexsn_dsl_register_passes(registry)`` receives."""

    def __init__(self) -> None:
        self.items: dict[str, Pass] = {}
        self.origin = "?"

    def __contains__(self, name: str) -> bool:
        return name in self.items

    def register(self, name: str, stage: str, function: Callable, order: int = 100, default: bool = False,
                 description: str = "") -> None:
        """Register pass ``name`` (see the hookspec for stages and order); raises PluginError."""
        origin = self.origin
        _check_identifier("pass", name, origin)
        if name in self.items:
            raise plugin_error(origin, f"pass {name!r} is already registered by plugin {self.items[name].origin}",
                               "choose another name")
        if stage not in PASS_STAGES:
            raise plugin_error(origin, f"pass {name!r} has unknown stage {stage!r}",
                               f"stages, in the order they run: {', '.join(PASS_STAGES)}")
        if not callable(function):
            raise plugin_error(origin, f"pass {name!r}: function {function!r} is not callable")
        try:
            inspect.signature(function).bind(*PASS_ARGUMENTS[stage])
        except TypeError:
            wanted = ", ".join(PASS_ARGUMENTS[stage])
            raise plugin_error(origin, f"pass {name!r} (stage {stage!r}) must accept ({wanted}), "
                                       f"its function is {getattr(function, '__name__', function)}"
                                       f"{inspect.signature(function)}") from None
        except ValueError:  # no signature (a builtin): let it run
            pass
        if isinstance(order, bool) or not isinstance(order, int):
            raise plugin_error(origin, f"pass {name!r}: order must be an integer, got {order!r}")
        doc = (getattr(function, "__doc__", None) or "").strip().split("\n")[0]
        self.items[name] = Pass(name, stage, function, order, bool(default), origin,
                                str(description or doc).strip(), fingerprint(function))


@dataclass
class Plugins:
    """The loaded plugins: registries, where each plugin came from, and what failed."""

    surrogates: dict[str, Surrogate]
    passes: dict[str, Pass]
    sources: list[tuple[str, str]]  # (plugin name, where it came from), in load order
    errors: list[PluginError] = field(default_factory=list)
    code: str = ""  # a hash of every registered plugin's module source: part of the cache key

    def surrogate(self, name: str) -> Surrogate | None:
        return self.surrogates.get(name)

    def pass_(self, name: str) -> Pass | None:
        return self.passes.get(name)

    def broken(self) -> str:
        """' (plugins that failed: ...)' for messages about unknown names, or ''."""
        if not self.errors:
            return ""
        return f" (plugins that failed to load: {'; '.join(e.message for e in self.errors)})"

    def unknown_pass(self, name: str) -> SpecError:
        hint = closest(name, self.passes) or \
            f"passes: {', '.join(sorted(self.passes)) or 'none registered'} (see `flexsn-dsl plugins`)"
        return SpecError(f"unknown code-generation pass {name!r}{self.broken()}", hint=hint)


# -- discovery -----------------------------------------------------------------
def source_path(function: Any) -> Path | None:
    """The file a plugin function was defined in, if known."""
    try:
        return Path(inspect.getsourcefile(inspect.unwrap(function))).resolve()
    except (TypeError, OSError, ValueError):
        return None


def describe_exception(exc: BaseException, path: Path | None = None) -> str:
    """``Type: message (at FILE line N)``: the deepest frame in ``path`` when given, else the last frame."""
    frames = traceback.extract_tb(exc.__traceback__)
    where = ""
    inside = [f for f in frames if path is not None and Path(f.filename).resolve() == path]
    if inside:
        where = f" (at {path.name} line {inside[-1].lineno})"
    elif frames:
        where = f" (at {Path(frames[-1].filename).name} line {frames[-1].lineno})"
    if isinstance(exc, SyntaxError) and exc.lineno:
        where = f" (at {Path(exc.filename or '?').name} line {exc.lineno})"
    return f"{type(exc).__name__}: {exc}{where}"


def _code_digest(plugin: Any) -> str:
    """A hash of a plugin's module source (its repr when it has no source file)."""
    owner = plugin if inspect.ismodule(plugin) or inspect.isclass(plugin) else type(plugin)
    try:
        data = Path(inspect.getsourcefile(owner)).read_bytes()
    except (TypeError, OSError):
        data = _stable_repr(plugin).encode()
    return hashlib.sha256(data).hexdigest()


def _load_file(path: str) -> Any:
    resolved = Path(path)
    if not resolved.is_file():
        raise plugin_error(str(path), "plugin file does not exist", "check the path given to --plugin, plugins= "
                           "or FLEXSN_DSL_PLUGINS")
    module_name = "flexsn_dsl_plugin_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    if spec is None or spec.loader is None:
        raise plugin_error(str(path), "is not a Python file", "give a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module  # dataclasses, pickling and typing look modules up here
    try:
        spec.loader.exec_module(module)
    except KeyboardInterrupt:
        raise
    except BaseException as exc:  # noqa: BLE001 - SystemExit at import is a broken plugin too
        sys.modules.pop(module_name, None)
        raise plugin_error(str(path), f"failed to import: {describe_exception(exc, resolved)}") from None
    return module


def _env_files() -> list[str]:
    return [p for p in os.environ.get("FLEXSN_DSL_PLUGINS", "").split(os.pathsep) if p.strip()]


def _entry_where(entry: importlib.metadata.EntryPoint) -> str:
    dist = getattr(entry, "dist", None)
    package = f" from {dist.name} {dist.version}" if dist is not None else ""
    return f"entry point {entry.name} = {entry.value}{package}"


def _unknown_hooks(manager: pluggy.PluginManager, plugin: Any, name: str) -> list[PluginError]:
    """@hookimpl functions whose name is not a hook, and hook-named functions without @hookimpl
    (pluggy would ignore both silently)."""
    known = {n for n in dir(hookspecs) if n.startswith("flexsn_dsl_")}
    errors = []
    for attr in dir(plugin):
        try:
            opts = manager.parse_hookimpl_opts(plugin, attr)
        except Exception:  # noqa: BLE001 - odd attributes are not hooks
            opts = None
        if opts is not None and attr not in known:
            hint = closest(attr, known) or f"hooks: {', '.join(sorted(known))}"
            errors.append(plugin_error(name, f"@hookimpl function {attr!r} is not a flexsn-dsl hook", hint))
        elif opts is None and attr in known and callable(getattr(plugin, attr, None)):
            errors.append(plugin_error(name, f"function {attr!r} is not marked as a hook, so it never runs",
                                       "decorate it with @flexsn_dsl.hookimpl"))
    return errors


def _discover(files: tuple[str, ...]) -> Plugins:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    errors: list[PluginError] = []
    ordered: list[tuple[str, str]] = []
    code = hashlib.sha256()

    def add(plugin: Any, name: str, where: str) -> None:
        errors.extend(_unknown_hooks(manager, plugin, name))
        try:
            manager.register(plugin, name=name)
            ordered.append((name, where))
            code.update(f"{name}\0{_code_digest(plugin)}\0".encode())
        except Exception as exc:  # noqa: BLE001 - a bad hookimpl signature, a duplicate name
            errors.append(plugin_error(name, f"({where}) could not be registered: {exc}"))

    add(builtin_surrogates, BUILTIN, "built in")
    try:
        entries = sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name)
    except Exception as exc:  # noqa: BLE001 - broken metadata on sys.path
        entries = []
        errors.append(plugin_error("<entry points>", f"could not read the {ENTRY_POINT_GROUP!r} entry points: {exc}"))
    for entry in entries:
        where = _entry_where(entry)
        try:
            plugin = entry.load()
        except (Exception, SystemExit) as exc:  # noqa: BLE001 - report any import failure, keep going
            errors.append(plugin_error(entry.name, f"({where}) failed to import: {describe_exception(exc)}"))
            continue
        add(plugin, entry.name, where)
    for path in files:
        try:
            plugin = _load_file(path)
        except PluginError as exc:
            errors.append(exc)
            continue
        add(plugin, str(path), f"file {path}")

    rank = {name: i for i, (name, _) in enumerate(ordered)}
    surrogates, passes = SurrogateRegistry(), PassRegistry()
    for hook_name, registry in (("flexsn_dsl_register_surrogates", surrogates), ("flexsn_dsl_register_passes", passes)):
        impls = getattr(manager.hook, hook_name).get_hookimpls()
        for impl in sorted(impls, key=lambda i: rank.get(i.plugin_name, len(rank))):
            registry.origin = impl.plugin_name
            try:
                impl.function(registry)
            except PluginError as exc:
                if not hasattr(exc, "plugin"):
                    exc.plugin = impl.plugin_name
                errors.append(exc)
            except Exception as exc:  # noqa: BLE001 - a hook that raises is reported, the others still run
                errors.append(plugin_error(impl.plugin_name, f"raised in {hook_name}: "
                                                              f"{describe_exception(exc, source_path(impl.function))}"))
    return Plugins(surrogates.items, passes.items, ordered, errors, code.hexdigest())


_CACHE: dict[tuple[str, ...], Plugins] = {}


def _as_list(items: Iterable[str | os.PathLike] | str | os.PathLike | None) -> list:
    if items is None:
        return []
    if isinstance(items, (str, os.PathLike)):
        return [items]
    return list(items)


def plugin_key(files: Iterable[str | os.PathLike] | str | os.PathLike = ()) -> tuple[str, ...]:
    """The resolved plugin files (FLEXSN_DSL_PLUGINS first), without repeats."""
    key: list[str] = []
    for f in [*_env_files(), *_as_list(files)]:
        resolved = str(Path(f).expanduser().resolve())
        if resolved not in key:
            key.append(resolved)
    return tuple(key)


def get_plugins(files: Iterable[str | os.PathLike] | str | os.PathLike = (), warn: bool = True) -> Plugins:
    """The plugins: built in, entry points, FLEXSN_DSL_PLUGINS and these extra files (cached).

    Broken plugins are reported once per set of files as warnings (``warn=False``
    leaves that to the caller: see :attr:`Plugins.errors`).
    """
    key = plugin_key(files)
    if key not in _CACHE:
        plugins = _discover(key)
        _CACHE[key] = plugins
        if warn:
            for error in plugins.errors:
                warnings.warn(f"flexsn-dsl: {error.message}", stacklevel=3)
    return _CACHE[key]


def clear_cache() -> None:
    """Forget discovered plugins (after installing one at run time, in tests)."""
    _CACHE.clear()
    importlib.invalidate_caches()
