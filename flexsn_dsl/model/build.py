"""Stage 2: a whole spec read into a NeuronModel: the spec-level checks (keys, name, description),
then each section in turn, then its parameter values folded."""
from __future__ import annotations

import warnings
from pathlib import Path

from ..errors import SpecError
from ..expressions import closest
from ..names import generated_names
from ..plugins import Plugins
from ..source import parse_yaml, read_spec
from .context import SpecContext
from .defaults import read_simulate
from .declarations import read_inputs, read_parameters, read_states
from .equations import read_continuous
from .language import CONTINUOUS_KEYS, REQUIRED_KEYS, SHADOWED_MODULES, SPIKE_OUTPUT, TOP_LEVEL_KEYS
from .neuron import Assignment, NeuronModel
from .outputs import read_outputs
from .plugin_choices import read_passes, read_surrogate
from .recurrent import read_recurrent, read_recurrent_names
from .steps import read_steps
from .values import fold_values


class _Builder(SpecContext):
    """Reads a spec's sections in the language's order (the order decides which error a bad spec
    reports first) into a :class:`NeuronModel`."""

    def build(self) -> NeuronModel:
        """The spec-level checks, then every section, then the parameter values folded."""
        top = self.root.value
        for key in top:
            if key not in TOP_LEVEL_KEYS:
                hint = closest(key, TOP_LEVEL_KEYS)
                raise SpecError(f"unknown key {key!r}", self.root.key_pos[key],
                                hint or f"the keys are: {', '.join(TOP_LEVEL_KEYS)}")
        for key in REQUIRED_KEYS:
            if key not in top:
                raise SpecError(f"missing required key {key!r}", self.root.pos,
                                {"neuron": "add `neuron: my_neuron` (an identifier naming the model)",
                                 "states": "add `states:` mapping each state to its initial value, e.g. `v: 0.0`"
                                 }[key])
        self._step_or_equations()
        name_node = top["neuron"]
        self.expect(name_node, "scalar", "`neuron`", "neuron: lif")
        name = self.identifier(name_node.value, name_node.pos, "neuron", allow_keyword=True)
        if name.lower() in SHADOWED_MODULES:
            raise SpecError(f"neuron name {name!r} is the name of a Python module", name_node.pos,
                            f"choose another name, e.g. {name}_neuron: `flexsn-dsl build` writes {name}.py, "
                            f"which would shadow the module {name!r} for code run next to it")
        self.generated = generated_names(name)
        description = self.description()
        inputs = read_inputs(self)
        parameters = read_parameters(self)
        states = read_states(self, parameters)
        recurrent_nodes = read_recurrent_names(self)
        surrogate, surrogate_params = read_surrogate(self)
        continuous = None
        if "equations" in top:
            continuous, next_states, env = read_continuous(self, inputs, parameters, states, list(recurrent_nodes))
            steps: list[Assignment] = []
            default_outputs = [SPIKE_OUTPUT] if continuous.threshold is not None else list(states)
        else:
            steps, next_states, env, default_outputs = read_steps(self, inputs, parameters, states,
                                                                  list(recurrent_nodes))
        outputs = read_outputs(self, env, default_outputs)
        recurrent = read_recurrent(self, recurrent_nodes, steps, continuous, next_states, env, outputs)
        passes = read_passes(self)
        model = NeuronModel(name, description, self.file, self.text, inputs, parameters, states, surrogate,
                            surrogate_params, steps, outputs, next_states, passes,
                            {k: self.key_pos(k) for k in top}, continuous, self.warnings, recurrent,
                            tuple(self.draws))
        model.simulate = read_simulate(self, model)
        fold_values(model, {p.name: p.value for p in parameters.values()},
                    lambda n: f"{n} = {parameters[n].value:g} (line {parameters[n].pos.line})")
        return model

    def _step_or_equations(self) -> None:
        """A spec has `step` (discrete time) or `equations` (continuous time), never both; the
        keys of continuous time need `equations`."""
        top = self.root.value
        if "step" in top and "equations" in top:
            later = max(("step", "equations"), key=lambda k: (self.key_pos(k).line, self.key_pos(k).col))
            raise SpecError("a spec has either `step` (discrete time) or `equations` (continuous time), not both",
                            self.key_pos(later), "keep `equations` with `method`, `threshold` and `reset`, "
                            "or keep the hand-discretised `step` lines, and remove the other")
        if "step" not in top and "equations" not in top:
            raise SpecError("missing required key 'step'", self.root.pos,
                            "add `step:` with the update lines, e.g. `s: spike(v - 1.0)`")
        if "step" in top:
            for key in CONTINUOUS_KEYS:
                if key in top:
                    raise SpecError(f"`{key}` belongs to continuous-time specs (with `equations`), not to `step`",
                                    self.key_pos(key), "write the spike and reset as step lines, or write the "
                                    "neuron with `equations:` instead of `step:`")


def build_model(text: str, file: str, plugins: Plugins) -> NeuronModel:
    """Parse and validate spec text; raise :class:`SpecError` with the source line on bad input."""
    lines = text.splitlines()
    try:
        root = parse_yaml(text, file)
        model = _Builder(root, text, file, plugins).build()
    except SpecError as exc:
        raise exc.with_source(lines) from None
    for warning in model.warnings:
        warnings.warn(warning, stacklevel=3)
    return model


def read_model(path: str | Path, plugins: Plugins) -> NeuronModel:
    """Read (:func:`source.read_spec`) and validate a spec file."""
    return build_model(read_spec(path), str(path), plugins)
