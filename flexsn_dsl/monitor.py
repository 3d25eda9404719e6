"""Looking inside a network of flexsn-dsl neurons: a :class:`Monitor` that records every neuron
layer's outputs and state sequences, and :func:`summary`, a table of the layers.

The top floor beside the simulation (nothing in the package imports it). Plots need matplotlib
(``pip install 'flexsn-dsl[plot]'``).
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Tuple, Union

import numpy as np
import torch
from torch import nn

from .console import table
from .runtime import FlexSN, reset_net
from .simulation import MAX_TRACED, figure, spike_output

Recorded = Union[torch.Tensor, Tuple[torch.Tensor, ...]]


def neuron_layers(net: nn.Module) -> dict[str, FlexSN]:
    """Every FlexSN in ``net`` by the name ``net.named_modules()`` gives it (``""`` for ``net`` itself)."""
    return {name: m for name, m in net.named_modules() if isinstance(m, FlexSN)}


class Monitor:
    """``with Monitor(net) as mon: net(x)`` records, for every FlexSN in ``net`` (keyed by its name in
    ``net.named_modules()``), what it returned (``mon.outputs[name]``: ``[T, ...]``, a tuple for
    several outputs) and each state's sequence (``mon.states[name][state]``: ``[T, ...]``), detached.
    Calls pile up along time: a single-step call (``step_mode="s"``) adds one step, a multi-step
    call its T steps (a module used twice in one forward records both calls, one after the other);
    :meth:`clear` empties the records. Outside the ``with`` block nothing is
    recorded and the modules are exactly as before (hooks removed, ``store_state_seqs`` restored),
    also after an exception. A recurrent layer on the Triton backend records no states (its kernel
    does not store them): load it with ``backend="torch"`` to see them."""

    def __init__(self, net: nn.Module):
        self.net = net
        self._outputs: dict[str, list[list[torch.Tensor]]] = {}
        self._states: dict[str, dict[str, list[torch.Tensor]]] = {}
        self._layers: dict[str, FlexSN] = {}
        self._saved: dict[str, bool] = {}
        self._hooks: list = []

    def __enter__(self) -> Monitor:
        if self._hooks:
            raise RuntimeError("this Monitor is already recording: leave its `with` block first")
        self._layers = neuron_layers(self.net)
        try:
            for name, m in self._layers.items():
                self._saved[name] = m.store_state_seqs
                m.store_state_seqs = True
                self._hooks.append(m.register_forward_hook(self._recorder(name)))
        except BaseException:
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc) -> None:
        for hook in self._hooks:
            hook.remove()
        self._hooks.clear()
        for name, saved in self._saved.items():
            self._layers[name].store_state_seqs = saved
        self._saved.clear()

    def _recorder(self, name: str):
        def record(module: FlexSN, inputs, result) -> None:
            single = module.step_mode == "s"
            steps = lambda t: t.detach()[None] if single else t.detach()  # noqa: E731 (a step gets its time axis)
            results = result if isinstance(result, tuple) else (result,)
            self._outputs.setdefault(name, []).append([steps(r) for r in results])
            seqs = self._states.setdefault(name, {})
            for state, values in module.state_seqs.items():
                seqs.setdefault(state, []).append(steps(values))
        return record

    def __repr__(self) -> str:
        recording = "recording" if self._hooks else "not recording"
        layers = list(self._layers) if self._layers else list(neuron_layers(self.net))
        steps = {name: sum(parts[0].shape[0] for parts in calls) for name, calls in self._outputs.items()}
        return (f"Monitor({type(self.net).__name__}, {recording}, layers={[n or '(net)' for n in layers]}, "
                f"steps={ {n or '(net)': t for n, t in steps.items()} })")

    def clear(self) -> None:
        """Forget what was recorded."""
        self._outputs.clear()
        self._states.clear()

    @property
    def outputs(self) -> dict[str, Recorded]:
        """What each layer returned, all calls joined along time."""
        out = {}
        for name, calls in self._outputs.items():
            joined = tuple(torch.cat(parts) for parts in zip(*calls))
            out[name] = joined[0] if len(joined) == 1 else joined
        return out

    @property
    def states(self) -> dict[str, dict[str, torch.Tensor]]:
        """Each layer's state sequences, all calls joined along time."""
        return {name: {state: torch.cat(parts) for state, parts in seqs.items()} for name, seqs in self._states.items()}

    def spikes(self) -> dict[str, torch.Tensor]:
        """Each layer's spike output ``[T, ...]`` (layers without one are left out)."""
        out = {}
        for name, recorded in self.outputs.items():
            module = self._layers.get(name) or neuron_layers(self.net)[name]
            which = spike_output(module)
            if which is not None:
                index = [n for n, _ in module.spec.outputs].index(which)
                out[name] = recorded[index] if isinstance(recorded, tuple) else recorded
        return out

    def spike_counts(self) -> dict[str, int]:
        """The number of spikes each layer emitted while recorded."""
        return {name: int(s.sum()) for name, s in self.spikes().items()}

    def plot(self, path: str | os.PathLike, neurons: int = MAX_TRACED) -> None:
        """A figure (PNG or any format matplotlib writes, by suffix): per layer, the spike raster (all
        elements of one step, batch included, flattened) and each state's trace for the first
        ``neurons`` elements."""
        rows = []
        for name, s in self.spikes().items():
            rows.append((name, "spikes", s))
        for name, seqs in self.states.items():
            rows += [(name, state, values) for state, values in seqs.items()]
        if not rows:
            raise ValueError("nothing was recorded: call the network inside `with Monitor(net) as mon:` first")
        fig = figure(len(rows))
        axes = fig.subplots(len(rows), 1, squeeze=False)[:, 0]
        for ax, (name, what, values) in zip(axes, rows):
            flat = values.reshape(values.shape[0], -1).float().cpu().numpy()
            label = name or "(net)"
            if what == "spikes":
                t, n = np.nonzero(flat > 0)
                ax.scatter(t, n, marker="|", s=20, color="black")
                ax.set_xlim(-0.5, flat.shape[0] - 0.5)
                ax.set_ylim(-0.5, flat.shape[1] - 0.5)
                ax.set_ylabel(f"{label}\nspikes")
            else:
                ax.plot(flat[:, :neurons], linewidth=1)
                ax.set_ylabel(f"{label}\n{what}")
        axes[-1].set_xlabel("step")
        fig.savefig(Path(path))


