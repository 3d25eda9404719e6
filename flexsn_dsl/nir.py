"""NIR (the Neuromorphic Intermediate Representation) import and export, on top of the package.

:func:`from_nir` turns a NIR graph into an ``nn.Module`` over ``[T, B, ...]``: each NIR neuron
node becomes a :class:`~flexsn_dsl.FlexSN` generated from a spec with the node's equations
(parameters from the node's arrays, one value per neuron where they differ); the other nodes
become torch layers applied to every step at once. :func:`to_nir` goes the other way, and
recognises each neuron module by comparing its spec's equations with NIR's, symbolically.

Needs the ``nir`` package (``pip install flexsn-dsl[nir]``); nothing else in the package imports
this module. Names in a NIR graph are untrusted: they never reach spec text or generated code
(the specs are fixed texts, the values go in as numbers and tensors).
"""
from __future__ import annotations

import contextlib
import itertools
import json
import math
import operator
import os
import re
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Iterator

import numpy as np
import sympy
import torch
from torch import nn

from .errors import MissingDependency
from .layers import PerStep
from .model import METHODS
from .runtime import BACKENDS, FlexSN, loads
from .symbolic import Detach, Spike, language_text, nonlinear_term, real_symbol

__all__ = ["NIRError", "NIRNetwork", "from_nir", "match_neuron", "to_nir"]


class NIRError(ValueError):
    """A NIR graph (or a module to export) that cannot be converted; the message says which node and why."""


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
# names; a shape of integers) and nothing else are filled in; values come in through params=.

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
               "NIR LIF: tau dv/dt = (v_leak - v) + r x; spike where v > v_threshold; then v = v_reset"),
    NeuronKind("CubaLIF", ("tau_syn", "tau_mem", "r", "v_leak", "v_threshold", "v_reset", "w_in"),
               (("i_syn", "0"), ("v", "v_leak")),
               (("i_syn", "(w_in * x - i_syn) / tau_syn"), ("v", "(v_leak - v + r * i_syn) / tau_mem")), True,
               "NIR CubaLIF: tau_syn di/dt = -i + w_in x; tau_mem dv/dt = (v_leak - v) + r i; spike where "
               "v > v_threshold; then v = v_reset"),
    NeuronKind("IF", ("r", "v_threshold", "v_reset"), (("v", "0"),), (("v", "r * x"),), True,
               "NIR IF: dv/dt = r x; spike where v > v_threshold; then v = v_reset"),
    NeuronKind("LI", ("tau", "r", "v_leak"), (("v", "v_leak"),), (("v", "(v_leak - v + r * x) / tau"),), False,
               "NIR LI: tau dv/dt = (v_leak - v) + r x; output v"),
    NeuronKind("CubaLI", ("tau_syn", "tau_mem", "r", "v_leak", "w_in"), (("i_syn", "0"), ("v", "v_leak")),
               (("i_syn", "(w_in * x - i_syn) / tau_syn"), ("v", "(v_leak - v + r * i_syn) / tau_mem")), False,
               "NIR CubaLI: tau_syn di/dt = -i + w_in x; tau_mem dv/dt = (v_leak - v) + r i; output v"),
    NeuronKind("I", ("r",), (("v", "0"),), (("v", "r * x"),), False, "NIR I: dv/dt = r x; output v"),
)}


INPUT = re.compile(r"\bx\b")  # the input in the equations of NEURONS


def neuron_spec(kind: NeuronKind, method: str, shapes: dict[str, tuple[int, ...]], recurrent: bool = False) -> str:
    """The spec text of a NIR neuron kind; ``shapes`` gives the parameters that hold one value per neuron;
    ``recurrent`` adds ``rec = rec_weight · out[t-1]`` (the neuron's output fed back) to its input."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    lines = [f"neuron: nir_{kind.kind.lower()}", f"description: {json.dumps(kind.description)}", "inputs: [x]", "parameters:"]
    for index, name in enumerate(kind.params):
        if name in shapes:  # the tensor given as params= replaces the value; distinct values keep the
            dims = ", ".join(str(int(n)) for n in shapes[name])  # propagator check from seeing equal time constants
            lines.append(f"  {name}: {{value: {index + 1}.0, shape: [{dims}]}}")
        else:
            lines.append(f"  {name}: 1.0")
    lines += ["  dt: 1.0", "states:", *(f"  {s}: {init}" for s, init in kind.states)]
    if recurrent:
        lines += ["recurrent:", f"  rec: {{from: {'s' if kind.spiking else 'v'}}}"]
    drive = "(x + rec)" if recurrent else "x"
    lines += ["equations:", *(f"  {s}: " + INPUT.sub(drive, rhs) for s, rhs in kind.equations), f"method: {method}"]
    if kind.spiking:
        lines += ["threshold: v >= v_threshold", "reset:", "  v: v_reset", "outputs: [s]"]
    else:
        lines.append("outputs: [v]")
    return "\n".join(lines) + "\n"


def _array(value: Any, what: str) -> np.ndarray:
    array = np.asarray(value, dtype=np.float64)
    if not np.all(np.isfinite(array)):
        raise NIRError(f"{what} holds a value that is not a finite number")
    return array


def _neuron(node: Any, name: str, dt: float, method: str, backend: str, feedback: Any = None) -> FlexSN:
    """A NIR neuron node as a FlexSN: uniform arrays become numbers (baked into the kernels),
    the others parameters with the array's shape (one value per neuron). ``feedback``: the
    Linear node of an edge from the neuron back to itself, run inside the neuron's kernel."""
    kind = NEURONS[type(node).__name__]
    params: dict[str, float | torch.Tensor] = {"dt": dt}
    if feedback is not None:
        params["rec_weight"] = _tensor(feedback.weight)
    shapes: dict[str, tuple[int, ...]] = {}
    arrays: dict[str, np.ndarray] = {}
    for p in kind.params:
        array = arrays[p] = _array(getattr(node, p), f"node {name!r}: parameter {p!r}")
        if array.size == 0:
            raise NIRError(f"node {name!r}: parameter {p!r} is empty")
        if array.size == 1 or np.all(array == array.flat[0]):
            params[p] = float(array.flat[0])
        else:
            shapes[p] = array.shape
            params[p] = torch.tensor(array)
    if method == "exact" and {"tau_syn", "tau_mem"} & set(shapes):
        same = arrays["tau_syn"] == arrays["tau_mem"]
        if np.any(same):
            raise NIRError(f"node {name!r}: tau_syn equals tau_mem for {int(same.sum())} neuron(s), where the exact "
                           "per-neuron propagator divides by tau_syn - tau_mem; import it with method='rk4' "
                           "(or give every neuron the same two time constants)")
    return loads(neuron_spec(kind, method, shapes, feedback is not None), params=params, backend=backend,
                 filename=f"<nir {kind.kind}>")


