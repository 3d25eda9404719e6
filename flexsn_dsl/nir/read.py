"""Stage 7 (NIR): reading a NIR graph into modules: each neuron node a FlexSN generated from the
spec of its kind, the other nodes torch layers applied to every step at once, wired by the graph's
edges (cycles run step by step)."""
from __future__ import annotations

import math
import os
from typing import Any

import numpy as np
import torch
from torch import nn

from ..delays import Delay
from ..layers import PerStep
from ..model import METHODS
from ..runtime import BACKENDS, FlexSN, loads
from ..errors import MissingDependency, NIRError, SpecError
from .check import _ints, check_graph
from .files import check_file, shown
from .kinds import CURRENT_FIRST_METHODS, NEURONS, ORDER_KEY, ORDERS, _nir, has_order, neuron_spec


# -- values: every element of every field checked ---------------------------------------------
POSITIVE = frozenset({"tau", "tau_syn", "tau_mem"})  # neuron fields that divide: each element must be > 0
MAX_NESTING = 32  # graphs inside graphs
MAX_DELAY_STEPS = 1 << 20  # a Delay keeps that many past steps of its input


def _array(value: Any, name: str, field: str, positive: bool = False) -> np.ndarray:
    """A field's values as float64, each element real and finite (and > 0 when ``positive``); a
    NIRError naming the node, the field and the first bad element's index otherwise."""
    array = np.asarray(value)
    where = f"node {name!r}, field {field!r}"
    if array.dtype.kind == "c":
        bad = np.argwhere(array.imag != 0)
        if len(bad):
            index = tuple(int(i) for i in bad[0])
            raise NIRError(f"{where}, index {list(index)}: {complex(array[index])!r} is complex, not a real number")
        array = array.real
    if array.dtype.kind not in "biuf":
        raise NIRError(f"{where} holds {array.dtype} values, not numbers")
    array = array.astype(np.float64)
    bad = ~np.isfinite(array) | ((array <= 0) if positive else False)
    if np.any(bad):
        index = tuple(int(i) for i in np.argwhere(bad)[0])
        value = float(array[index])
        wanted = "> 0" if positive and np.isfinite(value) else "a finite number"
        raise NIRError(f"{where}, index {list(index)}: {value!r} is not {wanted}")
    return array


def _tensor(value: Any, name: str, field: str) -> torch.Tensor:
    return torch.tensor(_array(value, name, field), dtype=torch.get_default_dtype())


def _nesting(graph: Any) -> None:
    """Refuse graphs nested deeper than MAX_NESTING (walked without recursion)."""
    nir = _nir()
    todo = [(graph, 0)]
    while todo:
        g, depth = todo.pop()
        if depth > MAX_NESTING:
            raise NIRError(f"the graph nests graphs {depth} deep, more than {MAX_NESTING}")
        todo += [(n, depth + 1) for n in g.nodes.values() if isinstance(n, nir.NIRGraph)]


def _order(node: Any, name: str, order: str | None) -> str:
    """The order a CubaLIF/CubaLI node runs in: ``order`` where given, else the one its metadata records
    (:data:`~flexsn_dsl.nir.kinds.ORDER_KEY`, as :func:`to_nir` writes it), else NIR's."""
    if order is not None:
        return order
    metadata = getattr(node, "metadata", None)
    recorded = metadata.get(ORDER_KEY) if isinstance(metadata, dict) else None
    if recorded is None:
        return "nir"
    if isinstance(recorded, np.ndarray) and recorded.shape == ():
        recorded = recorded.item()
    if isinstance(recorded, bytes):  # (a string read back from a file)
        recorded = recorded.decode("utf-8", "replace")
    if recorded not in ORDERS:
        raise NIRError(f"node {name!r}: metadata {ORDER_KEY!r} is {recorded!r}, not one of {list(ORDERS)}")
    return recorded


