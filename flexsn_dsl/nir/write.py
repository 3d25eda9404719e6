"""Stage 7 (NIR): writing a module as a NIR graph: the module traced with torch.fx, each layer
a NIR node (a neuron module through :func:`~flexsn_dsl.nir.match.match_neuron`), the shapes
from a sample input."""
from __future__ import annotations

import contextlib
import math
import operator
from typing import Any, Callable, Iterator

import numpy as np
import sympy
import torch
from torch import nn

from ..delays import Delay, DelayLinear
from ..layers import PerStep
from ..runtime import FlexSN
from ..errors import NIRError
from .kinds import NEURONS, ORDER_KEY, _nir
from .match import check_ports, match_neuron
from .read import DelayLine, Flatten, NIRNetwork, Scale, Threshold, _check_dt, _ints


def _numpy(t: torch.Tensor) -> np.ndarray:
    """A tensor's values as a numpy array of their own, on the host."""
    return t.detach().cpu().numpy().copy()


def _loop_back(nodes: dict[str, Any], edges: list[tuple[str, str]], neuron: str, linear: str,
               weight: torch.Tensor) -> None:
    """A neuron's recurrent weight as NIR writes it: a Linear node on an edge from the neuron back to it."""
    nodes[linear] = _nir().Linear(weight=_numpy(weight))
    edges += [(neuron, linear), (linear, neuron)]


_NUMPY = [{"Sigmoid": lambda a: 1.0 / (1.0 + np.exp(-a))}, "numpy"]  # the language's own functions, for numpy


def _neuron_node(m: FlexSN, feature: tuple[int, ...], dt: float | None, where: str) -> Any:
    """The NIR node of one of our neuron modules, its arrays of the layer's shape ``feature``."""
    nir = _nir()
    if m._compiled.model.draws:
        raise NIRError(f"{where}: {m.spec.name} draws random numbers (rand(), randn() or xi), and NIR has no "
                       "noise: export the neuron without them")
    if getattr(m, "nir_order", "nir") != "nir":
        return _ordered_node(m, feature, where)
    kind, values, _ = match_neuron(m, dt)
    missing = [p for p in kind.params if p not in values]
    if missing:
        raise NIRError(f"{where}: {m.spec.name} matches NIR {kind.kind} but does not fix {missing}")
    arrays: dict[str, np.ndarray] = {}
    for p in kind.params:
        expr = values[p]
        symbols = sorted(expr.free_symbols, key=str)  # the shaped parameters it depends on
        args = [_numpy(getattr(m, s.name).double()) for s in symbols]
        value = np.asarray(sympy.lambdify(symbols, expr, _NUMPY)(*args), dtype=np.float64)
        try:
            arrays[p] = np.array(np.broadcast_to(value, feature))
        except ValueError:
            raise NIRError(f"{where}: parameter {p} of shape {list(value.shape)} does not broadcast to the "
                           f"layer's shape {list(feature)}") from None
    return getattr(nir, kind.kind)(**arrays)


def _ordered_node(m: FlexSN, feature: tuple[int, ...], where: str) -> Any:
    """The node of a CubaLIF/CubaLI that :func:`from_nir` made in an order other than NIR's: its parameters
    as they are now, the order in the node's metadata (the step is not NIR's equations, so it is not matched)."""
    kind = next(k for k in NEURONS.values() if f"nir_{k.kind.lower()}" == m.spec.name)
    arrays = {}
    for p in kind.params:
        value = _numpy(getattr(m, p).double()) if p in m.spec.shaped else np.float64(m.spec.parameters[p].value)
        arrays[p] = np.array(np.broadcast_to(value, feature))
    return getattr(_nir(), kind.kind)(**arrays, metadata={ORDER_KEY: m.nir_order})


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


def _whole_steps(m: Delay | DelayLinear, dt: float | None, where: str) -> torch.Tensor:
    """The module's delays (clamped) in whole steps; a NIRError without ``dt`` or for a fractional delay."""
    kind = "DelayLinear" if isinstance(m, DelayLinear) else "Delay"
    if dt is None:
        raise NIRError(f"{where}: a {kind} counts steps; give to_nir(..., dt=...) to write it in time")
    steps = m.delay.detach().clamp(0, m.max_delay)
    if not torch.equal(steps, steps.round()):
        raise NIRError(f"{where}: the {kind} has fractional delays, which NIR's Delay cannot hold; call "
                       "round_delays_() on it before to_nir")
    return steps


def _delay_node(m: Delay, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    steps = _whole_steps(m, dt, where)
    return _nir().Delay(delay=np.broadcast_to(_numpy(steps).astype(np.float64) * dt, feature_in).copy())


def _delay_linear_node(m: DelayLinear, feature_in: tuple[int, ...], dt: float | None, where: str) -> Any:
    """A subgraph of the same sum: for each delay ``s`` of the layer, a Delay of ``s`` steps on every input
    (none for 0) and a Linear of the synapses with that delay (the first an Affine with the bias), all summed."""
    nir = _nir()
    steps, weight = _whole_steps(m, dt, where), m.weight.detach()
    nodes: dict[str, Any] = {"input": nir.Input(input_type=np.array(feature_in)),
                             "output": nir.Output(output_type=np.array([m.out_features]))}
    edges: list[tuple[str, str]] = []
    for n, s in enumerate(torch.unique(steps).tolist()):
        w = _numpy(torch.where(steps == s, weight, 0))
        linear = nir.Affine(weight=w, bias=_numpy(m.bias)) if n == 0 and m.bias is not None else nir.Linear(weight=w)
        nodes[f"linear_{s:g}"] = linear
        if s:
            nodes[f"delay_{s:g}"] = nir.Delay(delay=np.full(feature_in, s * dt, dtype=np.float64))
            edges += [("input", f"delay_{s:g}"), (f"delay_{s:g}", f"linear_{s:g}")]
        else:
            edges.append(("input", f"linear_{s:g}"))
        edges.append((f"linear_{s:g}", "output"))
    return nir.NIRGraph(nodes=nodes, edges=edges)


_EXPORTERS: dict[type, _Exporter] = {
    PerStep: _per_step_node, nn.Linear: _linear_node, nn.Conv1d: _conv_node, nn.Conv2d: _conv_node,
    nn.AvgPool2d: _pool_node, Flatten: _flatten_node, Scale: _scale_node, Threshold: _threshold_node,
    Delay: _delay_node, DelayLinear: _delay_linear_node, FlexSN: _neuron_node,
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
        return isinstance(m, (FlexSN, Flatten, Scale, Threshold, Delay, DelayLinear)) or \
            super().is_leaf_module(m, qualified_name)


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
    """One sample's shape: ``shape`` without its leading time and batch dimensions (together T*B
    elements): ``[T, B, ...]`` first (so a batch of 1 is not taken for a sample dimension), then
    ``[T * B, ...]`` as a layer applied to every step sees it."""
    if shape is not None:
        for k in (2, 1, *range(3, len(shape) + 1)):
            if k <= len(shape) and math.prod(shape[:k]) == steps:
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


_CARRIED = ((FlexSN, ("states", "state_seqs")), (DelayLine, ("history",)), (NIRNetwork, ("_previous",)))


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
    for name, m in module.named_modules():  # before tracing: a neuron NIR cannot hold, in one line
        if isinstance(m, FlexSN):
            check_ports(m, f"module {name!r}" if name else "")
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

