"""Plugin discovery and the registries plugins fill (surrogates, code-generation passes).

Plugins come from, in this order: the built-in catalogue, installed packages
(entry-point group ``flexsn_dsl``), then Python files named by the user
(``flexsn-dsl --plugin FILE``, ``flexsn_dsl.load(..., plugins=[FILE])`` or the
environment variable ``FLEXSN_DSL_PLUGINS``, a ``os.pathsep``-separated list).
A plugin that fails to import or registers something invalid is reported with
its name and skipped; the others still load.
"""
from __future__ import annotations

import hashlib
import importlib.metadata
import importlib.util
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable

import pluggy
import sympy

from . import builtin_surrogates, hookspecs
from .errors import PluginError, SourcePos, SpecError
from .expressions import SURROGATE_FUNCTIONS, ExpressionParser
from .symbolic import real_symbol

ENTRY_POINT_GROUP = "flexsn_dsl"
BUILTIN = "flexsn_dsl.builtin_surrogates"
PASS_STAGES = ("ir", "source")
X = real_symbol("x")


def _check_identifier(kind: str, name: Any, origin: str) -> None:
    if not isinstance(name, str) or not name.isidentifier():
        raise PluginError(f"plugin {origin}: {kind} name {name!r} is not an identifier")


@dataclass(frozen=True)
class Surrogate:
    """A surrogate gradient g(x) with default parameter values."""

    name: str
    gradient: sympy.Expr
    params: dict[str, float]
    origin: str
    text: str

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


class SurrogateRegistry:
    """What ``flexsn_dsl_register_surrogates(registry)`` receives."""

    def __init__(self) -> None:
        self.items: dict[str, Surrogate] = {}
        self.origin = "?"

    def register(self, name: str, gradient: str | sympy.Expr, params: dict[str, float] | None = None,
                 description: str = "") -> None:
        origin = self.origin
        _check_identifier("surrogate", name, origin)
        if name in self.items:
            raise PluginError(f"plugin {origin}: surrogate {name!r} is already registered by {self.items[name].origin}",
                              hint="choose another name")
        params = dict(params or {})
        for key, value in params.items():
            _check_identifier("surrogate parameter", key, origin)
            if key == "x":
                raise PluginError(f"plugin {origin}: surrogate {name!r} may not have a parameter named 'x' "
                                  "(x is the argument of spike)")
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise PluginError(f"plugin {origin}: surrogate {name!r} parameter {key!r} must be a number, got {value!r}")
            params[key] = float(value)
        env = {"x": X, **{k: real_symbol(k) for k in params}}
        if isinstance(gradient, sympy.Basic):
            by_name = {s.name: env.get(s.name) for s in gradient.free_symbols}
            unknown = sorted(n for n, s in by_name.items() if s is None)
            if unknown:
                raise PluginError(f"plugin {origin}: surrogate {name!r} gradient uses unknown names {unknown}",
                                  hint=f"use x and the declared parameters {sorted(params)}")
            expr = gradient.xreplace({s: by_name[s.name] for s in gradient.free_symbols})
            text = str(gradient)
        elif isinstance(gradient, str):
            parser = ExpressionParser(env, SURROGATE_FUNCTIONS, what=f"gradient of surrogate {name!r}")
            try:
                expr = parser.parse(gradient, lambda line, col: SourcePos(f"<plugin {origin}>", line, col + 1))
            except SpecError as exc:
                raise PluginError(f"plugin {origin}: surrogate {name!r}: {exc.message} "
                                  f"(column {exc.col} of {gradient!r})", hint=exc.hint) from None
            text = gradient
        else:
            raise PluginError(f"plugin {origin}: surrogate {name!r} gradient must be a string or sympy expression")
        self.items[name] = Surrogate(name, sympy.sympify(expr), params, origin, description or text)