def _neuron(node: Any, name: str, dt: float, method: str, backend: str, order: str | None,
            feedback: Any = None) -> FlexSN:
    """A NIR neuron node as a FlexSN: uniform arrays become numbers (baked into the kernels),
    the others parameters with the array's shape (one value per neuron). ``order``: that of
    :func:`from_nir`; ``feedback``: the Linear node of an edge from the neuron back to itself, run
    inside the neuron's kernel."""
    kind = NEURONS[type(node).__name__]
    order = _order(node, name, order) if has_order(kind) else "nir"
    if order != "nir" and method not in CURRENT_FIRST_METHODS:
        raise NIRError(f"node {name!r} runs in the order {order!r} (its metadata), which integrates with method "
                       f"{' or '.join(map(repr, CURRENT_FIRST_METHODS))}, not {method!r}")
    params: dict[str, torch.Tensor] = {}
    numbers: dict[str, float] = {"dt": dt}  # written into the spec's text
    if feedback is not None:
        params["rec_weight"] = _tensor(feedback.weight, name, "rec_weight")
    shapes: dict[str, tuple[int, ...]] = {}
    arrays: dict[str, np.ndarray] = {}
    for p in kind.params:
        array = arrays[p] = _array(getattr(node, p), name, p, positive=p in POSITIVE)
        if array.size == 0:
            raise NIRError(f"node {name!r}, field {p!r} is empty")
        if array.size == 1 or np.all(array == array.flat[0]):
            numbers[p] = float(array.flat[0])
        else:
            shapes[p] = array.shape
            params[p] = torch.tensor(array, dtype=torch.get_default_dtype())
    if method == "exact" and order == "nir" and {"tau_syn", "tau_mem"} & set(shapes):
        same = arrays["tau_syn"] == arrays["tau_mem"]
        if np.any(same):
            raise NIRError(f"node {name!r}: tau_syn equals tau_mem for {int(same.sum())} neuron(s), where the exact "
                           "per-neuron propagator divides by tau_syn - tau_mem; import it with method='rk4' "
                           "(or give every neuron the same two time constants)")
    try:
        module = loads(neuron_spec(kind, method, shapes, feedback is not None, numbers, order), params=params,
                       backend=backend, filename=f"<nir {kind.kind}>")
    except SpecError as exc:  # values the spec's own checks refuse (a time constant that overflows dt / tau)
        raise NIRError(f"node {name!r}: {exc.message}" + (f" ({exc.hint})" if exc.hint else "")) from None
    module.nir_order = order  # (to_nir writes it back: a current-first step is no NIR equation of its own)
    return module


# -- the other nodes as torch modules ------------------------------------------------------

def _tensor_text(name: str, tensor: torch.Tensor) -> str:
    """``name``: a tensor's shape and range of values, for a module's repr."""
    if tensor.numel() == 0:
        return f"{name}: {list(tensor.shape)}"
    lo, hi = float(tensor.min()), float(tensor.max())
    return f"{name}: {list(tensor.shape)} " + (f"all {lo:.4g}" if lo == hi else f"in [{lo:.4g}, {hi:.4g}]")


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

    def extra_repr(self) -> str:
        return _tensor_text("scale", self.scale)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * self.scale.to(x.dtype)


class Threshold(nn.Module):
    """NIR's Threshold: 1 where ``x > threshold``, else 0 (no gradient)."""

    def __init__(self, threshold: torch.Tensor):
        super().__init__()
        self.register_buffer("threshold", threshold)

    def extra_repr(self) -> str:
        return _tensor_text("threshold", self.threshold)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (x > self.threshold.to(x.dtype)).to(x.dtype)


class DelayLine(Delay):
    """NIR's Delay, ``y(t) = x(t - delay)``: a :class:`~flexsn_dsl.Delay` of whole steps
    (``delay / dt``) whose last steps are carried across calls until :meth:`reset` (dropped when
    the input's shape or the delays' longest changes). It reads nothing back from the device."""

    def __init__(self, steps: torch.Tensor):
        super().__init__(steps)
        self.history: torch.Tensor | None = None

    def extra_repr(self) -> str:
        return _tensor_text("delay", self.delay)

    def reset(self) -> None:
        self.history = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        history = self.history
        if history is not None and history.shape != (self.history_steps, *x.shape[1:]):
            history = None
        y, history = super().forward(x, history=history, return_history=True)
        self.history = history.detach()
        return y


