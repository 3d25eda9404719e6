"""Stage 2: `simulate`, the drive, steps and sizes that ``flexsn-dsl simulate`` and
``flexsn_dsl.simulate`` run the neuron with when they are not given."""
from __future__ import annotations

from ..errors import SpecError
from ..expressions import closest
from .context import SpecContext
from .language import MAX_SIMULATE_STEPS, SIMULATE_KEYS
from .neuron import NeuronModel, SimulateDefaults
from .numbers import read_number, type_name

EXAMPLE = "simulate: {drive: 10.0, steps: 1000}"


def read_simulate(spec: SpecContext, model: NeuronModel) -> SimulateDefaults:
    """`simulate: {drive, steps, sizes}`: ``drive`` a number (the first input) or input -> number,
    ``steps`` a whole number, ``sizes`` size name -> whole number (names the spec's shapes use)."""
    node = spec.get("simulate")
    if node is None:
        return SimulateDefaults()
    spec.expect(node, "mapping", "`simulate`", EXAMPLE)
    for key, pos in node.key_pos.items():
        if key not in SIMULATE_KEYS:
            raise SpecError(f"unknown key {key!r} in `simulate`", pos,
                            closest(key, SIMULATE_KEYS) or f"its keys are: {', '.join(SIMULATE_KEYS)}")
    drive: dict[str, float] = {}
    if "drive" in node.value:
        given = node.value["drive"]
        items = given.value.items() if given.kind == "mapping" else [(model.inputs[0], given)]
        for name, value in items:
            if name not in model.inputs:
                raise SpecError(f"`simulate` drives {name!r}, which is not an input", given.key_pos[name],
                                f"the inputs are: {', '.join(model.inputs)}")
            drive[name] = read_number(value, f"the drive of {name!r} in `simulate`")
    steps = _whole(node.value["steps"], "`steps` in `simulate`", MAX_SIMULATE_STEPS) if "steps" in node.value \
        else None
    sizes: dict[str, int] = {}
    if "sizes" in node.value:
        given = node.value["sizes"]
        spec.expect(given, "mapping", "`sizes` in `simulate`", "sizes: {N: 4}")
        for name, value in given.value.items():
            if name not in model.size_names:
                known = ", ".join(model.size_names) or "none: no parameter has a shape"
                raise SpecError(f"`simulate` gives the size {name!r}, which no parameter shape names",
                                given.key_pos[name], f"the sizes are: {known}")
            sizes[name] = _whole(value, f"the size {name!r} in `simulate`", MAX_SIMULATE_STEPS)
    return SimulateDefaults(drive, steps, sizes)


def _whole(node, what: str, limit: int) -> int:
    if node.kind != "scalar" or isinstance(node.value, bool) or not isinstance(node.value, int) \
            or not 1 <= node.value <= limit:
        shown = repr(node.value) if node.kind == "scalar" else f"a {type_name(node)}"
        raise SpecError(f"{what} must be a whole number from 1 to {limit}, not {shown}", node.pos,
                        f"write it like: {EXAMPLE}")
    return node.value
