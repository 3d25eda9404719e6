"""The names generated code gives a neuron's Triton cores and kernels: one rule for the code
generator, the runtime and the model (which refuses a spec name equal to one of them)."""
from __future__ import annotations

CORES = ("forward", "backward")
VARIANTS = ("inference", "inference_final_state", "forward", "forward_final_state", "backward")
RECURRENT_VARIANTS = ("recurrent_forward", "recurrent_backward")  # specs with `recurrent` only


def core_name(neuron: str, direction: str) -> str:
    """The single-step Triton core ``direction`` ("forward" or "backward") of ``neuron``."""
    return f"{neuron}_{direction}_core"


def kernel_name(neuron: str, variant: str) -> str:
    """The multi-step Triton kernel ``variant`` (of :data:`VARIANTS` or :data:`RECURRENT_VARIANTS`) of ``neuron``."""
    return f"{neuron}_{variant}_kernel"


def generated_names(neuron: str, recurrent: bool = True) -> frozenset[str]:
    """Every module-level name the generated Triton module derives from the neuron's name (with
    ``recurrent`` false: of a spec without `recurrent`, whose module has no recurrent kernels)."""
    variants = VARIANTS + (RECURRENT_VARIANTS if recurrent else ())
    return frozenset([*(core_name(neuron, d) for d in CORES), *(kernel_name(neuron, v) for v in variants)])
