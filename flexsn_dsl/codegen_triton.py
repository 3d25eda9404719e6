"""Stage 4b: the single-step Triton cores (forward and backward) and the FlexSNInfo.

The forward core is printed from the step IR, the backward core from its symbolic reverse-mode
derivative (:mod:`flexsn_dsl.autodiff`), each in the form :mod:`flexsn_dsl.chain` gives it. The template
engine (:mod:`flexsn_dsl.templates`) expands both into multi-step kernels.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, field

import sympy

from .autodiff import Backward, differentiate, name_spike_arguments, share_reciprocals
from .chain import ShortChain, used
from .ir import StepIR
from .literals import identifier, number
from .names import CORES, core_name
from .printer import TRITON, Printer
from .symbolic import draw_of, real_symbol

MAX_DRAWS = 1 << 16  # draws in one spec (far more than its terms allow)


def draw_parts(name: str) -> tuple[str, int]:
    """(kind, occurrence) of a draw's name (``rand__0``, ``randn__3``, below MAX_DRAWS); a ValueError for any
    other name."""
    parts = draw_of(real_symbol(name)) if len(name) < 16 else None
    if parts is None or parts[1] >= MAX_DRAWS:
        raise ValueError(f"{name!r} is not the name of a draw")
    return parts


@dataclass(frozen=True)
class FlexSNInfo:
    """What the generated kernels take and return (names in the spec's terms).

    ``fwd_core_returns`` lists what the forward core returns: outputs, next
    states, then the extra values saved for the backward. ``fwd_core_recipients``
    names the kernel variable that receives each (``_`` for a duplicate).
    ``fwd_kernel_returns`` lists the sequences the training forward kernel
    writes, and ``c2k_return_mapping`` maps each value the backward core reads
    to where it comes from: ``("input", i)``, ``("output", i)`` or
    ``("saved", i)`` (an index into ``saved_names``). ``initial_values`` holds every
    state's initial value when none depends on a learnable parameter: the kernels
    then start from these constants instead of reading initial states. ``zero_grads``
    names the inputs and learnable parameters whose gradient through the step is identically
    zero (the step does not use them, or only under ``detach`` or in conditions): the runtime
    gives them no gradient from the kernels (None), as the torch backend does.
    ``recurrent`` lists each recurrent input (one of ``input_names``) with where the value fed
    back comes from: ``(name, "output", i)``, ``(name, "state", i)`` or ``(name, "other", -1)``.
    ``draws`` names the draws the step uses (``rand__k``, ``randn__k``: the k-th of the spec's
    ``draw_count``), the forward core's last arguments; the backward core takes those it needs
    (the last of ``bwd_core_args``). The kernels generate them from the call's seed.
    """

    neuron: str
    input_names: tuple[str, ...]
    state_names: tuple[str, ...]
    output_names: tuple[str, ...]
    param_names: tuple[str, ...]                 # learnable parameters (gradients), in core argument order
    constants: dict[str, float]                  # parameters baked into the code
    fwd_core_returns: tuple[str, ...]
    fwd_core_recipients: tuple[str, ...]
    fwd_kernel_returns: tuple[str, ...]
    saved_names: tuple[str, ...]                 # extra per-step tensors the training forward stores
    c2k_return_mapping: tuple[tuple[str, int], ...]
    bwd_core_args: tuple[str, ...]
    bwd_core_returns: tuple[str, ...]
    output_vars: tuple[str, ...] = field(default=())  # kernel variable holding each output
    initial_values: tuple[float, ...] = ()            # constant initial states, or () when not all are
    zero_grads: tuple[str, ...] = ()                  # inputs and learnable parameters with no gradient
    fixed_names: tuple[str, ...] = ()    # non-learnable runtime parameters (shaped), core arguments after param_names
    shaped_names: tuple[str, ...] = ()   # the runtime parameters with a shape, each read per element from its tensor
    recurrent: tuple[tuple[str, str, int], ...] = ()
    draws: tuple[str, ...] = ()
    draw_count: int = 0

    @property
    def num_inputs(self) -> int:
        return len(self.input_names)

    @property
    def num_states(self) -> int:
        return len(self.state_names)

    @property
    def num_outputs(self) -> int:
        return len(self.output_names)

    @property
    def scalar_params(self) -> tuple[str, ...]:
        """The learnable scalar parameters, packed in one vector ``_params`` in this order."""
        return tuple(n for n in self.param_names if n not in self.shaped_names)

    @property
    def learnable_shaped(self) -> tuple[str, ...]:
        """The learnable parameters with a shape: their gradients make the backward kernel tiled."""
        return tuple(n for n in self.param_names if n in self.shaped_names)

    @property
    def num_params(self) -> int:
        """How many learnable scalar parameters ``_params`` holds."""
        return len(self.scalar_params)

    def __post_init__(self) -> None:
        """Every name is a checked identifier and every number finite: templates print them as they are."""
        identifier(self.neuron, keyword_ok=True)
        for names in (self.input_names, self.state_names, self.output_names, self.param_names, self.constants,
                      self.fwd_core_returns, self.fwd_core_recipients, self.fwd_kernel_returns, self.saved_names,
                      self.bwd_core_args, self.bwd_core_returns, self.output_vars, self.zero_grads,
                      self.fixed_names, self.shaped_names, self.draws):
            for name in names:
                identifier(name)
        for kind, index in self.c2k_return_mapping:
            if kind not in ("input", "output", "saved") or isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"bad c2k_return_mapping entry {(kind, index)!r}")
        for name, kind, index in self.recurrent:
            identifier(name)
            if kind not in ("output", "state", "other") or isinstance(index, bool) or not isinstance(index, int):
                raise ValueError(f"bad recurrent entry {(name, kind, index)!r}")
        for v in (*self.constants.values(), *self.initial_values):
            number(v)
        if isinstance(self.draw_count, bool) or not isinstance(self.draw_count, int) or \
                not 0 <= self.draw_count <= MAX_DRAWS or any(draw_parts(d)[1] >= self.draw_count for d in self.draws):
            raise ValueError(f"bad draws {self.draws!r} of {self.draw_count!r}")

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True)
class Cores:
    forward_name: str
    backward_name: str
    source: str
    info: FlexSNInfo


def _assignments(printer: Printer, lines) -> list[str]:
    return [f"    {identifier(sym.name)} = {printer(expr)}" for sym, expr in lines]


def _per_element(roots: set[sympy.Symbol], lines) -> set[sympy.Symbol]:
    """``roots`` (the values read per element: inputs, states, draws, shaped parameters) and every
    symbol of ``lines`` assigned from one of them; the others are scalars (numbers and scalar parameters)."""
    found = set(roots)
    for sym, expr in lines:
        if expr.free_symbols & found:
            found.add(sym)
    return found


def _tensor(printer: Printer, expr: sympy.Expr, like: str, per_element: set[sympy.Symbol]) -> str:
    """Print ``expr``; one that reads no per-element value becomes a tensor shaped like ``like``
    (loop-carried values must be: ``v = 2 * a`` with ``a`` a scalar parameter is a block, not a scalar)."""
    if expr.free_symbols & per_element:
        return printer(expr)
    return f"tl.zeros_like({like}) + {printer(expr)}"


def _recurrent_entry(ir: StepIR, name: str, source: sympy.Symbol) -> tuple[str, str, int]:
    """Where the value a recurrent input feeds back lives in the kernels: an output or a state."""
    if source in ir.outputs and source not in ir.inputs:
        return name, "output", ir.outputs.index(source)
    if source in ir.next_states:
        return name, "state", ir.next_states.index(source)
    return name, "other", -1


def build_cores(ir: StepIR) -> Cores:
    """The forward and backward cores of ``ir`` and their FlexSNInfo."""
    ir = name_spike_arguments(ir)
    backward: Backward = share_reciprocals(differentiate(ir))
    p = Printer(TRITON)
    name = identifier(ir.name, keyword_ok=True)  # only a prefix: `class_forward_core` is fine
    forward_name, backward_name = (identifier(core_name(name, d)) for d in CORES)
    inputs, states, params = ([identifier(n) for n in names] for names in (ir.input_names, ir.state_names,
                                                                          ir.param_names + ir.fixed_names))
    learnable = params[:len(ir.params)]  # runtime parameters: the learnable ones, then the fixed ones

    # Where each value the backward reads comes from.
    mapping, extras = [], []
    for sym in backward.saved:
        if sym in ir.inputs:
            mapping.append(("input", ir.inputs.index(sym)))
        elif sym in ir.outputs:
            mapping.append(("output", ir.outputs.index(sym)))
        else:
            mapping.append(("saved", len(extras)))
            extras.append(sym)

    # Kernel variables receiving the forward core's results.
    output_vars, recipients = [], []
    by_symbol = {s: n for s, n in zip(ir.inputs, inputs)}
    for sym, out_name in zip(ir.outputs, ir.output_names):
        if sym in ir.next_states:
            output_vars.append(states[ir.next_states.index(sym)])
            recipients.append("_")
        elif sym in by_symbol:
            output_vars.append(by_symbol[sym])
            recipients.append("_")
        else:
            output_vars.append(out_name)
            recipients.append(out_name)
    recipients += states + [f"{s.name}__saved_t" for s in extras]
    core_returns = [p(s) for s in ir.outputs] + [p(s) for s in ir.next_states] + [p(s) for s in extras]

    draws = [identifier(d.name) for d in ir.used_draws]
    fwd_args = ", ".join(inputs + states + params + draws)
    first_tensor = (inputs + states)[0]
    output_names = tuple(identifier(n) for n in ir.output_names)
    fwd = [f"@triton.jit", f"def {forward_name}({fwd_args}):",
           f'    """One step of {name}: returns outputs {inputs and output_names}, next states, saved values."""']
    returned = list(ir.outputs) + list(ir.next_states) + extras
    fwd += _assignments(p, used(ShortChain(ir.states).lines(ir.assignments), returned))
    folded = {s: e for s, e in ir.assignments if e.is_number}
    shaped = {sym for sym in ir.params + ir.fixed if sym.name in ir.shaped}
    per_element = _per_element(set(ir.inputs + ir.states + ir.draws) | shaped, ir.assignments)
    fwd.append("    return " + ", ".join(_tensor(p, folded.get(s, s), first_tensor, per_element)
                                       for s in list(ir.outputs) + list(ir.next_states) + extras))

    reverse = ShortChain(backward.seeds[len(ir.outputs):])  # the state gradients carry the backward's chain
    recompute, adjoints = reverse.lines(backward.recompute), reverse.lines(backward.adjoints)
    results = [reverse.expr(r) for r in backward.results]
    kept = {sym for sym, _ in used(recompute + adjoints, set().union(*(r.free_symbols for r in results)))}
    recompute, adjoints = ([(sym, e) for sym, e in lines if sym in kept] for lines in (recompute, adjoints))
    read = set().union(*(e.free_symbols for _, e in recompute + adjoints), *(r.free_symbols for r in results))
    bwd_args = [s.name for s in backward.saved] + [s.name for s in backward.seeds] + params + \
        [d.name for d in ir.used_draws if d in read]
    bwd_returns = [f"grad__{n}" for n in inputs + states + learnable]
    seed_ref = backward.seeds[0].name
    bwd = [f"@triton.jit", f"def {backward_name}({', '.join(identifier(a) for a in bwd_args)}):",
           f'    """Reverse of one step: gradients of inputs, previous states and learnable parameters."""']
    if recompute:
        bwd.append("    # recompute the forward values the gradients need")
        bwd += _assignments(p, recompute)
    if adjoints:
        bwd.append("    # adjoints, last assignment first")
        bwd += _assignments(p, adjoints)
    per_element = _per_element(set(backward.saved + backward.seeds + ir.draws) | shaped, recompute + adjoints)
    bwd.append("    return " + ", ".join(_tensor(p, r, seed_ref, per_element) for r in results))

    info = FlexSNInfo(
        neuron=name,
        input_names=tuple(inputs),
        state_names=tuple(states),
        output_names=output_names,
        param_names=tuple(learnable),
        constants=dict(ir.constants),
        fwd_core_returns=tuple(core_returns),
        fwd_core_recipients=tuple(recipients),
        fwd_kernel_returns=tuple(ir.output_names) + tuple(f"{s.name}__saved" for s in extras),
        saved_names=tuple(s.name for s in extras),
        c2k_return_mapping=tuple(mapping),
        bwd_core_args=tuple(bwd_args),
        bwd_core_returns=tuple(bwd_returns),
        output_vars=tuple(output_vars),
        initial_values=tuple(float(v) for v in ir.initial_states) if all(
            v.is_number for v in ir.initial_states) else (),
        zero_grads=tuple(sym.name for sym, grad in zip(ir.inputs + ir.params, backward.results[:len(inputs)] +
                                                        backward.results[len(inputs) + len(states):]) if grad == 0),
        fixed_names=ir.fixed_names,
        shaped_names=ir.shaped,
        recurrent=tuple(_recurrent_entry(ir, inputs[len(inputs) - len(ir.recurrent) + k], sym)
                        for k, sym in enumerate(ir.recurrent)),
        draws=tuple(draws),
        draw_count=len(ir.draws),
    )
    source = p.helper_source() + "\n".join(fwd) + "\n\n\n" + "\n".join(bwd) + "\n"
    return Cores(forward_name, backward_name, source, info)
