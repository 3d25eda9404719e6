"""Running a neuron on a driving input to see what it does: traces, spike counts, f–I curves, plots.

The top floor beside the runtime (the CLI's ``simulate`` command uses it; nothing below imports it).
Plots need matplotlib (``pip install 'flexsn-dsl[plot]'``).
"""
from __future__ import annotations

import csv
import itertools
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Iterable, Mapping, Sequence, Union

import numpy as np
import torch

from .errors import MissingDependency
from .model import SPIKE_OUTPUT
from .compiler import compile_spec
from .runtime import FlexSN, load
from .symbolic import Spike

Drive = Union[float, np.ndarray, torch.Tensor, Sequence[float]]
DEFAULT_STEPS = 100
MAX_TRACED = 10  # neurons whose traces a plot draws
MAX_SWEEP = 100_000  # constant inputs an f-I curve simulates at once
SEARCH_DOUBLINGS = 12  # spiking_drive tries the drive times 2, 4, ..., 4096


@dataclass(repr=False)
class Simulation:
    """What a neuron did: every input, state and output as a ``[T, N]`` tensor (step t holds the
    state after step t), and the name of the spike output (None when no output is a spike)."""

    neuron: str
    inputs: dict[str, torch.Tensor]
    states: dict[str, torch.Tensor]
    outputs: dict[str, torch.Tensor]
    spike_output: str | None

    @property
    def steps(self) -> int:
        return next(iter(self.inputs.values())).shape[0]

    @property
    def neurons(self) -> int:
        return next(iter(self.inputs.values())).shape[1]

    @property
    def spikes(self) -> torch.Tensor | None:
        """The spike output ``[T, N]``, or None."""
        return self.outputs[self.spike_output] if self.spike_output else None

    @property
    def spike_count(self) -> torch.Tensor | None:
        """Spikes per neuron ``[N]``."""
        return None if self.spikes is None else self.spikes.sum(0)

    @property
    def rate(self) -> torch.Tensor | None:
        """Spikes per step, per neuron ``[N]``."""
        return None if self.spikes is None else self.spikes.sum(0) / max(self.steps, 1)

    def __repr__(self) -> str:
        spikes = "" if self.spike_count is None else f", {self.spike_output}: {int(self.spike_count.sum())} spikes"
        return (f"Simulation({self.neuron!r}, {self.steps} steps x {self.neurons} neurons, inputs {list(self.inputs)}, "
                f"states {list(self.states)}, outputs {list(self.outputs)}{spikes})")

    def columns(self) -> dict[str, torch.Tensor]:
        """Every trace by name: inputs, then states, then outputs that are neither."""
        out = dict(self.inputs)
        out.update(self.states)
        out.update({k: v for k, v in self.outputs.items() if k not in out})
        return out

    def to_csv(self, path: str | os.PathLike) -> None:
        """One row per step and neuron: ``step, neuron`` then every trace."""
        columns = self.columns()
        with open(path, "w", newline="", encoding="utf-8") as f:
            writer = csv.writer(f)
            writer.writerow(["step", "neuron", *columns])
            values = [c.detach().cpu().numpy() for c in columns.values()]
            for t in range(self.steps):
                for n in range(self.neurons):
                    writer.writerow([t, n, *(repr(float(v[t, n])) for v in values)])


def spike_output(module: FlexSN) -> str | None:
    """The first output bound to ``spike(...)`` in the step (for an ``equations`` spec, the spike
    output of its ``threshold``), if any."""
    spec = module.spec
    if spec.continuous is not None:
        spikes = {SPIKE_OUTPUT} if spec.continuous.threshold is not None else set()
    else:
        spikes = {a.symbol.name for a in spec.steps if isinstance(a.expr, Spike)}
    return next((name for name, symbol in spec.outputs if symbol.name in spikes), None)