# -- the other nodes as torch modules ------------------------------------------------------

class Flatten(nn.Module):
    """NIR's Flatten: ``start_dim``/``end_dim`` count the dimensions of one sample (no time, no batch)."""

    def __init__(self, start_dim: int, end_dim: int):
        super().__init__()
        self.start_dim, self.end_dim = start_dim, end_dim

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        start = self.start_dim + 2 if self.start_dim >= 0 else self.start_dim
        end = self.end_dim + 2 if self.end_dim >= 0 else self.end_dim
        return x.flatten(start, end)

    def extra_repr(self) -> str:
        return f"start_dim={self.start_dim}, end_dim={self.end_dim}"


class Scale(nn.Module):
    """NIR's Scale: ``x * scale`` elementwise."""

    def __init__(self, scale: torch.Tensor):
        super().__init__()
        self.register_buffer("scale", scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype)


class Threshold(nn.Module):
    """NIR's Threshold: 1 where ``x > threshold``, else 0 (no gradient)."""

    def __init__(self, threshold: torch.Tensor):
        super().__init__()
        self.register_buffer("threshold", threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > self.threshold.to(x.dtype)).to(x.dtype)


def _read_depth(delay: Delay, _keys: Any = None) -> None:
    """Sets ``delay.depth`` from its steps (a load_state_dict post-hook, hence the second argument)."""
    delay.depth = int(delay.steps.max()) if delay.steps.numel() else 0


class Delay(nn.Module):
    """NIR's Delay, ``y(t) = x(t - delay)``, with each delay a whole number of steps
    (``round(delay / dt)``); the last steps are carried across calls until :meth:`reset`.
    ``depth``, the longest delay, is read off ``steps`` when they are set (here and by
    ``load_state_dict``), so that a call reads nothing back from the device."""

    def __init__(self, steps: torch.Tensor):
        super().__init__()
        self.register_buffer("steps", steps)
        self.history: torch.Tensor | None = None
        _read_depth(self)
        self.register_load_state_dict_post_hook(_read_depth)

    def reset(self) -> None:
        self.history = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        depth = self.depth
        if depth == 0:
            return x
        history = self.history
        if history is None or history.shape != (depth, *x.shape[1:]):
            history = x.new_zeros((depth, *x.shape[1:]))
        seq = torch.cat([history.to(x.dtype), x])
        t = torch.arange(x.shape[0], device=x.device).view(-1, *([1] * (x.dim() - 1)))
        index = (t + depth - self.steps.to(x.device)).expand(x.shape)
        self.history = seq[-depth:].detach()
        return seq.gather(0, index)


def _ints(value: Any, n: int, what: str) -> tuple[int, ...]:
    """An int or a sequence of ints as an n-tuple."""
    array = np.asarray(value).reshape(-1)
    if array.size == 1:
        array = np.repeat(array, n)
    if array.size != n or not np.all(array == np.round(array)):
        raise NIRError(f"{what} must be {n} whole number(s), got {np.asarray(value).tolist()}")
    return tuple(int(a) for a in array)


def _tensor(value: Any) -> torch.Tensor:
    return torch.tensor(np.asarray(value, dtype=np.float64), dtype=torch.get_default_dtype())


def _conv(node: Any, name: str, dims: int) -> nn.Module:
    weight = _tensor(node.weight)
    if weight.dim() != dims + 2:
        raise NIRError(f"node {name!r}: a Conv{dims}d weight has {dims + 2} dimensions, got shape {list(weight.shape)}")
    padding = node.padding
    if isinstance(padding, bytes):
        padding = padding.decode()
    if not isinstance(padding, str):
        padding = _ints(padding, dims, f"node {name!r}: padding")
    elif padding not in ("same", "valid"):
        raise NIRError(f"node {name!r}: padding must be 'same', 'valid' or numbers, got {padding!r}")
    cls = nn.Conv1d if dims == 1 else nn.Conv2d
    layer = cls(weight.shape[1] * int(node.groups), weight.shape[0], tuple(weight.shape[2:]),
                stride=_ints(node.stride, dims, f"node {name!r}: stride"), padding=padding,
                dilation=_ints(node.dilation, dims, f"node {name!r}: dilation"), groups=int(node.groups))
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(_tensor(node.bias).reshape(-1) * torch.ones(weight.shape[0]))
    return PerStep(layer)


def _linear(node: Any, name: str, bias: bool) -> nn.Linear:
    weight = _tensor(node.weight)
    if weight.dim() != 2:
        raise NIRError(f"node {name!r}: only 2-d weights are supported, got shape {list(weight.shape)}")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            layer.bias.copy_(_tensor(node.bias).reshape(-1) * torch.ones(weight.shape[0]))
    return layer


def _pool(node: Any, name: str, summing: bool) -> nn.Module:
    kernel = _ints(node.kernel_size, 2, f"node {name!r}: kernel_size")
    stride = _ints(node.stride, 2, f"node {name!r}: stride")
    padding = _ints(node.padding, 2, f"node {name!r}: padding")
    return PerStep(nn.AvgPool2d(kernel, stride, padding, divisor_override=1 if summing else None))


def _delay(node: Any, name: str, dt: float) -> Delay:
    delay = _array(node.delay, f"node {name!r}: delay") / dt
    steps = np.round(delay)
    if np.any(steps < 0) or not np.allclose(delay, steps, rtol=0, atol=1e-6):
        raise NIRError(f"node {name!r}: delays must be non-negative whole multiples of dt={dt}, got "
                       f"{(delay * dt).ravel()[:8].tolist()}")
    return Delay(torch.tensor(steps.astype(np.int64)))


def _layer(node: Any, name: str, dt: float, method: str, backend: str, feedback: Any = None) -> nn.Module | None:
    """The module of one node; None for Input, Output and Identity (pass-through)."""
    nir = _nir()
    kind = type(node).__name__
    if kind in NEURONS:
        return _neuron(node, name, dt, method, backend, feedback)
    if isinstance(node, (nir.Input, nir.Output)) or kind == "Identity":
        return None
    if isinstance(node, nir.Affine):
        return _linear(node, name, bias=True)
    if isinstance(node, nir.Linear):
        return _linear(node, name, bias=False)
    if isinstance(node, nir.Conv1d):
        return _conv(node, name, 1)
    if isinstance(node, nir.Conv2d):
        return _conv(node, name, 2)
    if isinstance(node, nir.Flatten):
        return Flatten(int(node.start_dim), int(node.end_dim))
    if isinstance(node, nir.SumPool2d):
        return _pool(node, name, summing=True)
    if isinstance(node, nir.AvgPool2d):
        return _pool(node, name, summing=False)
    if isinstance(node, nir.Scale):
        return Scale(_tensor(node.scale))
    if isinstance(node, nir.Threshold):
        return Threshold(_tensor(node.threshold))
    if isinstance(node, nir.Delay):
        return _delay(node, name, dt)
    if isinstance(node, nir.NIRGraph):
        return _network(node, dt, method, backend, f"{name}.")
    raise NIRError(f"node {name!r} is a {kind}, which from_nir cannot run; it runs "
                   f"{', '.join(sorted(SUPPORTED))}")


