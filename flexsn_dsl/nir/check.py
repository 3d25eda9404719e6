"""Stage 7 (NIR): the checks every graph passes before it is built, whether it comes from a file
or was made (or changed) in memory: each node's own fields (kind, weight dimensions, strides,
paddings, Flatten dimensions), then the shape of one sample along every edge from the Input nodes,
against each node's weights, neuron arrays and declared types. Each failure is one NIRError
naming the node; the values of the arrays are checked per element when the node is built."""
from __future__ import annotations

from collections import deque
from typing import Any, Callable

import numpy as np

from ..errors import NIRError
from .kinds import NEURONS, _nir

Shape = tuple[int, ...]
Rule = Callable[[Shape], Shape]  # one sample's shape into a node -> out of it

SUPPORTED = (*NEURONS, "Affine", "Linear", "Conv1d", "Conv2d", "Flatten", "SumPool2d", "AvgPool2d", "Scale",
             "Threshold", "Delay", "Input", "Output", "Identity", "NIRGraph")


def _ints(value: Any, n: int, what: str, low: int = 0) -> tuple[int, ...]:
    """An int or a sequence of ints as an n-tuple, each at least ``low``."""
    array = np.asarray(value).reshape(-1)
    if array.size == 1:
        array = np.repeat(array, n)
    if array.dtype.kind not in "biuf" or array.size != n or not np.all(np.isfinite(array)) or \
            not np.all(array == np.round(array)) or np.any(array < low) or np.any(np.abs(array) > 2 ** 31):
        raise NIRError(f"{what} must be {n} whole number(s) of at least {low}, got "
                       f"{np.asarray(value).reshape(-1)[:8].tolist()}")
    return tuple(int(a) for a in array)


def _declared(types: Any, key: str, name: str) -> Shape | None:
    """Node ``name``'s declared type (``input_type["input"]``, ``output_type["output"]``) as a shape; None
    where it is not given (types nir infers only when it checks a graph)."""
    value = types.get(key) if isinstance(types, dict) else None
    if value is None:
        return None
    array = np.asarray(value).reshape(-1)
    return _ints(array, array.size, f"node {name!r}: its {key} shape", low=1) if array.size else ()


def _shape(value: Any) -> Shape:
    return tuple(int(n) for n in np.shape(value))


def _one_or(name: str, field: str, value: Any, wanted: Shape, what: str) -> None:
    """``field`` holds one value (for every element) or has the shape ``wanted``."""
    shape = _shape(value)
    if int(np.prod(shape)) != 1 and shape != wanted:
        raise NIRError(f"node {name!r}: field {field!r} has shape {list(shape)}, but {what} {list(wanted)}; give one "
                       "value or that shape")


def _same_as(name: str, want: Shape, what: str) -> Rule:
    def rule(s: Shape) -> Shape:
        if s != want:
            raise NIRError(f"node {name!r}: its input has shape {list(s)}, but {what} {list(want)}")
        return s
    return rule


def _linear(node: Any, name: str) -> Rule:
    weight = _shape(node.weight)
    if len(weight) != 2:
        raise NIRError(f"node {name!r}: only 2-d weights are supported, got shape {list(weight)}")
    if hasattr(node, "bias"):
        _one_or(name, "bias", node.bias, weight[:1], "the weight has rows")

    def rule(s: Shape) -> Shape:
        _same_as(name, weight[1:], f"its weight {list(weight)} takes")(s)
        return weight[:1]
    return rule


def _window(size: int, kernel: int, stride: int, padding: int, dilation: int = 1) -> int:
    return (size + 2 * padding - dilation * (kernel - 1) - 1) // stride + 1