def neuron_shape(module: FlexSN) -> tuple[int, ...] | None:
    """The shape of one step that the module's shaped parameters fix (a recurrent weight [N, N]
    fixes [N]), or None when any number of neurons fits."""
    weights = {r.weight_name for r in module.spec.recurrent.values()}
    shapes = [tuple(tensor.shape[-1:] if name in weights else tensor.shape)
              for name, tensor in itertools.chain(module.named_parameters(), module.named_buffers())
              if name in weights or (name in module.spec.parameters and module.spec.parameters[name].shaped)]
    return tuple(torch.broadcast_shapes(*shapes)) if shapes else None


def _device(module: FlexSN) -> torch.device:
    """Where the module's parameters and buffers are (the default device when it has none)."""
    tensor = next(itertools.chain(module.parameters(), module.buffers()), None)
    return tensor.device if tensor is not None else torch.get_default_device()


def _drive(value: Drive, name: str, steps: int | None, neurons: int | None, dtype: torch.dtype,
           device: torch.device) -> torch.Tensor:
    """An input as ``[T, N]`` on ``device`` (a number is held constant; ``[T]`` is given to every neuron)."""
    tensor = torch.as_tensor(np.asarray(value, dtype=np.float64) if not isinstance(value, torch.Tensor) else value,
                             dtype=dtype, device=device)
    if tensor.dim() == 0:
        return tensor.expand(steps, neurons or 1).clone()
    if tensor.dim() == 1:
        tensor = tensor[:, None].expand(-1, neurons or 1)
    if tensor.dim() != 2:
        raise ValueError(f"input {name!r} has shape {tuple(tensor.shape)}: give a number, [T] or [T, N]")
    if tensor.shape[0] == 0:
        raise ValueError(f"input {name!r} has no steps: give at least one")
    if steps is not None and tensor.shape[0] != steps:
        raise ValueError(f"input {name!r} has {tensor.shape[0]} steps but steps={steps} was asked for: "
                         "leave steps out, or give an input of that length")
    if neurons is not None and tensor.shape[1] != neurons:
        raise ValueError(f"input {name!r} drives {tensor.shape[1]} neurons but {neurons} are simulated (neurons=, "
                         "or the number the spec's shaped parameters fix)")
    return tensor.clone()


