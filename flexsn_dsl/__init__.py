"""flexsn-dsl: spiking neurons as YAML equations, compiled to fused Triton kernels.

The runtime (torch, Triton) is imported on first use of :func:`load`, :func:`loads`,
:class:`FlexSN`, :class:`PlasticLinear`, :func:`reset_net`, the simulation or the :class:`Monitor`, and torch alone on first use of
:class:`PerStep`, :class:`Delay`, :class:`DelayLinear` (Triton at their first CUDA call) or ``encode``, so
that checking a spec (``flexsn-dsl check``) needs only the parser and sympy.
"""
from __future__ import annotations

from .version import __version__
from .errors import MissingDependency, NIRError, PluginError, ShapeError, SourcePos, SpecError
from .hookspecs import hookimpl, hookspec
from .codegen_triton import FlexSNInfo
from .interpreter import switch_at_triton_import

switch_at_triton_import()


__all__ = ["Delay", "DelayLinear", "FlexSN", "FlexSNInfo", "MissingDependency", "Monitor", "NIRError", "PerStep",
           "PlasticLinear", "PluginError", "ShapeError", "Simulation", "SourcePos", "SpecError", "detach_net", "encode", "from_nir",
           "hookimpl", "hookspec", "load", "loads", "reset_net", "simulate", "summary", "to_nir", "__version__"]


def __getattr__(name: str):
    if name in ("FlexSN", "detach_net", "load", "loads", "reset_net"):
        from . import runtime as module
    elif name == "PlasticLinear":
        from . import plastic as module
    elif name == "PerStep":
        from . import layers as module
    elif name in ("Delay", "DelayLinear"):
        from . import delays as module
    elif name in ("Simulation", "simulate"):
        from . import simulation as module
    elif name in ("Monitor", "summary"):
        from . import monitor as module
    elif name == "encode":  # the submodule itself
        import importlib
        return importlib.import_module(f"{__name__}.encode")
    elif name in ("from_nir", "to_nir"):  # the optional nir package is imported when they are called
        from . import nir as module
    else:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(module, name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
