"""The fused Triton kernel of :class:`~flexsn_dsl.plastic.PlasticLinear`: a synapse spec's lines and the
postsynaptic neuron's forward core, printed into one kernel that runs a whole sequence.

A program owns one weight matrix ``g`` (a batch entry's own with ``per_sample=True``; the one shared matrix
with a batch of one) and a block of ``_BP`` postsynaptic neurons, all their synapses: their rows of the
weight, the neurons' states and post traces stay with it for the whole sequence, so programs never wait for
each other. Each presynaptic trace is one number per presynaptic neuron, needed by every block of rows:
each program keeps its own copy (``pre_tr [traces, G, R, n_pre]``, R blocks of rows), so no two programs
write the same address.

The weights move once a step, read and written in chunks of ``_BK`` columns: pass ``t`` of the time loop
applies the updates of step ``t - 1`` (the traces' decay, ``on_pre`` where a presynaptic neuron spiked,
``on_post`` where a postsynaptic one did, each block's lines in order) to a chunk, stores it, and adds the
chunk's part of step ``t``'s current ``W s_pre[t]`` (weights before step ``t``'s updates, as the spec
says). After the last chunk the neuron steps on the current. Pass ``T`` only applies step ``T - 1``'s
updates. Values: ``_DTYPE`` (float64 for float64 weights, float32 otherwise); every spec number goes through
the printer (:mod:`flexsn_dsl.printer`), which types constants in ``_DTYPE`` where Triton would not.
"""
from __future__ import annotations

import hashlib
import sys
from types import ModuleType

import sympy

from .compiler import Compiled, import_source
from .interpreter import use_interpreter_without_gpu
from .literals import identifier
from .printer import TRITON, Printer, float_literal
from .synapse import WEIGHT, SynapseModel
from .symbolic import real_symbol
from .templates import HEAVISIDE

I1, I2, I3 = "    ", "        ", "            "


def unsupported(compiled: Compiled) -> str | None:
    """Why the fused kernel cannot run a postsynaptic neuron of this spec, or None when it can."""
    model = compiled.model
    if len(model.inputs) != 1:
        return f"the fused kernel drives neurons with one input (the current); {model.name!r} has {model.inputs}"
    if model.recurrent:
        return f"the fused kernel does not drive neurons with `recurrent` inputs ({model.name!r} has some)"
    if model.shaped:
        return f"the fused kernel takes scalar neuron parameters; {model.name!r} has shaped ones {list(model.shaped)}"
    if compiled.ir.used_draws:
        return f"the fused kernel does not draw random numbers; {model.name!r} uses rand()/randn()"
    return None


def _view(kind: str, name: str) -> str:
    """The kernel variable of a spec name: ``_pre_<trace>``, ``_post_<trace>``, ``_in_<input>``..."""
    return identifier(f"_{kind}_{name}")


def _number(value: float) -> str:
    """A spec number as a scalar of ``_DTYPE`` (exact in float64, whatever Triton does with a Python float)."""
    return f"tl.full((), {float_literal(value)}, _DTYPE)"


class _Lines:
    """Prints the lines of a synapse spec in the kernel's terms."""

    def __init__(self, model: SynapseModel):
        self.model = model
        self.printer = Printer(TRITON)

    def _print(self, expr: sympy.Expr, names: dict[str, str]) -> str:
        self.printer.names = {real_symbol(n): v for n, v in names.items()}
        if not expr.free_symbols:
            return _number(float(expr))
        return self.printer(expr)

    def post_trace_lines(self, indent: str) -> list[str]:
        """``on_post``'s lines of post traces alone (they read post traces and inputs only), on ``_post_<trace>``."""
        names = {**{n: _view("post", n) for n in self.model.post}, **{n: _view("in", n) for n in self.model.inputs}}
        return [f"{indent}{_view('post', line.target)} = tl.where(_spost, {self._print(line.expr, names)}, "
                f"{_view('post', line.target)})" for line in self.model.on_post if line.target in self.model.post]

    def block(self, block: str, indent: str) -> list[str]:
        """Every line of ``block`` on a chunk, in order: a trace where its neuron spiked (pre traces on
        ``_pre_<trace>``, post traces on their chunk's copies ``_lpost_<trace>``), ``_w`` where a synapse's did."""
        model, out = self.model, []
        mask, where = ("_spre", "_spre[None, :]") if block == "on_pre" else ("_spost", "_spost[:, None]")
        names = {**{n: _view("in", n) for n in model.inputs}, WEIGHT: "_w"}
        traces = {**{n: _view("pre", n) for n in model.pre}, **{n: _view("lpost", n) for n in model.post}}
        for line in getattr(model, block):
            if line.target != WEIGHT:
                target = traces[line.target]
                out.append(f"{indent}{target} = tl.where({mask}, {self._print(line.expr, {**names, **traces})}, "
                           f"{target})")
                continue
            used, views = {s.name for s in line.expr.free_symbols}, {}
            for n, kind, index in [*((n, "col", "[None, :]") for n in model.pre),
                                   *((n, "row", "[:, None]") for n in model.post)]:
                if n in used:  # a pre trace is a column of the chunk, a post trace a row
                    out.append(f"{indent}{_view(kind, n)} = {traces[n]}{index}")
                    views[n] = _view(kind, n)
            out.append(f"{indent}_w = tl.where({where}, {self._print(line.expr, {**names, **views})}, _w)")
        return out


