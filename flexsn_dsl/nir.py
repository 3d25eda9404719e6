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

import json
import math
import os
from dataclasses import dataclass
from typing import Any, Iterable, Sequence

import numpy as np
import torch
from torch import nn

from .errors import MissingDependency
from .model import METHODS
from .runtime import BACKENDS, FlexSN, loads

__all__ = ["NIRError", "NIRNetwork", "from_nir"]


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


def neuron_spec(kind: NeuronKind, method: str, shapes: dict[str, tuple[int, ...]]) -> str:
    """The spec text of a NIR neuron kind; ``shapes`` gives the parameters that hold one value per neuron."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    lines = [f"neuron: nir_{kind.kind.lower()}", f"description: {json.dumps(kind.description)}", "inputs: [x]", "parameters:"]
    for name in kind.params:
        if name in shapes:
            dims = ", ".join(str(int(n)) for n in shapes[name])
            lines.append(f"  {name}: {{value: 1.0, shape: [{dims}]}}")
        else:
            lines.append(f"  {name}: 1.0")
    lines += ["  dt: 1.0", "states:", *(f"  {s}: {init}" for s, init in kind.states),
              "equations:", *(f"  {s}: {rhs}" for s, rhs in kind.equations), f"method: {method}"]
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


def _neuron(node: Any, name: str, dt: float, method: str, backend: str) -> FlexSN:
    """A NIR neuron node as a FlexSN: uniform arrays become numbers (baked into the kernels),
    the others parameters with the array's shape (one value per neuron)."""
    kind = NEURONS[type(node).__name__]
    params: dict[str, float | torch.Tensor] = {"dt": dt}
    shapes: dict[str, tuple[int, ...]] = {}
    for p in kind.params:
        array = _array(getattr(node, p), f"node {name!r}: parameter {p!r}")
        if array.size == 0:
            raise NIRError(f"node {name!r}: parameter {p!r} is empty")
        if array.size == 1 or np.all(array == array.flat[0]):
            params[p] = float(array.flat[0])
        else:
            shapes[p] = array.shape
            params[p] = torch.tensor(array)
    return loads(neuron_spec(kind, method, shapes), params=params, backend=backend, filename=f"<nir {kind.kind}>")


# -- the other nodes as torch modules ------------------------------------------------------

class PerStep(nn.Module):
    """Applies a layer to every step of ``[T, B, ...]`` at once (time folded into the batch)."""

    def __init__(self, layer: nn.Module):
        super().__init__()
        self.layer = layer

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.layer(x.flatten(0, 1))
        return y.unflatten(0, x.shape[:2])


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


class Delay(nn.Module):
    """NIR's Delay, ``y(t) = x(t - delay)``, with each delay a whole number of steps
    (``round(delay / dt)``); the last steps are carried across calls until :meth:`reset`."""

    def __init__(self, steps: torch.Tensor):
        super().__init__()
        self.register_buffer("steps", steps)
        self.history: torch.Tensor | None = None

    def reset(self) -> None:
        self.history = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        depth = int(self.steps.max()) if self.steps.numel() else 0
        if depth == 0:
            return x
        history = self.history
        if history is None or history.shape[1:] != x.shape[1:]:
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


def _layer(node: Any, name: str, dt: float, method: str, backend: str) -> nn.Module | None:
    """The module of one node; None for Input, Output and Identity (pass-through)."""
    nir = _nir()
    kind = type(node).__name__
    if kind in NEURONS:
        return _neuron(node, name, dt, method, backend)
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
                 inputs: list[str], outputs: list[str]):
        super().__init__()
        self.names = {name: f"node{i}" for i, name in enumerate(names)}
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
    modules = {n: _layer(graph.nodes[n], prefix + n, dt, method, backend) for n in names}
    inputs = [n for n in names if isinstance(graph.nodes[n], nir.Input)]
    outputs = [n for n in names if isinstance(graph.nodes[n], nir.Output)]
    if not inputs or not outputs:
        raise NIRError(f"the graph {prefix or ''}needs an Input and an Output node (it has "
                       f"{len(inputs)} and {len(outputs)})")
    edges = [(str(a), str(b)) for a, b in graph.edges]
    for a, b in edges:
        if b in inputs:
            raise NIRError(f"edge ({a!r}, {b!r}) leads into the Input node {b!r}")
    return NIRNetwork(names, modules, edges, inputs, outputs)


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
    if not isinstance(dt, (int, float)) or isinstance(dt, bool) or not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be a positive number, got {dt!r}")
    graph = graph_or_path
    if isinstance(graph, (str, os.PathLike)):
        graph = nir.read(graph)
    if not isinstance(graph, nir.NIRGraph):
        graph = nir.NIRGraph.from_list(graph)
    return _network(graph, float(dt), method, backend)