def summary(net: nn.Module, sample_input: torch.Tensor | tuple[torch.Tensor, ...]) -> str:
    """A table with one row per neuron layer of ``net``: its name, neuron, backend, neurons per step
    (the elements of one step of its first output, batch included), step shape, states, parameters
    (value, or shape and range) and spike rate on ``sample_input`` (spikes per neuron and step).
    ``net`` runs once on the sample without gradients, from reset states, and is reset again after."""
    inputs = sample_input if isinstance(sample_input, tuple) else (sample_input,)
    reset_net(net)
    try:
        with Monitor(net) as mon, torch.no_grad():
            net(*inputs)
    finally:
        reset_net(net)
    outputs, spikes = mon.outputs, mon.spikes()
    rows = []
    for name, m in neuron_layers(net).items():
        first = outputs.get(name)
        first = first[0] if isinstance(first, tuple) else first
        step = list(first.shape[1:]) if first is not None else []
        rate = f"{float(spikes[name].float().mean()):.4f}" if name in spikes else "-"
        rows.append([name or "(net)", m.spec.name, m.backend, str(int(np.prod(step))) if step else "-", str(step),
                     ", ".join(m.spec.states) or "-",
                     "; ".join(f"{k}={v}" for k, v in m.parameter_texts().items()) or "-", rate])
    return table(rows, ["layer", "neuron", "backend", "neurons/step", "step shape", "states", "parameters",
                        "spike rate"])