def kernel_name(synapse: str, neuron: str) -> str:
    return identifier(f"{synapse}__{neuron}__plastic_kernel")


def plastic_source(model: SynapseModel, compiled: Compiled) -> str:
    """The module text: the neuron's cores and the fused kernel of ``model`` driving it."""
    cores = compiled.cores
    info = cores.info
    lines = _Lines(model)
    pre, post, inputs = list(model.pre), list(model.post), list(model.inputs)
    states = list(info.state_names)
    n_out, n_extra = len(info.output_names), len(info.fwd_core_returns) - len(info.output_names) - len(states)
    name = kernel_name(identifier(model.name, keyword_ok=True), info.neuron)
    k = [f"@triton.jit",
         f"def {name}(x, out, w, pre_tr, post_tr, states, inputs, scalars, T, G, R, n_pre, n_post,",
         f"{' ' * (len(name) + 5)}_DTYPE: tl.constexpr, _BP: tl.constexpr, _BK: tl.constexpr):",
         f'{I1}"""Synapse {identifier(model.name, keyword_ok=True)} driving neuron {info.neuron} over T steps '
         f'(flexsn_dsl/plastic_kernels.py says how)."""',
         f"{I1}_g = tl.program_id(0)",
         f"{I1}_rows = tl.program_id(1) * _BP + tl.arange(0, _BP)",
         f"{I1}_rmask = _rows < n_post",
         f"{I1}_post = _g * n_post + _rows",
         f"{I1}_own = (_g * R + tl.program_id(1)) * n_pre  # this program's copy of the pre traces",
         f"{I1}_wrows = w + _g * n_post * n_pre + _rows[:, None] * n_pre",
         f"{I1}_cols0 = tl.arange(0, _BK)"]
    k += [f"{I1}_param{j} = tl.load(scalars + {j}).to(_DTYPE)" for j in range(len(info.scalar_params))]
    k += [f"{I1}_state{j} = tl.load(states + {j} * G * n_post + _post, mask=_rmask, other=0).to(_DTYPE)"
          for j in range(len(states))]
    k += [f"{I1}{_view('post', n)} = tl.load(post_tr + {j} * G * n_post + _post, mask=_rmask, other=0).to(_DTYPE)"
          for j, n in enumerate(post)]
    k += [f"{I1}{_view('decay', n)} = {_number(t.decay)}" for n, t in model.traces.items()]
    k += [f"{I1}_spost = _rows < 0  # the postsynaptic spikes of the step before",
          f"{I1}for _t in range(0, T + 1):",
          f"{I2}_prev = _t > 0",
          f"{I2}_now = tl.zeros_like(_rows) + _t < T  # per row, per column: vectors (the interpreter masks with no",
          f"{I2}_now_cols = tl.zeros_like(_cols0) + _t < T  # comparison of a scalar step)"]
    k += [f"{I2}{_view('in', n)} = tl.load(inputs + ({j} * T + _t - 1) * G + _g, mask=_prev, other=0).to(_DTYPE)"
          for j, n in enumerate(inputs)]
    k += [f"{I2}{_view('post', n)} = tl.where(_prev, {_view('post', n)} * {_view('decay', n)}, {_view('post', n)})"
          for n in post]
    k += [f"{I2}_current = tl.zeros([_BP], dtype=_DTYPE)",
          f"{I2}for _k in range(0, n_pre, _BK):",
          f"{I3}_cols = _k + _cols0",
          f"{I3}_cmask = _cols < n_pre",
          f"{I3}_tile = _rmask[:, None] & _cmask[None, :]",
          f"{I3}_w = tl.load(_wrows + _cols[None, :], mask=_tile, other=0).to(_DTYPE)",
          f"{I3}_spre = tl.load(x + ((_t - 1) * G + _g) * n_pre + _cols, mask=_cmask & _prev, other=0) != 0"]
    for j, n in enumerate(pre):
        k += [f"{I3}{_view('pre', n)} = tl.load(pre_tr + {j} * G * R * n_pre + _own + _cols, mask=_cmask, "
              f"other=0).to(_DTYPE)",
              f"{I3}{_view('pre', n)} = tl.where(_prev, {_view('pre', n)} * {_view('decay', n)}, {_view('pre', n)})"]
    k += [f"{I3}{_view('lpost', n)} = {_view('post', n)}" for n in post]
    k += [f"{I3}# on_pre of step t - 1"] + lines.block("on_pre", I3)
    k += [f"{I3}# on_post of step t - 1"] + lines.block("on_post", I3)
    k += [f"{I3}tl.store(pre_tr + {j} * G * R * n_pre + _own + _cols, {_view('pre', n)}, mask=_cmask)"
          for j, n in enumerate(pre)]
    k += [f"{I3}tl.store(_wrows + _cols[None, :], _w, mask=_tile)",
          f"{I3}_xnow = tl.load(x + (_t * G + _g) * n_pre + _cols, mask=_cmask & _now_cols, other=0).to(_DTYPE)",
          f"{I3}_current += tl.sum(_w * _xnow[None, :], axis=1)"]
    k += [f"{I2}# the post traces after on_post of step t - 1"] + lines.post_trace_lines(I2)
    results = [f"_out{j}" for j in range(n_out)] + [f"_next{j}" for j in range(len(states))] + \
        [f"_extra{j}" for j in range(n_extra)]
    args = ["_current"] + [f"_state{j}" for j in range(len(states))] + \
        [f"_param{j}" for j in range(len(info.scalar_params))]
    k += [f"{I2}# step t of the neuron",
          f"{I2}{', '.join(results)} = {identifier(cores.forward_name)}({', '.join(args)})"]
    k += [f"{I2}_state{j} = tl.where(_now, _next{j}, _state{j})" for j in range(len(states))]
    k += [f"{I2}tl.store(out + (_t * G + _g) * n_post + _rows, _out0, mask=_rmask & _now)",
          f"{I2}_spost = (_out0 != 0) & _rmask & _now"]
    k += [f"{I1}tl.store(states + {j} * G * n_post + _post, _state{j}, mask=_rmask)" for j in range(len(states))]
    k += [f"{I1}tl.store(post_tr + {j} * G * n_post + _post, {_view('post', n)}, mask=_rmask)"
          for j, n in enumerate(post)]
    kernel = "\n".join(k) + "\n"
    helpers = "".join(block + "\n\n" for block in lines.printer.helper_blocks() if block not in cores.source)
    header = f"# flexsn-dsl: synapse {identifier(model.name, keyword_ok=True)} driving neuron {info.neuron} (generated)"
    return (f"{header}\n"
            "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n\n"
            f"{HEAVISIDE}\n\n{cores.source}\n\n{helpers}{kernel}")


def plastic_module(model: SynapseModel, compiled: Compiled):
    """The kernel of ``model`` driving neurons of ``compiled``, imported from its text (never from a file)."""
    text = plastic_source(model, compiled)
    name = f"flexsn_dsl_plastic_{hashlib.sha256(text.encode()).hexdigest()[:20]}"
    if name not in sys.modules:
        use_interpreter_without_gpu()
        import_source(name, text, f"<flexsn-dsl plastic {name}>")
    module: ModuleType = sys.modules[name]
    return getattr(module, kernel_name(identifier(model.name, keyword_ok=True), compiled.cores.info.neuron))