def _conv(node: Any, name: str, dims: int) -> nn.Module:
    """A Conv1d/Conv2d node (its fields checked by :func:`~flexsn_dsl.nir.check.check_graph`)."""
    weight = _tensor(node.weight, name, "weight")
    padding = node.padding.decode() if isinstance(node.padding, bytes) else node.padding
    if not isinstance(padding, str):
        padding = _ints(padding, dims, "padding")
    (groups,) = _ints(node.groups, 1, "groups")
    cls = nn.Conv1d if dims == 1 else nn.Conv2d
    layer = cls(weight.shape[1] * groups, weight.shape[0], tuple(weight.shape[2:]),
                stride=_ints(node.stride, dims, "stride"), padding=padding,
                dilation=_ints(node.dilation, dims, "dilation"), groups=groups)
    with torch.no_grad():
        layer.weight.copy_(weight)
        layer.bias.copy_(_tensor(node.bias, name, "bias").reshape(-1) * torch.ones(weight.shape[0]))
    return PerStep(layer)


def _linear(node: Any, name: str, bias: bool) -> nn.Linear:
    weight = _tensor(node.weight, name, "weight")
    layer = nn.Linear(weight.shape[1], weight.shape[0], bias=bias)
    with torch.no_grad():
        layer.weight.copy_(weight)
        if bias:
            layer.bias.copy_(_tensor(node.bias, name, "bias").reshape(-1) * torch.ones(weight.shape[0]))
    return layer


def _pool(node: Any, summing: bool) -> nn.Module:
    kernel, stride, padding = (_ints(getattr(node, f), 2, f) for f in ("kernel_size", "stride", "padding"))
    return PerStep(nn.AvgPool2d(kernel, stride, padding, divisor_override=1 if summing else None))


def _delay(node: Any, name: str, dt: float) -> DelayLine:
    delay = _array(node.delay, name, "delay") / dt
    steps = np.round(delay)
    if np.any(steps > MAX_DELAY_STEPS):
        raise NIRError(f"node {name!r}: a delay of {float(steps.max()):g} steps of dt={dt}, more than the "
                       f"{MAX_DELAY_STEPS} a Delay keeps")
    if np.any(steps < 0) or not np.allclose(delay, steps, rtol=0, atol=1e-9):
        raise NIRError(f"node {name!r}: delays must be non-negative whole multiples of dt={dt}, got "
                       f"{(delay * dt).ravel()[:8].tolist()}")
    return DelayLine(torch.tensor(steps, dtype=torch.get_default_dtype()))


