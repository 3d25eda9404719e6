"""Stage 7 (NIR): the NIR neuron kinds this package knows, the spec text that runs each, and
the error every NIR conversion raises."""
from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Mapping

from ..errors import MissingDependency
from ..literals import number
from ..model import METHODS

def _nir():
    """The ``nir`` package, or :class:`MissingDependency` saying how to get it."""
    try:
        import nir
    except ImportError as exc:
        if (exc.name or "").partition(".")[0] not in ("nir", "h5py"):
            raise
        raise MissingDependency("NIR import/export needs the nir package, which is not installed: "
                                "`pip install flexsn-dsl[nir]` (or `pip install nir`)") from exc
    return nir


# -- the neuron specs ------------------------------------------------------------------------
# Fixed texts: only the method (checked against METHODS), the parameter declarations (fixed
# names; a shape of integers; scalar values as exact float literals) are filled in; the values of
# parameters with a shape come in through params=.

@dataclass(frozen=True)
class NeuronKind:
    """One NIR neuron node kind and the spec that runs it."""

    kind: str                       # the NIR class name
    params: tuple[str, ...]         # NIR's parameter names (also the spec's)
    states: tuple[tuple[str, str], ...]  # state -> initial value
    equations: tuple[tuple[str, str], ...]  # state -> derivative
    spiking: bool                   # threshold v >= v_threshold, reset v: v_reset
    description: str


NEURONS: dict[str, NeuronKind] = {k.kind: k for k in (
    NeuronKind("LIF", ("tau", "r", "v_leak", "v_threshold", "v_reset"), (("v", "v_leak"),),
               (("v", "(v_leak - v + r * x) / tau"),), True,
               "NIR LIF: tau dv/dt = (v_leak - v) + r x; spike where v >= v_threshold; then v = v_reset"),
    NeuronKind("CubaLIF", ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"),
               (("i_syn", "0"), ("v", "v_leak")),
               (("i_syn", "(w_in * x - i_syn) / tau_syn"), ("v", "(v_leak - v + r * i_syn) / tau_mem")), True,
               "NIR CubaLIF: tau_syn di/dt = -i + w_in x; tau_mem dv/dt = (v_leak - v) + r i; spike where "
               "v >= v_threshold; then v = v_reset"),
    NeuronKind("IF", ("r", "v_threshold", "v_reset"), (("v", "0"),), (("v", "r * x"),), True,
               "NIR IF: dv/dt = r x; spike where v >= v_threshold; then v = v_reset"),
    NeuronKind("LI", ("tau", "r", "v_leak"), (("v", "v_leak"),), (("v", "(v_leak - v + r * x) / tau"),), False,
               "NIR LI: tau dv/dt = (v_leak - v) + r x; output v"),
    NeuronKind("CubaLI", ("tau_syn", "tau_mem", "r", "v_leak", "w_in"), (("i_syn", "0"), ("v", "v_leak")),
               (("i_syn", "(w_in * x - i_syn) / tau_syn"), ("v", "(v_leak - v + r * i_syn) / tau_mem")), False,
               "NIR CubaLI: tau_syn di/dt = -i + w_in x; tau_mem dv/dt = (v_leak - v) + r i; output v"),
    NeuronKind("I", ("r",), (("v", "0"),), (("v", "r * x"),), False, "NIR I: dv/dt = r x; output v"),
)}


INPUT = re.compile(r"\bx\b")  # the input in the equations of NEURONS

# The order of a CubaLIF/CubaLI step: "nir", NIR's reference (the voltage integrates with the current
# from before this step's input: the two equations as one system), or "current_first", snnTorch's and
# Norse's (the current takes this step's input first; the voltage then integrates with it held).
ORDERS = ("nir", "current_first")
ORDER_KEY = "step_order"  # a node's metadata key where to_nir records an order other than NIR's
CURRENT_FIRST_METHODS = ("exact", "euler")
_CURRENT_FIRST = {  # method -> (the current's step, the voltage's step) with the current held at its new value
    "euler": ("i_syn + dt * (w_in * x - i_syn) / tau_syn", "v + dt * (v_leak - v + r * i_syn) / tau_mem"),
    "exact": ("w_in * x + (i_syn - w_in * x) * exp(-dt / tau_syn)",
              "v_leak + r * i_syn + (v - v_leak - r * i_syn) * exp(-dt / tau_mem)"),
}


def has_order(kind: NeuronKind) -> bool:
    """Whether the kind's step depends on the order (a current feeding the voltage)."""
    return dict(kind.states).keys() == {"i_syn", "v"}


def neuron_spec(kind: NeuronKind, method: str, shapes: dict[str, tuple[int, ...]], recurrent: bool = False,
                values: Mapping[str, float] | None = None, order: str = "nir") -> str:
    """The spec text of a NIR neuron kind; ``shapes`` gives the parameters that hold one value per neuron,
    ``values`` the numbers of the others and of ``dt`` (written into the text as exact literals, so that
    the spec shows the values in use; 1.0 where not given); ``recurrent`` adds ``rec = rec_weight ·
    out[t-1]`` (the neuron's output fed back) to its input; ``order`` is that of :data:`ORDERS` (a
    ``step`` spec for ``current_first`` with ``exact`` or ``euler``)."""
    values = values or {}
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    current_first = order == "current_first" and has_order(kind)
    if current_first and method not in CURRENT_FIRST_METHODS:
        raise ValueError(f"order='current_first' integrates with method 'exact' or 'euler', got {method!r}")
    description = kind.description + ("; the current first (snnTorch, Norse)" if current_first else "")
    lines = [f"neuron: nir_{kind.kind.lower()}", f"description: {json.dumps(description)}", "inputs: [x]",
             "parameters:"]
    for index, name in enumerate(kind.params):
        if name in shapes:  # the tensor given as params= replaces the value; distinct values keep the
            dims = ", ".join(str(int(n)) for n in shapes[name])  # propagator check from seeing equal time constants
            lines.append(f"  {name}: {{value: {index + 1}.0, shape: [{dims}]}}")
        else:
            lines.append(f"  {name}: {number(float(values.get(name, 1.0)))}")
    lines += [f"  dt: {number(float(values.get('dt', 1.0)))}", "states:", *(f"  {s}: {init}" for s, init in kind.states)]
    if recurrent:
        lines += ["recurrent:", f"  rec: {{from: {'s' if kind.spiking else 'v'}}}"]
    drive = "(x + rec)" if recurrent else "x"
    if current_first:
        current, voltage = (INPUT.sub(drive, rhs) for rhs in _CURRENT_FIRST[method])
        lines += ["step:", f"  i_syn: {current}"]
        if kind.spiking:
            lines += [f"  h: {voltage}", "  s: spike(h - v_threshold)", "  v: s * v_reset + (1 - s) * h", "outputs: [s]"]
        else:
            lines += [f"  v: {voltage}", "outputs: [v]"]
        return "\n".join(lines) + "\n"
    lines += ["equations:", *(f"  {s}: " + INPUT.sub(drive, rhs) for s, rhs in kind.equations), f"method: {method}"]
    if kind.spiking:
        lines += ["threshold: v >= v_threshold", "reset:", "  v: v_reset", "outputs: [s]"]
    else:
        lines.append("outputs: [v]")
    return "\n".join(lines) + "\n"