class PassRegistry:
    """What ``flexsn_dsl_register_passes(registry)`` receives."""

    def __init__(self) -> None:
        self.items: dict[str, Pass] = {}
        self.origin = "?"

    def register(self, name: str, stage: str, function: Callable, order: int = 100, default: bool = False,
                 description: str = "") -> None:
        origin = self.origin
        _check_identifier("pass", name, origin)
        if name in self.items:
            raise PluginError(f"plugin {origin}: pass {name!r} is already registered by {self.items[name].origin}")
        if stage not in PASS_STAGES:
            raise PluginError(f"plugin {origin}: pass {name!r} has unknown stage {stage!r}",
                              hint=f"stages: {', '.join(PASS_STAGES)}")
        if not callable(function):
            raise PluginError(f"plugin {origin}: pass {name!r} function is not callable")
        self.items[name] = Pass(name, stage, function, int(order), bool(default), origin,
                                description or (function.__doc__ or "").strip().split("\n")[0])


@dataclass
class Plugins:
    """The loaded plugins: registries, where each came from, and what failed."""

    surrogates: dict[str, Surrogate]
    passes: dict[str, Pass]
    sources: list[tuple[str, str]]  # (plugin name, where it came from)
    errors: list[PluginError] = field(default_factory=list)

    def surrogate(self, name: str) -> Surrogate | None:
        return self.surrogates.get(name)


def _load_file(path: str) -> Any:
    resolved = Path(path).expanduser().resolve()
    if not resolved.is_file():
        raise PluginError(f"plugin file {path} does not exist")
    module_name = "flexsn_dsl_plugin_" + hashlib.sha1(str(resolved).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, resolved)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _env_files() -> list[str]:
    return [p for p in os.environ.get("FLEXSN_DSL_PLUGINS", "").split(os.pathsep) if p]


def _discover(files: tuple[str, ...]) -> Plugins:
    manager = pluggy.PluginManager(hookspecs.PROJECT)
    manager.add_hookspecs(hookspecs)
    errors: list[PluginError] = []
    ordered: list[tuple[str, str]] = []

    def add(plugin: Any, name: str, where: str) -> None:
        try:
            manager.register(plugin, name=name)
            ordered.append((name, where))
        except Exception as exc:  # a bad hookimpl signature, a duplicate name
            errors.append(PluginError(f"plugin {name} ({where}) could not be registered: {exc}"))

    add(builtin_surrogates, BUILTIN, "built in")
    for entry in sorted(importlib.metadata.entry_points(group=ENTRY_POINT_GROUP), key=lambda e: e.name):
        where = f"entry point {entry.name} = {entry.value}"
        try:
            add(entry.load(), entry.name, where)
        except Exception as exc:
            errors.append(PluginError(f"plugin {entry.name} ({where}) failed to import: {type(exc).__name__}: {exc}"))
    for path in files:
        try:
            add(_load_file(path), str(path), f"file {path}")
        except PluginError as exc:
            errors.append(exc)
        except Exception as exc:
            errors.append(PluginError(f"plugin file {path} failed to import: {type(exc).__name__}: {exc}"))

    rank = {name: i for i, (name, _) in enumerate(ordered)}
    surrogates, passes = SurrogateRegistry(), PassRegistry()
    for hook_name, registry in (("flexsn_dsl_register_surrogates", surrogates), ("flexsn_dsl_register_passes", passes)):
        impls = getattr(manager.hook, hook_name).get_hookimpls()
        for impl in sorted(impls, key=lambda i: rank.get(i.plugin_name, len(rank))):
            registry.origin = impl.plugin_name
            try:
                impl.function(registry)
            except PluginError as exc:
                errors.append(exc)
            except Exception as exc:
                errors.append(PluginError(f"plugin {impl.plugin_name} raised {type(exc).__name__} in {hook_name}: {exc}"))
    return Plugins(surrogates.items, passes.items, ordered, errors)


_CACHE: dict[tuple[str, ...], Plugins] = {}


def get_plugins(files: Iterable[str | os.PathLike] = (), warn: bool = True) -> Plugins:
    """The plugins for these extra files (plus entry points and FLEXSN_DSL_PLUGINS), cached."""
    key = tuple(str(Path(f).expanduser().resolve()) for f in [*_env_files(), *files])
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