def simulate(spec: str | os.PathLike | FlexSN, input: Drive | Mapping[str, Drive] | None = None,
             steps: int | None = None,
             params: Mapping[str, float] | None = None, neurons: int | None = None, *,
             dtype: torch.dtype = torch.float64, plugins: Iterable[str] = (), passes: Iterable[str] = (),
             sizes: Mapping[str, int] | None = None, seed: int | None = None) -> Simulation:
    """Run a neuron on a driving input and return its traces.

    ``spec`` is a spec file (run on the torch backend in ``dtype``) or a loaded :class:`FlexSN`
    (run as it is, from reset states). ``input`` drives the first input, or is a dict
    ``{input name: drive}`` (inputs left out get 0); a drive is a number (held for ``steps``
    steps), or an array of shape ``[T]`` (every neuron) or ``[T, N]``. Left out, the drive, the
    steps and the sizes are the spec's ``simulate:`` defaults, else 1.0 for the first input and 100 steps.
    ``neurons`` is N (default: the drive's N, else 1). ``params`` overrides parameter values and
    ``sizes`` gives the sizes named in parameter shapes. A spec whose shaped parameters fix the
    shape of a step (``tau`` of shape ``[N]``, a recurrent ``[N, N]`` weight, ``w`` of shape
    ``[C, 1, 1]``) simulates that many neurons, one per element, and its traces are ``[T, N]`` too.
    It runs, and its traces are, on the CPU for a spec file and on the module's device for a module.
    ``seed`` seeds the draws of a spec with ``rand()``, ``randn()`` or ``xi`` (torch's generator of that
    device, restored afterwards); None draws from that generator as it stands.
    """
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < 2 ** 63):
        raise ValueError(f"seed={seed!r}: give a whole number from 0 to 2**63 - 1")
    for what, value in (("steps", steps), ("neurons", neurons)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"{what}={value!r}: give a whole number of at least 1")
    if isinstance(spec, FlexSN):
        if params or sizes:
            raise ValueError("params= and sizes= apply to spec files: load the module with them instead")
        module = spec
        dtype = next((p.dtype for p in module.parameters()), dtype)
    else:
        defaults = compile_spec(spec, plugins=plugins, passes=passes).model.simulate
        with torch.device("cpu"):
            module = load(spec, params=params, sizes={**defaults.sizes, **(sizes or {})}, backend="torch",
                          plugins=plugins, passes=passes)
    layout = neuron_shape(module)
    if layout is not None:
        fixed = math.prod(layout)
        if neurons is not None and neurons != fixed:
            raise ValueError(f"{module.spec.name}'s parameters fix {fixed} neurons (a step of shape {list(layout)}), "
                             f"but neurons={neurons} was asked for: leave neurons out, or change the sizes")
        neurons = fixed
    names = module.spec.inputs
    defaults = module.spec.simulate
    if input is None:
        input = defaults.drive or {names[0]: 1.0}
    if steps is None and all(np.ndim(v) == 0 for v in (input.values() if isinstance(input, Mapping) else [input])):
        steps = defaults.steps or DEFAULT_STEPS
    drives = dict(input) if isinstance(input, Mapping) else {names[0]: input}
    for name in drives:
        if name not in names:
            raise ValueError(f"{module.spec.name} has no input {name!r}; its inputs are {names}")
    device = _device(module)
    given = {name: _drive(value, name, steps, neurons, dtype, device) for name, value in drives.items()}
    shapes = {tuple(t.shape) for t in given.values()}
    if len(shapes) > 1:
        raise ValueError(f"the inputs have different shapes {sorted(shapes)}: give each [T, N] of one shape")
    shape = shapes.pop()
    xs = {name: given.get(name, torch.zeros(shape, dtype=dtype, device=device)) for name in names}
    saved = module.step_mode, module.store_state_seqs
    module.step_mode, module.store_state_seqs = "m", True
    try:
        module.reset()
        with torch.no_grad(), torch.random.fork_rng([device] if device.type == "cuda" else [],
                                                    enabled=seed is not None):
            if seed is not None:
                torch.manual_seed(seed)
            result = module(*(xs[name].reshape(shape[0], *(layout or shape[1:])) for name in names))
        states = {k: v.detach().reshape(shape) for k, v in module.state_seqs.items()}
        module.reset()
    finally:
        module.step_mode, module.store_state_seqs = saved
    results = result if isinstance(result, tuple) else (result,)
    outputs = {name: value.detach().reshape(shape) for (name, _), value in zip(module.spec.outputs, results)}
    return Simulation(module.spec.name, xs, states, outputs, spike_output(module))


def fi_curve(spec: str | os.PathLike | FlexSN, currents: Drive, steps: int | None = None,
             params: Mapping[str, float] | None = None, input_name: str | None = None,
             **kwargs) -> tuple[torch.Tensor, torch.Tensor]:
    """The firing rate (spikes per step over ``steps`` steps, from reset states; default: the spec's
    ``simulate: {steps}``, else 100) for each constant input in ``currents``, all simulated at once as
    one neuron each: ``(currents, rates)``."""
    levels = torch.as_tensor(np.asarray(currents, dtype=np.float64)).reshape(-1)
    if steps is None:
        model = spec.spec if isinstance(spec, FlexSN) else compile_spec(spec, plugins=kwargs.get("plugins", ()),
                                                                        passes=kwargs.get("passes", ())).model
        steps = model.simulate.steps or DEFAULT_STEPS
    drive = levels[None, :].expand(steps, -1)
    sim = simulate(spec, {input_name: drive} if input_name else drive, params=params, **kwargs)
    if sim.rate is None:
        raise ValueError(f"{sim.neuron} has no spike output (no output is bound to spike(...)): no firing rate")
    return levels, sim.rate


