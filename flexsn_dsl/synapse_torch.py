"""A synapse spec's ``on_pre`` and ``on_post`` blocks printed as torch functions (through the printer).

Shapes: pre traces ``[B, n_pre]``, post traces ``[B, n_post]``, inputs ``[B]``, the weight ``[n_post, n_pre]``
(shared) or ``[B, n_post, n_pre]`` (per batch entry). A trace line acts where its side's neuron spiked
(``where(mask, new, trace)``); a ``w`` line computes the new weight of every synapse, with pre traces as
columns ``[B, 1, n_pre]`` and post traces as rows ``[B, n_post, 1]``, and hands it to ``_update(w, new, mask)``
with the mask of the synapses that change (pre spikes as columns, post spikes as rows), which keeps the new
values there (per batch entry) or adds their changes up over the batch (shared).
"""
from __future__ import annotations

from .literals import identifier
from .printer import TORCH, Printer
from .symbolic import real_symbol
from .synapse import WEIGHT, SynapseModel

# how each kind of name is indexed, in a trace line and in a w line, by block
_COLUMN, _ROW, _SCALAR2, _SCALAR3 = "[:, None, :]", "[:, :, None]", "[:, None]", "[:, None, None]"


def _view(name: str, kind: str) -> str:
    return identifier(f"_{kind}_{name}")


def block_source(model: SynapseModel, block: str) -> list[str]:
    """The lines of ``def <block>(_mask, _update, w, *traces, *inputs)``, returning ``w, (traces...)``."""
    traces = [*model.pre, *model.post]
    args = ", ".join(identifier(n) for n in [WEIGHT, *traces, *model.inputs])
    side = "pre" if block == "on_pre" else "post"
    mask_w = f"_mask{_COLUMN if side == 'pre' else _ROW}"
    out = [f"def {identifier(block)}(_mask, _update, {args}):",
           f'    """{block} of synapse {identifier(model.name, keyword_ok=True)} (lines in order; _mask: where the {side}synaptic neuron spiked)."""']
    lines = model.on_pre if block == "on_pre" else model.on_post
    for name in model.inputs:  # an input [B] against traces [B, n] and weights [B, n_post, n_pre]
        out += [f"    {_view(name, 't')} = {identifier(name)}{_SCALAR2}",
                f"    {_view(name, 'w')} = {identifier(name)}{_SCALAR3}"]
    for line in lines:
        if line.target == WEIGHT:
            used = {s.name for s in line.expr.free_symbols}
            for name in [*model.pre, *model.post]:
                if name in used:
                    out.append(f"    {_view(name, 'w')} = {identifier(name)}{_COLUMN if name in model.pre else _ROW}")
            names = {real_symbol(n): _view(n, "w") for n in [*traces, *model.inputs]}
            out.append(f"    w = _update(w, {Printer(TORCH, names)(line.expr)}, {mask_w})")
        else:
            names = {real_symbol(n): _view(n, "t") for n in model.inputs}
            target = identifier(line.target)
            out.append(f"    {target} = torch.where(_mask, {_as_tensor(Printer(TORCH, names)(line.expr), target)}, "
                       f"{target})")
    out.append(f"    return w, ({''.join(identifier(n) + ', ' for n in traces)})")
    return out


def _as_tensor(text: str, like: str) -> str:
    """A printed value that may be a plain number, as a tensor of the dtype and device of ``like``."""
    try:
        float(text)
    except ValueError:
        return text
    return f"{like}.new_full((), {text})"


def torch_source(model: SynapseModel) -> str:
    """The module text: ``on_pre`` and ``on_post``."""
    head = [f'"""flexsn-dsl: synapse {identifier(model.name, keyword_ok=True)}, torch functions (generated)."""',
            "import torch", "", ""]
    return "\n".join(head + block_source(model, "on_pre") + ["", ""] + block_source(model, "on_post")) + "\n"
