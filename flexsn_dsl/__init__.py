"""flexsn-dsl: spiking neurons as YAML equations, compiled to fused Triton kernels."""
from __future__ import annotations

import os as _os

if "TRITON_INTERPRET" not in _os.environ:
    import torch as _torch

    if not _torch.cuda.is_available():
        # No GPU: run generated kernels through Triton's interpreter. Triton reads this
        # when it is imported, so it must be set before the first `import triton`.
        _os.environ["TRITON_INTERPRET"] = "1"

from .version import __version__  # noqa: E402
from .errors import MissingDependency, PluginError, ShapeError, SourcePos, SpecError  # noqa: E402
from .hookspecs import hookimpl, hookspec  # noqa: E402
from .codegen_triton import FlexSNInfo  # noqa: E402
from .runtime import FlexSN, load, loads  # noqa: E402
from .simulation import Simulation, simulate  # noqa: E402

__all__ = ["FlexSN", "FlexSNInfo", "MissingDependency", "PluginError", "ShapeError", "Simulation", "SourcePos",
           "SpecError", "hookimpl", "hookspec", "load", "loads", "simulate", "__version__"]