def _conv(node: Any, name: str, dims: int) -> Rule:
    weight = _shape(node.weight)
    if len(weight) != dims + 2:
        raise NIRError(f"node {name!r}: a Conv{dims}d weight has {dims + 2} dimensions, got shape {list(weight)}")
    padding = node.padding.decode() if isinstance(node.padding, bytes) else node.padding
    stride = _ints(node.stride, dims, f"node {name!r}: stride", low=1)
    dilation = _ints(node.dilation, dims, f"node {name!r}: dilation", low=1)
    (groups,) = _ints(node.groups, 1, f"node {name!r}: groups", low=1)
    same = isinstance(padding, str) and padding == "same"
    if isinstance(padding, str):
        if padding not in ("same", "valid"):
            raise NIRError(f"node {name!r}: padding must be 'same', 'valid' or numbers, got {padding!r}")
        if same and stride != (1,) * dims:
            raise NIRError(f"node {name!r}: padding 'same' needs stride 1, got {list(stride)}")
        pads = (0,) * dims
    else:
        pads = _ints(padding, dims, f"node {name!r}: padding")
        if any(p > k for p, k in zip(pads, weight[2:])):
            raise NIRError(f"node {name!r}: padding {list(pads)} is more than the kernel {list(weight[2:])}")
    if weight[0] % groups:
        raise NIRError(f"node {name!r}: {weight[0]} output channels are not a multiple of groups={groups}")
    _one_or(name, "bias", node.bias, weight[:1], "the weight has output channels")
    given = getattr(node, "input_shape", None)
    spatial = None if given is None else _ints(given, dims, f"node {name!r}: input_shape", low=1)

    def rule(s: Shape) -> Shape:
        if len(s) != dims + 1 or s[0] != weight[1] * groups:
            raise NIRError(f"node {name!r}: its input has shape {list(s)}, but a Conv{dims}d of weight {list(weight)} "
                           f"and groups={groups} takes [{weight[1] * groups}, ...] ({dims} spatial dimensions)")
        if spatial is not None and s[1:] != spatial:
            raise NIRError(f"node {name!r}: its input has shape {list(s)}, but its input_shape is {list(spatial)}")
        out = s[1:] if same else tuple(
            _window(n, k, st, p, d) for n, k, st, p, d in zip(s[1:], weight[2:], stride, pads, dilation))
        if min(out) < 1:
            raise NIRError(f"node {name!r}: an input of shape {list(s)} is smaller than its kernel {list(weight[2:])}")
        return (weight[0], *out)
    return rule


def _pool(node: Any, name: str) -> Rule:
    kernel = _ints(node.kernel_size, 2, f"node {name!r}: kernel_size", low=1)
    stride = _ints(node.stride, 2, f"node {name!r}: stride", low=1)
    padding = _ints(node.padding, 2, f"node {name!r}: padding")
    if any(p > k for p, k in zip(padding, kernel)):
        raise NIRError(f"node {name!r}: padding {list(padding)} is more than the kernel {list(kernel)}")

    def rule(s: Shape) -> Shape:
        if len(s) != 3:
            raise NIRError(f"node {name!r}: its input has shape {list(s)}; a 2-d pooling takes [channels, height, "
                           "width]")
        out = tuple(_window(n, k, st, p) for n, k, st, p in zip(s[1:], kernel, stride, padding))
        if min(out) < 1:
            raise NIRError(f"node {name!r}: an input of shape {list(s)} is smaller than its kernel {list(kernel)}")
        return (s[0], *out)
    return rule


def _int(value: Any, what: str) -> int:
    array = np.asarray(value)
    if array.size != 1 or array.dtype.kind not in "biu" or abs(int(array.reshape(-1)[0])) > 2 ** 31:
        raise NIRError(f"{what} must be a whole number, got {array.reshape(-1)[:8].tolist()}")
    return int(array.reshape(-1)[0])


def _flatten(node: Any, name: str) -> Rule:
    start, end = (_int(getattr(node, f), f"node {name!r}: {f}") for f in ("start_dim", "end_dim"))
    declared = _declared(node.input_type, "input", name)

    def rule(s: Shape) -> Shape:
        if declared is not None:
            _same_as(name, declared, "its input_type is")(s)
        first, last = start + len(s) if start < 0 else start, end + len(s) if end < 0 else end
        if not 0 <= first <= last < len(s):
            raise NIRError(f"node {name!r}: start_dim={start}, end_dim={end} do not fit its input of shape {list(s)} "
                           f"(dimensions of one sample, 0 to {len(s) - 1} or -{len(s)} to -1, start before end)")
        return (*s[:first], int(np.prod(s[first:last + 1])), *s[last + 1:])
    return rule


def _elementwise(node: Any, name: str, fields: tuple[str, ...], what: str) -> Rule:
    """A node whose arrays act element by element: each holds one value or has the input's shape."""
    def rule(s: Shape) -> Shape:
        for field in fields:
            _one_or(name, field, getattr(node, field), s, what)
        return s
    return rule