def _layer(node: Any, name: str, dt: float, method: str, backend: str, order: str | None,
           feedback: Any = None) -> nn.Module | None:
    """The module of one node; None for Input, Output and Identity (pass-through)."""
    nir = _nir()
    kind = type(node).__name__
    if kind in NEURONS:
        return _neuron(node, name, dt, method, backend, order, feedback)
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
        return _pool(node, summing=True)
    if isinstance(node, nir.AvgPool2d):
        return _pool(node, summing=False)
    if isinstance(node, nir.Scale):
        return Scale(_tensor(node.scale, name, "scale"))
    if isinstance(node, nir.Threshold):
        return Threshold(_tensor(node.threshold, name, "threshold"))
    if isinstance(node, nir.Delay):
        return _delay(node, name, dt)
    if isinstance(node, nir.NIRGraph):
        return _network(node, dt, method, backend, order, f"{name}.")
    raise NIRError(f"node {name!r} is a {kind}, which from_nir cannot run")  # (check_graph refused it before)


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
    carrying the previous step's output; before the first step (after :meth:`reset`), that of the
    starting state, as NIR's equations have it: neurons give their starting output (no spikes, or
    ``v``'s initial value) and the other nodes their output on that (an ``Affine``'s bias).
    ``nodes`` holds the modules under fixed keys (``node0``, ...); ``names`` maps each NIR node
    name to its key; ``shapes`` gives one sample's shape out of each node.
    """

    def __init__(self, names: list[str], modules: dict[str, nn.Module | None], edges: list[tuple[str, str]],
                 inputs: list[str], outputs: list[str], folded: dict[str, str], shapes: dict[str, tuple[int, ...]]):
        super().__init__()
        self.shapes = dict(shapes)
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

    def extra_repr(self) -> str:
        cycles = sum(len(c) > 1 or c[0] in self._preds[c[0]] for c in self._components)
        return (f"inputs={self._inputs}, outputs={self._outputs}, edges={sum(map(len, self._preds.values()))}, "
                f"cycles={cycles}, names={self.names}")

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
        for name, x in zip(self._inputs, xs):
            if tuple(x.shape[2:]) != self.shapes[name] or x.dim() < 2:
                raise ValueError(f"input {name!r} takes [T, B, {', '.join(map(str, self.shapes[name]))}], got "
                                 f"{list(x.shape)}")
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
        itself) gives its output of the previous step (:meth:`_start` before the first)."""
        position = {n: i for i, n in enumerate(comp)}
        outside = next((values[p] for n in comp for p in self._preds[n] if p not in position), None)
        if outside is None:
            raise NIRError(f"the cycle {comp!r} has no input from outside it")
        steps: dict[str, list[torch.Tensor]] = {n: [] for n in comp}
        for t in range(outside.shape[0]):
            if any(n not in self._previous for n in comp):
                self._previous.update(self._start(comp, outside[:1]))
            now: dict[str, torch.Tensor] = {}
            for n in comp:
                total = None
                for p in self._preds[n]:
                    v = values[p][t:t + 1] if p not in position else now[p] if position[p] < position[n] \
                        else self._previous[p]
                    total = v if total is None else total + v
                now[n] = self._apply_node(n, total)
            for n in comp:
                self._previous[n] = now[n]
                steps[n].append(now[n])
        for n in comp:
            values[n] = torch.cat(steps[n])

    def _start(self, comp: list[str], like: torch.Tensor) -> dict[str, torch.Tensor]:
        """Each node's output before the first step of its cycle: a neuron's starting output (no spikes,
        or ``v``'s initial value), a delay's or a subgraph's zero, any other node's output on its
        inputs' (nothing comes from outside the cycle before the first step); ``like`` (one step of
        an input to the cycle) gives the batch, dtype and device."""
        start: dict[str, torch.Tensor] = {}
        visiting: set[str] = set()

        def zero(n: str) -> torch.Tensor:
            return like.new_zeros((1, like.shape[1], *self.shapes[n]))

        def value(n: str) -> torch.Tensor:
            if n not in comp or n in visiting:
                return zero(n)
            if n not in start:
                visiting.add(n)
                module = self.nodes[self.names[n]] if self.names[n] in self.nodes else None
                if isinstance(module, FlexSN):
                    start[n] = _starting_output(module, zero(n))
                elif isinstance(module, (Delay, NIRNetwork)):
                    start[n] = zero(n)
                else:
                    total = zero(n)
                    for p in self._preds[n]:
                        total = total + value(p)
                    start[n] = self._apply_node(n, total)
                visiting.discard(n)
            return start[n]
        return {n: value(n) for n in comp}


def _starting_output(neuron: FlexSN, zero: torch.Tensor) -> torch.Tensor:
    """What a neuron gives before its first step: its output state's initial value, or no spikes."""
    name = neuron._compiled.model.outputs[0][0]
    states = list(neuron._compiled.model.states)
    if name not in states:
        return zero
    value = neuron._initial_values(neuron._param_values())[states.index(name)]
    return zero + (value.to(zero) if isinstance(value, torch.Tensor) else float(value))


