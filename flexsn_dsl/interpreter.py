"""Triton's interpreter where there is no GPU: switched on before anything imports Triton (the generated
kernel modules do, and Triton reads the switch when it is imported)."""
from __future__ import annotations

import os


def use_interpreter_without_gpu() -> None:
    """Set ``TRITON_INTERPRET=1`` when it is unset and torch sees no CUDA GPU."""
    if "TRITON_INTERPRET" not in os.environ:
        import torch
        if not torch.cuda.is_available():
            os.environ["TRITON_INTERPRET"] = "1"