def spiking_drive(module: FlexSN, name: str, level: float, steps: int, seed: int | None = None) -> float | None:
    """The first of ``level`` times 2, 4, ..., 2**SEARCH_DOUBLINGS (1 for 0) held on input ``name`` (the
    others 0) for ``steps`` steps from reset states that makes the neuron spike; None when none does,
    or when its shaped parameters fix the number of neurons (no room for one neuron per level)."""
    if neuron_shape(module) is not None or spike_output(module) is None:
        return None
    levels = (level or 1.0) * 2.0 ** np.arange(1, SEARCH_DOUBLINGS + 1)
    _, rates = fi_curve(module, levels, steps=steps, input_name=name, seed=seed)
    spiking = torch.nonzero(rates > 0).reshape(-1)
    return float(levels[int(spiking[0])]) if len(spiking) else None


def parse_sweep(text: str) -> np.ndarray:
    """``LO:HI:K`` -> K evenly spaced values from LO to HI."""
    parts = text.split(":")
    try:
        lo, hi, k = float(parts[0]), float(parts[1]), int(parts[2])
        if len(parts) != 3 or not 1 <= k <= MAX_SWEEP or not (np.isfinite(lo) and np.isfinite(hi)):
            raise ValueError
    except (ValueError, IndexError):
        raise ValueError(f"{text!r} is not LO:HI:K (1 <= K <= {MAX_SWEEP} values from LO to HI, finite), "
                         "e.g. 0:2:9") from None
    return np.linspace(lo, hi, k)


def figure(rows: int):
    """A matplotlib Figure for ``rows`` stacked plots (a MissingDependency without matplotlib)."""
    try:
        from matplotlib.figure import Figure
    except ImportError as exc:
        raise MissingDependency("plots need matplotlib, which is not installed: pip install 'flexsn-dsl[plot]' "
                                "(or pip install matplotlib)") from exc
    return Figure(figsize=(8, 1.0 + 1.6 * rows), layout="constrained")


def plot_simulation(sim: Simulation, path: str | os.PathLike) -> None:
    """A PNG (or any format matplotlib writes, by suffix) with every input, every state's trace
    (the first few neurons) and the spike raster."""
    traces = list(sim.inputs.items()) + list(sim.states.items())
    rows = len(traces) + (sim.spikes is not None)
    fig = figure(rows)
    axes = fig.subplots(rows, 1, sharex=True, squeeze=False)[:, 0]
    steps = np.arange(sim.steps)
    shown = min(sim.neurons, MAX_TRACED)
    for ax, (name, values) in zip(axes, traces):
        kind = "input" if name in sim.inputs else "state"
        ax.plot(steps, values[:, :shown].cpu().numpy(), linewidth=1)
        ax.set_ylabel(f"{name}\n({kind})")
    if sim.spikes is not None:
        ax = axes[-1]
        t, n = np.nonzero(sim.spikes.cpu().numpy() > 0)
        ax.scatter(t, n, marker="|", s=60, color="black")
        ax.set_ylim(-0.5, sim.neurons - 0.5)
        ax.set_ylabel(f"{sim.spike_output}\n(neuron)")
    axes[-1].set_xlabel("step")
    more = f" (first {shown} of {sim.neurons} neurons)" if shown < sim.neurons else ""
    fig.suptitle(f"{sim.neuron}: {sim.steps} steps{more}")
    fig.savefig(Path(path))


def plot_fi(name: str, currents: torch.Tensor, rates: torch.Tensor, path: str | os.PathLike, input_name: str = "x",
            steps: int | None = None) -> None:
    """The f–I curve: firing rate (spikes per step) against the constant input."""
    fig = figure(2)
    ax = fig.subplots()
    ax.plot(currents.cpu().numpy(), rates.cpu().numpy(), marker="o")
    ax.set_xlabel(f"constant input {input_name}")
    ax.set_ylabel("firing rate (spikes / step)")
    ax.set_title(f"{name}: f–I curve" + (f" over {steps} steps" if steps else ""))
    ax.grid(True, alpha=0.3)
    fig.savefig(Path(path))
