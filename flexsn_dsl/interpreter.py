"""Triton's interpreter where there is no GPU: switched on before anything imports Triton (the generated
kernel modules do, and Triton reads the switch when it is imported: its own library functions, imported
without it, cannot run in the interpreter). Importing flexsn_dsl arranges for the switch to happen at
Triton's first import, whoever makes it (torch.compile and torch.utils.checkpoint import Triton)."""
from __future__ import annotations

import importlib.abc
import os
import sys

_LATE = [False]  # the switch came after Triton's import


def use_interpreter_without_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` when it is unset and torch sees no CUDA GPU."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch
        if not torch.cuda.is_available():
            _LATE[0] = "triton" in sys.modules
            os.environ["TRITON_INTERPRET"] = "1"


def switched_after_triton() -> bool:
    """Whether this process switched the interpreter on after Triton was imported without it."""
    return _LATE[0]


class _SwitchAtTritonImport(importlib.abc.MetaPathFinder):
    """Calls :func:`use_interpreter_without_gpu` when Triton is first imported, then steps aside."""

    def find_spec(self, name, path=None, target=None):
        if name == "triton":
            if self in sys.meta_path:
                sys.meta_path.remove(self)
            use_interpreter_without_gpu()
        return None  # (the import itself goes on as usual)


def switch_at_triton_import() -> None:
    """Where the switch is unset and Triton not imported yet: make the switch at Triton's first import."""
    if "TRITON_INTERPRET" not in os.environ and "triton" not in sys.modules and \
            not any(isinstance(f, _SwitchAtTritonImport) for f in sys.meta_path):
        sys.meta_path.insert(0, _SwitchAtTritonImport())
