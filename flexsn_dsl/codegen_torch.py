"""Stage 4a: print the step IR as a torch module (the torch backend's step function)."""
from __future__ import annotations

import sympy

from .ir import StepIR
from .literals import identifier
from .model import NeuronModel
from .printer import TORCH, Printer


def _indent(lines: list[str], depth: int = 1) -> str:
    return "\n".join("    " * depth + line for line in lines)


def _surrogate_lines(p: Printer, g: sympy.Expr) -> list[str]:
    """The body of ``Spike.backward`` after ``x`` is read: common subexpressions of the
    surrogate gradient computed once (sigmoid's ``alpha * sg * (1 - sg)`` needs one sigmoid)."""
    if not g.free_symbols:
        return [f"return grad * x.new_full((), {p(g)})"]
    try:
        temps, (reduced,) = sympy.cse([g], symbols=sympy.numbered_symbols("_g", real=True))
        lines = [f"{identifier(sym.name)} = {p(expr)}" for sym, expr in temps]
        return [*lines, f"return grad * ({p(reduced)})"]
    except (ValueError, TypeError):  # something cse produced that the printer cannot print
        return [f"return grad * ({p(g)})"]


def torch_source(model: NeuronModel, ir: StepIR, header: str) -> str:
    """Python source defining ``step(...)`` and ``initial_states(...)`` with torch ops."""
    p = Printer(TORCH)
    # learnable and shaped parameters: runtime values
    inputs, states, params = ([identifier(n) for n in names] for names in (ir.input_names, ir.state_names,
                                                                          ir.param_names + ir.fixed_names))
    output_names = [identifier(n) for n in ir.output_names]
    draws = [identifier(d.name) for d in ir.used_draws]  # this step's draws, given by the caller
    args = ", ".join(inputs + states)
    kwargs = (", *, " + ", ".join(params + draws)) if params or draws else ""
    body = [f"{identifier(sym.name)} = {p(expr)}" for sym, expr in ir.assignments]
    outs = "".join(f"{p(s)}, " for s in ir.outputs)
    nexts = "".join(f"{p(s)}, " for s in ir.next_states)
    if ir.recurrent:  # the values fed back through the recurrent weights
        fed = "".join(f"{p(s)}, " for s in ir.recurrent)
        body.append(f"return ({outs}), ({nexts}), ({fed})")
    else:
        body.append(f"return ({outs}), ({nexts})")
    inits = "".join(f"{p(init)}, " for init in ir.initial_states)
    init_kwargs = ("*, " + ", ".join(params)) if params else ""
    fed_doc = f", (values fed back to {inputs[len(inputs) - len(ir.recurrent):]})" if ir.recurrent else ""
    draw_doc = f" Draws {draws}: this step's random numbers, one per element." if draws else ""
    return f'''{header}
import torch


class Spike(torch.autograd.Function):
    """Heaviside forward (x >= 0); surrogate gradient {identifier(model.surrogate.name)} backward."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
{_indent(_surrogate_lines(p, ir.surrogate), 2)}


_spike = Spike.apply


def step({args}{kwargs}):
    """One time step: returns (outputs {output_names}), (next states {states}){fed_doc}.{draw_doc}"""
{_indent(body)}


def initial_states({init_kwargs}):
    """Initial value of each state {states} (numbers, or tensors where a runtime parameter is used)."""
    return ({inits})
'''