def _subgraph(node: Any, name: str) -> Rule:
    nir = _nir()
    ends = [[n for n in node.nodes.values() if isinstance(n, cls)] for cls in (nir.Input, nir.Output)]
    if len(ends[0]) != 1 or len(ends[1]) != 1:
        raise NIRError(f"node {name!r}: a subgraph with {len(ends[0])} Input and {len(ends[1])} Output nodes; as a "
                       "node it takes one input and gives one output")
    want, out = _declared(ends[0][0].input_type, "input", name), _declared(ends[1][0].output_type, "output", name)
    if want is None or out is None:
        raise NIRError(f"node {name!r}: a subgraph whose Input or Output node has no shape")
    same = _same_as(name, want, "its Input node takes")

    def rule(s: Shape) -> Shape:
        same(s)
        return out
    return rule


def _rule(node: Any, name: str) -> Rule:
    """How one sample's shape goes through ``node``, after checking the node's own fields."""
    nir = _nir()
    kind = type(node).__name__
    if kind in NEURONS:
        fields = NEURONS[kind].params
        return _elementwise(node, name, fields, "its input (the neurons it has) has shape")
    if isinstance(node, nir.Output):
        declared = _declared(node.output_type, "output", name)
        return (lambda s: s) if declared is None else _same_as(name, declared, "its output_type is")
    if isinstance(node, nir.Input) or kind == "Identity":
        return lambda s: s
    if isinstance(node, (nir.Affine, nir.Linear)):
        return _linear(node, name)
    if isinstance(node, nir.Conv1d):
        return _conv(node, name, 1)
    if isinstance(node, nir.Conv2d):
        return _conv(node, name, 2)
    if isinstance(node, (nir.SumPool2d, nir.AvgPool2d)):
        return _pool(node, name)
    if isinstance(node, nir.Flatten):
        return _flatten(node, name)
    for cls, field in ((nir.Scale, "scale"), (nir.Threshold, "threshold"), (nir.Delay, "delay")):
        if isinstance(node, cls):
            return _elementwise(node, name, (field,), "its input has shape")
    if isinstance(node, nir.NIRGraph):
        return _subgraph(node, name)
    raise NIRError(f"node {name!r} is a {kind}, which from_nir cannot run; it runs {', '.join(sorted(SUPPORTED))}")


def check_graph(graph: Any, prefix: str = "") -> dict[str, Shape]:
    """The shape of one sample out of each node of ``graph`` (not of graphs inside it: each is checked
    when it is built), after every check above; node names in messages get ``prefix``."""
    nir = _nir()
    rules = {n: _rule(node, prefix + n) for n, node in graph.nodes.items()}
    inputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Input)]
    outputs = [n for n, node in graph.nodes.items() if isinstance(node, nir.Output)]
    if not inputs or not outputs:
        raise NIRError(f"the graph {prefix or ''}needs an Input and an Output node (it has "
                       f"{len(inputs)} and {len(outputs)})")
    succ: dict[str, list[str]] = {n: [] for n in graph.nodes}
    for a, b in graph.edges:
        if b in inputs:
            raise NIRError(f"edge ({prefix}{a!r}, {prefix}{b!r}) leads into the Input node {prefix}{b!r}")
        succ[a].append(b)
    into: dict[str, Shape] = {}  # the shape entering each node (the first edge found; the others must agree)
    out: dict[str, Shape] = {}
    for n in inputs:
        shape = _declared(graph.nodes[n].input_type, "input", prefix + n)
        if shape is None:
            raise NIRError(f"node {prefix}{n!r}: an Input node without a shape")
        out[n] = shape
    todo = deque(inputs)
    while todo:
        a = todo.popleft()
        for b in succ[a]:
            if b not in out:
                into[b] = out[a]
                out[b] = rules[b](out[a])
                todo.append(b)
    for n in graph.nodes:
        if n not in out:
            raise NIRError(f"node {prefix}{n!r} is not reached from an Input node")
    for a, b in graph.edges:
        if out[a] != into[b]:
            raise NIRError(f"node {prefix}{b!r}: the edges into it bring shapes {list(into[b])} and {list(out[a])} "
                           f"(from {prefix}{a!r}); edges into one node add up, so their shapes must agree")
    return out