SUPPORTED = (*NEURONS, "Affine", "Linear", "Conv1d", "Conv2d", "Flatten", "SumPool2d", "AvgPool2d", "Scale",
             "Threshold", "Delay", "Input", "Output", "Identity", "NIRGraph")


# -- wiring ---------------------------------------------------------------------------------

def _components(names: list[str], edges: list[tuple[str, str]]) -> list[list[str]]:
    """The strongly connected components in topological order (Tarjan), each in graph order."""
    succ: dict[str, list[str]] = {n: [] for n in names}
    for a, b in edges:
        succ[a].append(b)
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    for root in names:
        if root in index:
            continue
        work = [(root, iter(succ[root]))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, it = work[-1]
            nxt = next(it, None)
            if nxt is None:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    comp = []
                    while True:
                        top = stack.pop()
                        on_stack.discard(top)
                        comp.append(top)
                        if top == node:
                            break
                    found.append(comp)
            elif nxt not in index:
                index[nxt] = low[nxt] = len(index)
                stack.append(nxt)
                on_stack.add(nxt)
                work.append((nxt, iter(succ[nxt])))
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
    order = {n: i for i, n in enumerate(names)}
    return [sorted(c, key=order.__getitem__) for c in reversed(found)]


class NIRNetwork(nn.Module):
    """A NIR graph as a module over ``[T, B, ...]`` (one tensor per Input node, in graph order;
    one tensor per Output node, a tuple when there are several).

    Feed-forward parts run layer by layer over all T steps (each neuron layer in one fused call);
    a cycle (a recurrent edge) runs step by step, an edge back to an earlier node of the cycle
    carrying the previous step's output (zero after :meth:`reset`). ``nodes`` holds the modules
    under fixed keys (``node0``, ...); ``names`` maps each NIR node name to its key.
    """

    def __init__(self, names: list[str], modules: dict[str, nn.Module | None], edges: list[tuple[str, str]],
                 inputs: list[str], outputs: list[str], folded: dict[str, str] | None = None):
        super().__init__()
        self.names = {name: f"node{i}" for i, name in enumerate(names)}
        self.folded = dict(folded or {})  # neuron -> the Linear of its feedback loop, now the neuron's rec_weight
        self.names.update({linear: self.names[neuron] for neuron, linear in self.folded.items()})
        self.nodes = nn.ModuleDict({self.names[n]: m for n, m in modules.items() if m is not None})
        self._inputs, self._outputs = inputs, outputs
        self._preds: dict[str, list[str]] = {n: [] for n in names}
        for a, b in edges:
            self._preds[b].append(a)
        self._components = _components(names, edges)
        self._previous: dict[str, torch.Tensor] = {}  # cycles: each node's output at the last step

    def node(self, name: str) -> nn.Module | None:
        """The module of the NIR node ``name`` (None for Input, Output and Identity)."""
        key = self.names[name]
        return self.nodes[key] if key in self.nodes else None

    def reset(self) -> None:
        """Every neuron, delay and recurrent edge back to its initial state."""
        self._previous = {}
        for m in self.modules():
            if m is not self and hasattr(m, "reset"):
                m.reset()

    def _apply_node(self, name: str, x: torch.Tensor) -> torch.Tensor:
        key = self.names[name]
        return self.nodes[key](x) if key in self.nodes else x

    def _gather(self, name: str, values: dict[str, torch.Tensor]) -> torch.Tensor:
        preds = self._preds[name]
        if not preds:
            raise NIRError(f"node {name!r} has no input edge")
        total = values[preds[0]]
        for p in preds[1:]:
            total = total + values[p]
        return total

    def forward(self, *xs: torch.Tensor):
        if len(xs) != len(self._inputs):
            raise TypeError(f"this graph takes {len(self._inputs)} input(s), got {len(xs)}")
        values: dict[str, torch.Tensor] = {}
        for comp in self._components:
            if len(comp) == 1 and comp[0] not in self._preds[comp[0]]:
                name = comp[0]
                values[name] = xs[self._inputs.index(name)] if name in self._inputs else \
                    self._apply_node(name, self._gather(name, values))
            else:
                self._run_cycle(comp, values)
        outs = tuple(values[o] for o in self._outputs)
        return outs[0] if len(outs) == 1 else outs

    def _run_cycle(self, comp: list[str], values: dict[str, torch.Tensor]) -> None:
        """A strongly connected component, step by step: a predecessor later in ``comp`` (or the node
        itself) gives its output of the previous step."""
        position = {n: i for i, n in enumerate(comp)}
        outside = next((values[p] for n in comp for p in self._preds[n] if p not in position), None)
        if outside is None:
            raise NIRError(f"the cycle {comp!r} has no input from outside it")
        steps: dict[str, list[torch.Tensor]] = {n: [] for n in comp}
        for t in range(outside.shape[0]):
            now: dict[str, torch.Tensor] = {}
            for n in comp:
                total = None
                for p in self._preds[n]:
                    if p not in position:
                        v = values[p][t:t + 1]
                    elif position[p] < position[n]:
                        v = now[p]
                    else:
                        v = self._previous.get(p)
                        if v is None:
                            continue  # zero before the first step
                    total = v if total is None else total + v
                if total is None:
                    raise NIRError(f"node {n!r} gets no input at the first step of its cycle")
                now[n] = self._apply_node(n, total)
            for n in comp:
                self._previous[n] = now[n]
                steps[n].append(now[n])
        for n in comp:
            values[n] = torch.cat(steps[n])


def _network(graph: Any, dt: float, method: str, backend: str, prefix: str = "") -> NIRNetwork:
    nir = _nir()
    names = list(graph.nodes)
    for a, b in graph.edges:
        for end in (a, b):
            if end not in graph.nodes:
                raise NIRError(f"edge ({prefix}{a!r}, {prefix}{b!r}) names node {end!r}, which the graph does not have")
    edges = [(str(a), str(b)) for a, b in graph.edges]
    folded = _feedback_loops(graph, edges)
    edges = [(a, b) for a, b in edges if folded.get(a) != b and folded.get(b) != a]
    names = [n for n in names if n not in folded.values()]
    modules = {n: _layer(graph.nodes[n], prefix + n, dt, method, backend,
                         graph.nodes[folded[n]] if n in folded else None) for n in names}
    inputs = [n for n in names if isinstance(graph.nodes[n], nir.Input)]
    outputs = [n for n in names if isinstance(graph.nodes[n], nir.Output)]
    if not inputs or not outputs:
        raise NIRError(f"the graph {prefix or ''}needs an Input and an Output node (it has "
                       f"{len(inputs)} and {len(outputs)})")
    for a, b in edges:
        if b in inputs:
            raise NIRError(f"edge ({a!r}, {b!r}) leads into the Input node {b!r}")
    return NIRNetwork(names, modules, edges, inputs, outputs, folded)


def _feedback_loops(graph: Any, edges: list[tuple[str, str]]) -> dict[str, str]:
    """Spiking neuron node -> a Linear node on an edge from it back to it and nothing else (snnTorch's
    RLeaky): that loop runs inside the neuron's fused kernel (language v2, recurrent inputs)."""
    nir = _nir()
    preds: dict[str, list[str]] = {n: [] for n in graph.nodes}
    succs: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for a, b in edges:
        preds[b].append(a)
        succs[a].append(b)
    found: dict[str, str] = {}
    for n, node in graph.nodes.items():
        kind = NEURONS.get(type(node).__name__)
        if kind is None or not kind.spiking or len(node.output_type["output"]) != 1:
            continue
        size = int(node.output_type["output"][0])
        for p in preds[n]:
            linear = graph.nodes[p]
            if (type(linear) is nir.Linear and preds[p] == [n] and succs[p] == [n] and p not in found.values()
                    and np.shape(linear.weight) == (size, size)):
                found[n] = p
                break
    return found


def _check_dt(dt: Any) -> None:
    if not isinstance(dt, (int, float)) or isinstance(dt, bool) or not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be a positive number, got {dt!r}")


def from_nir(graph_or_path: Any, dt: float, method: str = "exact", backend: str = "auto") -> NIRNetwork:
    """A NIR graph (a ``nir.NIRGraph`` or the path of a NIR file) as an ``nn.Module`` over ``[T, B, ...]``.

    ``dt`` is the length of one step, in the unit of the graph's time constants (seconds for
    graphs from snnTorch, Norse and most others). ``method`` integrates the neurons' equations
    (``exact``, ``euler``, ``rk2``, ``rk4``, ``exponential_euler``; a graph exported from a
    framework that steps with Euler runs as it did there with ``method="euler"``). ``backend``
    is that of :func:`flexsn_dsl.load`.
    """
    nir = _nir()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    _check_dt(dt)
    graph = graph_or_path
    if isinstance(graph, (str, os.PathLike)):
        graph = nir.read(graph)
    if not isinstance(graph, nir.NIRGraph):
        graph = nir.NIRGraph.from_list(graph)
    return _network(graph, float(dt), method, backend)


# -- export: our neuron modules, recognised symbolically ------------------------------------

X = sympy.Dummy("x", real=True)  # the input, in the NIR templates and in every spec once renamed


@dataclass
class Match:
    """How one spec compares with one NIR neuron kind: the kind's parameters (expressions of
    the spec's shaped parameters) when it matches, else the differences found."""

    kind: NeuronKind
    values: dict[str, sympy.Expr]
    differences: list[str]


@dataclass
class Dynamics:
    """A neuron's continuous-time form, in the spec's own state names: derivatives, the threshold
    u (spike where u >= 0, on the integrated states), reset values, the output, initial values."""

    derivatives: dict[str, sympy.Expr]
    threshold: sympy.Expr | None
    reset: dict[str, sympy.Expr]
    output: str                     # "s" or a state name
    initial: dict[str, sympy.Expr]


def _template(kind: NeuronKind) -> Dynamics:
    symbols = {p: real_symbol(p) for p in kind.params}
    parse = lambda text: sympy.sympify(text, locals={**symbols, "x": X, "v": real_symbol("v"),  # noqa: E731
                                                      "i_syn": real_symbol("i_syn")})
    return Dynamics({s: parse(rhs) for s, rhs in kind.equations},
                    parse("v - v_threshold") if kind.spiking else None,
                    {"v": symbols["v_reset"]} if kind.spiking else {}, "s" if kind.spiking else "v",
                    {s: parse(init) for s, init in kind.states})


def _linear_parts(expr: sympy.Expr, variables: list[sympy.Symbol]) -> tuple[dict[sympy.Symbol | int, sympy.Expr],
                                                                              sympy.Expr | None]:
    """``expr`` as c0 + sum c_z z over ``variables``: the coefficients (key 1 for c0) and a
    nonlinear term (None when ``expr`` is affine in the variables)."""
    term = nonlinear_term(expr, variables)
    zero = {z: 0 for z in variables}
    coeffs: dict[sympy.Symbol | int, sympy.Expr] = {1: sympy.simplify(expr.subs(zero))}
    for z in variables:
        coeffs[z] = sympy.simplify(sympy.diff(expr, z).subs(zero))
    return coeffs, term


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two coefficients are equal (numbers to rounding: they come from float parameters)."""
    d = sympy.simplify(a - b)
    if d == 0:
        return True
    return bool(d.is_number) and abs(complex(d)) <= 1e-9 * max(1.0, abs(complex(a)))


def _compare(ours: Dynamics, kind: NeuronKind, back: dict[str, str]) -> Match:
    """Read the kind's parameters off ``ours`` (states already renamed to the kind's; ``back`` maps
    them to the spec's names for messages), and list what differs."""
    ref = _template(kind)
    params = [real_symbol(p) for p in kind.params]
    variables = [real_symbol(s) for s in ref.derivatives] + [X]
    spec_symbols = {real_symbol(a): real_symbol(b) for a, b in back.items()}
    show = lambda e: language_text(e.xreplace(spec_symbols)).replace(str(X), "input")  # noqa: E731
    nir_kind = f"NIR {kind.kind}"
    differences: list[str] = []
    equations, checks = [], []
    for state, rhs in ref.derivatives.items():
        mine, term = _linear_parts(ours.derivatives[state], variables)
        if term is not None:
            differences.append(f"d{back[state]}/dt has the term {show(term)}, which {nir_kind} has not")
            continue
        theirs, _ = _linear_parts(rhs, variables)
        for key in theirs:
            pair = (mine[key], theirs[key], state, key)
            (equations if theirs[key].free_symbols & set(params) else checks).append(pair)
    if (ref.threshold is None) != (ours.threshold is None):
        differences.append(f"it spikes, {nir_kind} does not" if ours.threshold is not None else
                           f"it does not spike, {nir_kind} does")
    if ours.output != ref.output:
        differences.append(f"its output is {back.get(ours.output, ours.output)!r}, {nir_kind}'s is "
                           f"{back.get(ref.output, ref.output)!r}")
    if differences:
        return Match(kind, {}, differences)
    solution = sympy.solve([sympy.Eq(a, b) for a, b, _, _ in equations], params, dict=True) if equations else [{}]
    values = solution[0] if solution else {}
    if not solution:
        differences.append(f"its coefficients admit no parameters of {nir_kind}")
    for a, b, state, key in checks + equations:
        if solution and not _same(a, b.xreplace(values)):
            what = "the constant term" if key == 1 else f"the coefficient of {show(key)}"
            differences.append(f"in d{back[state]}/dt, {what} is {show(a)}, {nir_kind} has {show(b.xreplace(values))}")
    if ref.threshold is not None and not differences:
        v = real_symbol("v")
        mine, term = _linear_parts(ours.threshold, variables)
        if term is not None or any(mine[z] != 0 for z in mine if z not in (1, v)):
            differences.append(f"the threshold {show(ours.threshold)} >= 0 is not {back['v']} >= a constant")
        elif mine[v].is_number and mine[v] <= 0:
            differences.append(f"the threshold {show(ours.threshold)} >= 0 fires below a level, not above")
        else:
            values[real_symbol("v_threshold")] = sympy.simplify(-mine[1] / mine[v])
            reset = dict(ours.reset)
            value = reset.pop("v", None)
            if value is None or value.free_symbols & set(variables):
                shown = f"no reset of {back['v']}" if value is None else f"the reset {back['v']}: {show(value)}"
                differences.append(f"{shown}; {nir_kind} resets {back['v']} to a constant v_reset")
            else:
                values[real_symbol("v_reset")] = value
            for state in reset:
                differences.append(f"it resets {back[state]!r}, which {nir_kind} does not")
    return Match(kind, {str(k): v for k, v in values.items()}, differences)


def _dynamics(m: FlexSN, dt: float | None) -> tuple[Dynamics, str]:
    """:func:`_own_dynamics`, with a recurrent input (``recurrent: {r: {from: s}}``) taken out: NIR
    writes it as a Linear node on an edge from the neuron back to its input, which is only the same
    where the spec adds r to its input."""
    ours, convention = _own_dynamics(m, dt)
    spec = m.spec
    if not spec.recurrent:
        return ours, convention
    rec = list(spec.recurrent.values())
    out_name = spec.outputs[0][0]
    if len(rec) > 1 or rec[0].source != out_name:
        raise NIRError(f"{spec.name}: NIR feeds back a node's output through one edge; this spec's recurrent inputs "
                       f"feed back {[r.source for r in rec]}, its output is {out_name!r}")
    r = real_symbol(rec[0].name)
    show = {X: real_symbol(spec.inputs[0])}

    def added(e: sympy.Expr) -> sympy.Expr:
        without = e.xreplace({r: 0})
        if sympy.simplify(without.xreplace({X: X + r}) - e) != 0:
            raise NIRError(f"{spec.name}: its recurrent input {rec[0].name!r} is not added to its input "
                           f"{spec.inputs[0]!r} in {language_text(e.xreplace(show))}; NIR adds the recurrent edge "
                           "to the neuron's input")
        return without
    return Dynamics({s: added(e) for s, e in ours.derivatives.items()},
                    None if ours.threshold is None else added(ours.threshold),
                    {s: added(e) for s, e in ours.reset.items()}, ours.output, ours.initial), \
        convention + f"; the recurrent input {rec[0].name!r} as a Linear node on an edge back to the neuron"


def _own_dynamics(m: FlexSN, dt: float | None) -> tuple[Dynamics, str]:
    """The module's spec as continuous-time dynamics (a `step` spec read as an Euler step of
    length ``dt``); scalar parameters replaced by their values, shaped ones kept as symbols.
    Returns the dynamics and a note on the convention used."""
    spec = m.spec
    if len(spec.inputs) != 1:
        raise NIRError(f"{spec.name}: NIR neurons have one input, this spec has {spec.inputs}")
    c = spec.continuous
    if c is not None and c.refractory:
        raise NIRError(f"{spec.name}: it has a refractory period, which no NIR neuron has")
    if len(spec.outputs) != 1:
        raise NIRError(f"{spec.name}: NIR neurons have one output, this spec has {[n for n, _ in spec.outputs]} "
                       "(give it outputs: [s], or [v] for a neuron without spikes)")
    scalars = {real_symbol(n): sympy.Float(float(getattr(m, n).detach())) for n in spec.parameters
               if n not in spec.shaped}
    shaped = {real_symbol(n): sympy.Dummy(n, real=True) for n in spec.shaped}  # apart from NIR's names
    rename = {real_symbol(spec.inputs[0]): X, **scalars, **shaped}
    plain = lambda e: sympy.sympify(e).xreplace(rename).replace(Detach, lambda a: a)  # noqa: E731
    initial = {s: plain(st.init) for s, st in spec.states.items()}
    out_name, out_symbol = spec.outputs[0]
    if c is not None:
        output = "s" if c.threshold is not None and out_name == "s" else out_name
        return Dynamics({s: plain(eq.expr) for s, eq in c.equations.items()},
                        None if c.threshold is None else plain(c.threshold),
                        {s: plain(r.expr) for s, r in c.reset.items()}, output, initial), \
            f"equations ({c.method} integration in this module)"
    if dt is None:
        raise NIRError(f"{spec.name} is a discrete-time (`step`) spec: NIR neurons are continuous-time; "
                       "give to_nir(..., dt=...) to export each step as an Euler step of that length")
    # inline the step lines, then read the step as x' = x + dt f(x) where no spike happened
    values: dict[sympy.Symbol, sympy.Expr] = {}
    for line in spec.steps:
        values[line.symbol] = plain(line.expr).xreplace(values)
    spikes = {call for e in values.values() for call in e.atoms(Spike)}
    if len(spikes) > 1:
        raise NIRError(f"{spec.name}: its step spikes on {len(spikes)} conditions; NIR neurons have one threshold")
    spike = next(iter(spikes), None)
    nexts = {s: values.get(sym, real_symbol(s)) for s, sym in spec.next_states.items()}
    quiet = {s: e.xreplace({spike: 0}) if spike is not None else e for s, e in nexts.items()}
    derivatives = {s: sympy.simplify((e - real_symbol(s)) / dt) for s, e in quiet.items()}
    threshold = reset = None
    if spike is not None:
        u = spike.args[0]
        # NIR thresholds the integrated state: write u in the integrated states where it is affine in them
        integrated = {real_symbol(s): e for s, e in quiet.items()}
        old = {X, *(real_symbol(s) for s in spec.states)}
        v = next((sym for sym, e in integrated.items() if sympy.simplify(u - e).free_symbols.isdisjoint(old)), None)
        threshold = sympy.simplify(u - integrated[v] + v) if v is not None else u
        reset = {}
        for s, e in nexts.items():
            shift = sympy.simplify(e.xreplace({spike: 1}) - quiet[s])
            if shift != 0:  # in the integrated state where the reset is a shift of it (v: v - v_th)
                fired = e.xreplace({spike: 1})
                reset[s] = real_symbol(s) + shift if shift.free_symbols.isdisjoint(old) else sympy.simplify(fired)
    output = "s" if spike is not None and out_symbol in values and values[out_symbol] == spike else out_name
    if output != "s" and out_name not in spec.states:
        output = out_name
    return Dynamics(derivatives, threshold, reset or {}, output, initial), \
        f"a discrete step read as an Euler step: x[t+1] = x[t] + dt * f(x[t], input[t]), dt = {dt!r}"


def _check_initial(m: FlexSN, ours: Dynamics, kind: NeuronKind, values: dict[str, sympy.Expr]) -> None:
    """NIR has no initial values; from_nir starts the states as the kinds' specs do. Warn where ours differ."""
    symbols = {real_symbol(k): v for k, v in values.items()}
    for state, init in _template(kind).initial.items():
        if sympy.simplify(ours.initial[state] - init.xreplace(symbols)) != 0:
            warnings.warn(f"{m.spec.name}: state {state!r} starts at {language_text(ours.initial[state])}; NIR "
                          f"graphs carry no initial values and from_nir starts it at {init}", stacklevel=4)


def match_neuron(m: FlexSN, dt: float | None = None) -> tuple[NeuronKind, dict[str, sympy.Expr], str]:
    """The NIR neuron kind whose equations ``m``'s spec has, with the kind's parameters as
    expressions of the spec's shaped parameters; :class:`NIRError` naming the closest kind
    and the term that differs when none matches."""
    ours, convention = _dynamics(m, dt)
    matches: list[Match] = []
    for kind in NEURONS.values():
        ref_states = [s for s, _ in kind.states]
        if len(ref_states) != len(ours.derivatives):
            matches.append(Match(kind, {}, [f"it has {len(ours.derivatives)} state(s) "
                                            f"{sorted(ours.derivatives)}, NIR {kind.kind} has {len(ref_states)}"]))
            continue
        for perm in itertools.permutations(ours.derivatives):
            names = dict(zip(perm, ref_states))
            sub = {real_symbol(a): real_symbol(b) for a, b in names.items()}
            renamed = Dynamics({names[s]: e.xreplace(sub) for s, e in ours.derivatives.items()},
                               None if ours.threshold is None else ours.threshold.xreplace(sub),
                               {names[s]: e.xreplace(sub) for s, e in ours.reset.items()},
                               names.get(ours.output, ours.output),
                               {names[s]: e.xreplace(sub) for s, e in ours.initial.items()})
            match = _compare(renamed, kind, {b: a for a, b in names.items()})
            if not match.differences:
                _check_initial(m, renamed, kind, match.values)
                return kind, match.values, convention
            matches.append(match)
    best = min(matches, key=lambda mt: (mt.differences[0].startswith("it has "), len(mt.differences)))
    raise NIRError(f"{m.spec.name} matches no NIR neuron; the closest is {best.kind.kind}, but "
                   f"{'; '.join(best.differences)}")


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of their own, on the host."""
    return t.detach().cpu().numpy().copy()


def _loop_back(nodes: dict[str, Any], edges: list[tuple[str, str]], neuron: str, linear: str,
               weight: torch.Tensor) -> None:
    """A neuron's recurrent weight as NIR writes it: a Linear node on an edge from the neuron back to it."""
    nodes[linear] = _nir().Linear(weight=_numpy(weight))
    edges += [(neuron, linear), (linear, neuron)]


def _neuron_node(m: FlexSN, feature: tuple[int, ...], dt: float | None, where: str) -> Any:
    """The NIR node of one of our neuron modules, its arrays of the layer's shape ``feature``."""
    nir = _nir()
    kind, values, _ = match_neuron(m, dt)
    missing = [p for p in kind.params if p not in values]
    if missing:
        raise NIRError(f"{where}: {m.spec.name} matches NIR {kind.kind} but does not fix {missing}")
    arrays: dict[str, np.ndarray] = {}
    for p in kind.params:
        expr = values[p]
        symbols = sorted(expr.free_symbols, key=str)  # the shaped parameters it depends on
        args = [_numpy(getattr(m, s.name).double()) for s in symbols]
        value = np.asarray(sympy.lambdify(symbols, expr, "numpy")(*args), dtype=np.float64)
        try:
            arrays[p] = np.array(np.broadcast_to(value, feature))
        except ValueError:
            raise NIRError(f"{where}: parameter {p} of shape {list(value.shape)} does not broadcast to the "
                           f"layer's shape {list(feature)}") from None
    return getattr(nir, kind.kind)(**arrays)


# The NIR node of each kind of layer, from the layer, one sample's shape at its input, dt and where it is.
_Exporter = Callable[[Any, tuple[int, ...], float | None, str], Any]


def _per_step_node(m: PerStep, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    """The node of the layer it runs on every step."""
    return _layer_node(m.layer, feature_in, dt, where)


def _linear_node(m: nn.Linear, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    nir = _nir()
    if m.bias is None:
        return nir.Linear(weight=_numpy(m.weight))
    return nir.Affine(weight=_numpy(m.weight), bias=_numpy(m.bias))


def _conv_node(m: nn.Conv1d | nn.Conv2d, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    nir = _nir()
    if m.padding_mode != "zeros":
        raise NIRError(f"{where}: padding_mode={m.padding_mode!r}; NIR convolutions pad with zeros")
    weight = _numpy(m.weight)
    bias = _numpy(m.bias) if m.bias is not None else np.zeros(m.out_channels, dtype=weight.dtype)
    padding = m.padding if isinstance(m.padding, str) else tuple(m.padding)
    if isinstance(m, nn.Conv1d):
        return nir.Conv1d(input_shape=int(feature_in[-1]), weight=weight, stride=int(m.stride[0]),
                          padding=padding if isinstance(padding, str) else int(padding[0]),
                          dilation=int(m.dilation[0]), groups=m.groups, bias=bias)
    return nir.Conv2d(input_shape=tuple(int(n) for n in feature_in[-2:]), weight=weight, stride=tuple(m.stride),
                      padding=padding, dilation=tuple(m.dilation), groups=m.groups, bias=bias)


def _pool_node(m: nn.AvgPool2d, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    nir = _nir()
    if m.ceil_mode or not m.count_include_pad or m.divisor_override not in (None, 1):
        raise NIRError(f"{where}: {m} has options NIR's pooling nodes do not (ceil_mode, count_include_pad=False, "
                       "a divisor other than 1)")
    pool = nir.SumPool2d if m.divisor_override == 1 else nir.AvgPool2d
    pair = lambda v: np.array(_ints(v, 2, f"{where}: pooling size"))  # noqa: E731
    return pool(kernel_size=pair(m.kernel_size), stride=pair(m.stride if m.stride is not None else m.kernel_size),
                padding=pair(m.padding))


def _flatten_node(m: Flatten, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    return _nir().Flatten(input_type={"input": np.array(feature_in)}, start_dim=m.start_dim, end_dim=m.end_dim)


def _scale_node(m: Scale, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    return _nir().Scale(scale=np.array(np.broadcast_to(_numpy(m.scale), feature_in)))


def _threshold_node(m: Threshold, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    return _nir().Threshold(threshold=np.array(np.broadcast_to(_numpy(m.threshold), feature_in)))


def _delay_node(m: Delay, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    if dt is None:
        raise NIRError(f"{where}: a Delay counts steps; give to_nir(..., dt=...) to write it in time")
    return _nir().Delay(delay=np.array(np.broadcast_to(_numpy(m.steps) * dt, feature_in), dtype=np.float64))


_EXPORTERS: dict[type, _Exporter] = {
    PerStep: _per_step_node, nn.Linear: _linear_node, nn.Conv1d: _conv_node, nn.Conv2d: _conv_node,
    nn.AvgPool2d: _pool_node, Flatten: _flatten_node, Scale: _scale_node, Threshold: _threshold_node,
    Delay: _delay_node, FlexSN: _neuron_node,
}


def _layer_node(m: nn.Module, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    """The NIR node of a torch layer (or one of this module's layers): the exporter of its class,
    or of the nearest base class that has one."""
    export = next((_EXPORTERS[cls] for cls in type(m).__mro__ if cls in _EXPORTERS), None)
    if export is None:
        raise NIRError(f"{where}: {type(m).__name__} has no NIR node (to_nir exports Linear, Conv1d, Conv2d, "
                       "AvgPool2d, flatten/reshape, addition and flexsn-dsl neurons)")
    return export(m, feature_in, dt, where)


_PASS_THROUGH = (nn.Identity, nn.Dropout)
_RESHAPES = {"flatten", "unflatten", "view", "reshape", "contiguous"}


class _Tracer(torch.fx.Tracer):
    def is_leaf_module(self, m: nn.Module, qualified_name: str) -> bool:
        """Our modules are one node each (a PerStep of one layer: that layer's node); a PerStep of
        several layers, or of a reshape or pass-through layer (no node of its own), is traced into."""
        if isinstance(m, PerStep):
            return not isinstance(m.layer, (nn.Sequential, nn.Flatten, *_PASS_THROUGH))
        return isinstance(m, (FlexSN, Flatten, Scale, Threshold, Delay)) or super().is_leaf_module(m, qualified_name)


class _Shapes(torch.fx.Interpreter):
    """Runs the traced module once, recording each node's output shape."""

    def __init__(self, gm: torch.fx.GraphModule):
        super().__init__(gm)
        self.shapes: dict[torch.fx.Node, tuple[int, ...] | None] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        out = super().run_node(n)
        self.shapes[n] = tuple(out.shape) if isinstance(out, torch.Tensor) else None
        return out


def _feature(shape: tuple[int, ...] | None, steps: int, where: str) -> tuple[int, ...]:
    """One sample's shape: ``shape`` without its leading time and batch dimensions (together T*B elements)."""
    if shape is not None:
        for k in range(1, len(shape) + 1):
            if math.prod(shape[:k]) == steps:
                return tuple(shape[k:])
    raise NIRError(f"{where}: its output (shape {None if shape is None else list(shape)}) does not start with the "
                   "time and batch dimensions of the sample input")


def _flatten_dims(before: tuple[int, ...], after: tuple[int, ...]) -> tuple[int, int] | None:
    """(start, end) such that flattening ``before`` over start..end gives ``after``; None if none does."""
    for start in range(len(before)):
        for end in range(start, len(before)):
            if before[:start] + (math.prod(before[start:end + 1]),) + before[end + 1:] == after:
                return start, end
    return None


_CARRIED = ((FlexSN, ("states", "state_seqs")), (Delay, ("history",)), (NIRNetwork, ("_previous",)))


@contextlib.contextmanager
def _carried_state_kept(module: nn.Module) -> Iterator[None]:
    """Puts back, after the block, what ``module``'s layers carry from one call to the next: the
    neurons' states, the delay lines, the cycles' last outputs."""
    saved = [(m, name, getattr(m, name)) for m in module.modules() for kind, names in _CARRIED
             if isinstance(m, kind) for name in names]
    saved = [(m, name, dict(value) if isinstance(value, dict) else value)  # a copy: a cycle updates its dict
             for m, name, value in saved]
    try:
        yield
    finally:
        for m, name, value in saved:
            setattr(m, name, value)


def to_nir(module: nn.Module, sample_input: torch.Tensor, dt: float | None = None) -> Any:
    """A ``nir.NIRGraph`` of ``module`` (which takes ``[T, B, ...]``), traced with torch.fx and run
    once on ``sample_input`` for the shapes (what its layers carry across calls is put back afterwards).

    Linear, Conv1d/2d, AvgPool2d (SumPool2d with ``divisor_override=1``), reshapes of the sample
    dimensions (Flatten) and additions (edges into one node) map to their NIR nodes; reshapes that
    only fold time into batch vanish. Each flexsn-dsl neuron becomes the NIR neuron whose
    equations its spec has, found symbolically; a discrete-time (``step``) spec is read as an
    Euler step of length ``dt``. A module that matches no NIR node raises :class:`NIRError`
    naming the closest node and the term that differs.
    """
    _nir()  # MissingDependency before any work
    if sample_input.dim() < 3:
        raise ValueError(f"sample_input must be [T, B, ...] with sample dimensions, got shape {list(sample_input.shape)}")
    if dt is not None:
        _check_dt(dt)
    if isinstance(module, NIRNetwork):
        return _export_network(module, sample_input, dt)
    tracer = _Tracer()
    if tracer.is_leaf_module(module, ""):
        module = nn.Sequential(module)  # torch.fx traces into the root module: make a leaf a child
    try:
        graph = tracer.trace(module)
    except Exception as exc:  # torch.fx refuses data-dependent control flow and the like
        raise NIRError(f"torch.fx cannot trace {type(module).__name__}: {exc}") from exc
    gm = torch.fx.GraphModule(tracer.root, graph)
    shapes = _Shapes(gm)
    with _carried_state_kept(module), torch.no_grad():
        shapes.run(sample_input)
    return _FxExport(gm, shapes.shapes, sample_input.shape[0] * sample_input.shape[1], dt).graph()


class _FxExport:
    """The NIR graph of a traced module, built from its fx graph node by node, one method per kind of
    operation; ``shapes`` are the output shapes of one run, ``steps`` its T*B."""

    def __init__(self, gm: torch.fx.GraphModule, shapes: dict[torch.fx.Node, tuple[int, ...] | None], steps: int,
                 dt: float | None):
        self.gm, self.shapes, self.steps, self.dt = gm, shapes, steps, dt
        self.nodes: dict[str, Any] = {}
        self.edges: list[tuple[str, str]] = []
        self.sources: dict[torch.fx.Node, list[str]] = {}  # fx node -> the NIR nodes whose outputs sum to it

    def graph(self) -> Any:
        for n in self.gm.graph.nodes:
            where = f"{n.op} {n.target if n.op != 'call_module' else repr(n.target)}"
            if n.op != "output" and self.shapes[n] is None:
                continue  # sizes and other non-tensor values: not data flow
            if n.op == "placeholder":
                self._input(n, where)
            elif n.op == "output":
                self._output(n)
            elif n.op == "call_module":
                self._layer(n, where)
            elif (n.op == "call_function" and n.target in (operator.add, torch.add)) or \
                    (n.op == "call_method" and n.target == "add"):
                self._add(n, where)
            elif (n.op == "call_method" and n.target in _RESHAPES) or \
                    (n.op == "call_function" and n.target in (torch.flatten, torch.reshape, torch.unflatten)):
                self._reshape(n, self._inputs_of(n, where), where)
            else:
                raise NIRError(f"{where}: this operation has no NIR node")
        return _nir().NIRGraph(nodes=self.nodes, edges=self.edges)

    def _tensors(self, n: torch.fx.Node) -> list[torch.fx.Node]:
        """The arguments of ``n`` that are tensors (sizes read off ``x.shape`` are not data flow)."""
        found: list[torch.fx.Node] = []
        torch.fx.node.map_arg((n.args, n.kwargs), lambda a: found.append(a) if self.shapes[a] is not None else None)
        return found

    def _inputs_of(self, n: torch.fx.Node, where: str) -> list[str]:
        args = self._tensors(n)
        if len(args) != 1:
            raise NIRError(f"{where} takes {len(args)} tensors; NIR nodes take one")
        return self.sources[args[0]]

    def _node_feature(self, n: torch.fx.Node, where: str) -> tuple[int, ...]:
        return _feature(self.shapes[n], self.steps, where)

    def _add_node(self, n: torch.fx.Node, node: Any, srcs: list[str]) -> None:
        # named after the layer's attribute path ("conv", "layers.2"), else fx's name for the operation
        name = {"placeholder": "input", "output": "output"}.get(n.op, str(n.target) if n.op == "call_module" else n.name)
        if name in self.nodes:
            name = n.name
        self.nodes[name] = node
        self.edges.extend((s, name) for s in srcs)
        self.sources[n] = [name]

    def _input(self, n: torch.fx.Node, where: str) -> None:
        if self.nodes:
            raise NIRError(f"{where}: to_nir exports modules with one input")
        self._add_node(n, _nir().Input(input_type=np.array(self._node_feature(n, where))), [])

    def _output(self, n: torch.fx.Node) -> None:
        out = n.args[0]
        if not isinstance(out, torch.fx.Node):
            raise NIRError("the module must return one tensor")
        self._add_node(n, _nir().Output(output_type=np.array(self._node_feature(out, "the output"))), self.sources[out])

    def _layer(self, n: torch.fx.Node, where: str) -> None:
        m = self.gm.get_submodule(n.target)
        srcs = self._inputs_of(n, where)
        if isinstance(m, _PASS_THROUGH):
            self.sources[n] = srcs
        elif isinstance(m, nn.Flatten):
            self._reshape(n, srcs, where)
        else:
            self._add_node(n, _layer_node(m, self._node_feature(self._tensors(n)[0], where), self.dt, where), srcs)
            if isinstance(m, FlexSN) and m.spec.recurrent:  # its weight on an edge back to itself
                (name,), rec = self.sources[n], next(iter(m.spec.recurrent.values()))
                _loop_back(self.nodes, self.edges, name, f"{name}.{rec.weight_name}", getattr(m, rec.weight_name))

    def _add(self, n: torch.fx.Node, where: str) -> None:
        args = self._tensors(n)
        if len(args) != len(n.args) or len(args) != 2 or n.kwargs:
            raise NIRError(f"{where}: only the sum of two layers' outputs is exported (a sum is two edges "
                           "into the next node)")
        self.sources[n] = self.sources[args[0]] + self.sources[args[1]]

    def _reshape(self, n: torch.fx.Node, srcs: list[str], where: str) -> None:
        """A reshape: nothing where it only folds or unfolds time and batch, else a NIR Flatten."""
        before = self._node_feature(next(a for a in n.all_input_nodes if self.shapes[a] is not None), where)
        after = self._node_feature(n, where)
        if before == after:
            self.sources[n] = srcs
            return
        dims = _flatten_dims(before, after)
        if dims is None:
            raise NIRError(f"{where}: reshapes one sample from {list(before)} to {list(after)}, which is not a flatten")
        self._add_node(n, _nir().Flatten(input_type={"input": np.array(before)}, start_dim=dims[0], end_dim=dims[1]),
                       srcs)


def _export_network(net: NIRNetwork, sample_input: torch.Tensor, dt: float | None) -> Any:
    """A network made by :func:`from_nir` (and trained since, perhaps) back as a NIR graph: its
    nodes and edges, each layer as it is now."""
    nir = _nir()
    steps = sample_input.shape[0] * sample_input.shape[1]
    feature: dict[str, tuple[int, ...]] = {}

    def record(key: str):
        def hook(module: nn.Module, args: tuple, out: Any) -> None:
            feature.setdefault(key, tuple(args[0].shape))
        return hook
    hooks = [m.register_forward_hook(record(key)) for key, m in net.nodes.items()]
    try:
        with _carried_state_kept(net), torch.no_grad():
            out = net(sample_input)
    finally:
        for h in hooks:
            h.remove()
    nodes: dict[str, Any] = {}
    edges = [(a, b) for b, preds in net._preds.items() for a in preds]
    for neuron, linear in net.folded.items():
        _loop_back(nodes, edges, neuron, linear, net.node(neuron).rec_weight)
    for name, key in net.names.items():
        if name in nodes:
            continue
        if name in net._inputs:
            nodes[name] = nir.Input(input_type=np.array(_feature(tuple(sample_input.shape), steps, name)))
        elif name in net._outputs:
            nodes[name] = nir.Output(output_type=np.array(_feature(tuple(out.shape), steps, name)))
        elif key not in net.nodes or isinstance(net.nodes[key], NIRNetwork):
            raise NIRError(f"node {name!r}: an identity or a subgraph, which to_nir does not write back")
        else:
            nodes[name] = _layer_node(net.nodes[key], feature[key][2:], dt, f"node {name!r}")  # [T, B, ...]
    return nir.NIRGraph(nodes=nodes, edges=edges)

