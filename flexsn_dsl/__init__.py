"""flexsn-dsl: spiking neurons as YAML equations, compiled to fused Triton kernels.

The runtime (torch, Triton) is imported on first use of :func:`load`, :func:`loads`,
:class:`FlexSN` or the simulation, so that checking a spec (``flexsn-dsl check``) needs
only the parser and sympy.
"""
from __future__ import annotations

from .version import __version__
from .errors import MissingDependency, PluginError, ShapeError, SourcePos, SpecError
from .hookspecs import hookimpl, hookspec
from .codegen_triton import FlexSNInfo


def __getattr__(name: str):
    # from_nir/to_nir live in flexsn_dsl.nir, imported on first use: `import flexsn_dsl` does not import nir
    if name in ("from_nir", "to_nir"):
        from . import nir as _nir_module
        return getattr(_nir_module, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = ["FlexSN", "FlexSNInfo", "MissingDependency", "PluginError", "ShapeError", "Simulation", "SourcePos",
           "SpecError", "hookimpl", "hookspec", "load", "loads", "simulate", "__version__"]


def __getattr__(name: str):
    if name in ("FlexSN", "load", "loads"):
        from . import runtime as module
    elif name in ("Simulation", "simulate"):
        from . import simulation as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
