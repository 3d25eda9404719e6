"""The names generated code gives a neuron's Triton cores and kernels: one rule for the code
generator, the runtime and the model (which refuses a spec name equal to one of them)."""
from __future__ import annotations

CORES = ("forward", "backward")
VARIANTS = ("inference", "inference_final_state", "forward", "forward_final_state", "backward")
RECURRENT_VARIANTS = ("recurrent_forward", "recurrent_backward")  # specs with `recurrent` only


def scan_variant(variant: str) -> str:
    """The time-parallel kernel standing in for the sequential ``variant`` (of :data:`VARIANTS`)."""
    return f"scan_{variant}"


SCAN_VARIANTS = tuple(map(scan_variant, VARIANTS))  # specs whose states are affine in the previous states only
# a time-parallel call split into chunks of steps: each chunk's map (forward) or adjoint map (backward), then the
# states (state gradients) at the chunks' boundaries
CHUNK_VARIANTS = ("scan_summary", "scan_carry", "scan_adjoint_summary", "scan_adjoint_carry")


def core_name(neuron: str, direction: str) -> str:
    """The single-step Triton core ``direction`` ("forward" or "backward") of ``neuron``."""
    return f"{neuron}_{direction}_core"


def kernel_name(neuron: str, variant: str) -> str:
    """The multi-step Triton kernel ``variant`` (of :data:`VARIANTS`, :data:`RECURRENT_VARIANTS` or
    :data:`SCAN_VARIANTS`) of ``neuron``."""
    return f"{neuron}_{variant}_kernel"


def generated_names(neuron: str, recurrent: bool = True, scan: bool = True) -> frozenset[str]:
    """Every module-level name the generated Triton module derives from the neuron's name (with
    ``recurrent`` false: of a spec without `recurrent`, whose module has no recurrent kernels; with
    ``scan`` false: of a spec that is not time-parallel, which has no scan kernels)."""
    variants = VARIANTS + (RECURRENT_VARIANTS if recurrent else ()) + (SCAN_VARIANTS + CHUNK_VARIANTS if scan else ())
    return frozenset([*(core_name(neuron, d) for d in CORES), *(kernel_name(neuron, v) for v in variants)])