def _network(graph: Any, dt: float, method: str, backend: str, order: str | None, prefix: str = "") -> NIRNetwork:
    nir = _nir()
    for a, b in graph.edges:
        for end in (a, b):
            if end not in graph.nodes:
                raise NIRError(f"edge ({prefix}{a!r}, {prefix}{b!r}) names node {end!r}, which the graph does not have")
    shapes = check_graph(graph, prefix)
    edges = [(str(a), str(b)) for a, b in graph.edges]
    folded = _feedback_loops(graph, edges, shapes)
    edges = [(a, b) for a, b in edges if folded.get(a) != b and folded.get(b) != a]
    names = [n for n in graph.nodes if n not in folded.values()]
    modules = {n: _layer(graph.nodes[n], prefix + n, dt, method, backend, order,
                         graph.nodes[folded[n]] if n in folded else None) for n in names}
    inputs = [n for n in names if isinstance(graph.nodes[n], nir.Input)]
    outputs = [n for n in names if isinstance(graph.nodes[n], nir.Output)]
    return NIRNetwork(names, modules, edges, inputs, outputs, folded, {n: shapes[n] for n in names})


def _feedback_loops(graph: Any, edges: list[tuple[str, str]], shapes: dict[str, tuple[int, ...]]) -> dict[str, str]:
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
        if kind is None or not kind.spiking or len(shapes[n]) != 1:
            continue
        for p in preds[n]:
            if (type(graph.nodes[p]) is nir.Linear and preds[p] == [n] and succs[p] == [n]
                    and p not in found.values()):
                found[n] = p
                break
    return found


def _check_dt(dt: Any) -> None:
    if not isinstance(dt, (int, float)) or isinstance(dt, bool) or not math.isfinite(dt) or dt <= 0:
        raise ValueError(f"dt must be a positive number, got {dt!r}")


def from_nir(graph_or_path: Any, dt: float, method: str = "exact", backend: str = "auto",
             order: str | None = None) -> NIRNetwork:
    """A NIR graph (a ``nir.NIRGraph`` or the path of a NIR file) as an ``nn.Module`` over ``[T, B, ...]``.

    ``dt`` is the length of one step, in the unit of the graph's time constants (seconds for
    graphs from snnTorch, Norse and most others). ``method`` integrates the neurons' equations
    (``exact``, ``euler``, ``rk2``, ``rk4``, ``exponential_euler``; a graph exported from a
    framework that steps with Euler runs as it did there with ``method="euler"``). ``order`` is
    that of a CubaLIF/CubaLI step: ``"nir"`` (NIR's reference: the voltage integrates with the
    current from before this step's input) or ``"current_first"`` (snnTorch and Norse: the current
    takes this step's input first, the voltage integrates with the new current; ``exact`` or
    ``euler``); None: the order each node's metadata records (:func:`to_nir` writes it), else
    ``"nir"``. ``backend`` is that of :func:`flexsn_dsl.load`. Every graph passes
    :func:`~flexsn_dsl.nir.check.check_graph` first.
    """
    nir = _nir()
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, got {backend!r}")
    if order is not None and order not in ORDERS:
        raise ValueError(f"order must be one of {ORDERS} (or None: as each node records), got {order!r}")
    if order == "current_first" and method not in CURRENT_FIRST_METHODS:
        raise ValueError(f"order='current_first' integrates with method 'exact' or 'euler', got {method!r}")
    _check_dt(dt)
    graph = read_graph(graph_or_path) if isinstance(graph_or_path, (str, os.PathLike)) else graph_or_path
    try:
        if not isinstance(graph, nir.NIRGraph):
            graph = nir.NIRGraph.from_list(graph)
        _nesting(graph)
        return _network(graph, float(dt), method, backend, order)
    except (NIRError, MissingDependency):
        raise
    except Exception as exc:  # noqa: BLE001 - a crafted graph: one line, never a traceback from deep inside
        raise NIRError(f"the graph cannot be imported: {_reason(exc)}") from None


def read_graph(path: str | os.PathLike) -> Any:
    """A NIR file as a ``nir.NIRGraph``, after :func:`~flexsn_dsl.nir.files.check_file`; a one-line
    NIRError for a file that is unsafe or that ``nir.read`` cannot read."""
    nir = _nir()
    check_file(path)
    try:
        return nir.read(path)
    except Exception as exc:  # noqa: BLE001 - nir.read raises KeyError, TypeError, ValueError... on crafted files
        raise NIRError(f"{shown(path)} is not a NIR graph nir.read can read: {_reason(exc)}") from None


def _reason(exc: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0][:300]}" if text else type(exc).__name__

