"""Stage 2: YAML nodes -> a validated neuron model whose expressions are sympy.

Every name, expression and key keeps the file, line and column it came from,
and every rule of the language is checked here, so later stages can assume a
well-formed model. :mod:`.build` reads a spec section by section, in the
language's order: :mod:`.declarations` (inputs, parameters, states),
:mod:`.recurrent`, :mod:`.plugin_choices` (surrogate, passes), :mod:`.steps` or
:mod:`.equations` (continuous time), :mod:`.outputs`; each section reads through a
:class:`~.context.SpecContext` (the names declared so far, the shared checks).
:mod:`.neuron` holds the model it makes, :mod:`.values` the checks of parameter
values, :mod:`.language` the keys, reserved names and limits.
"""
from __future__ import annotations

from .build import build_model, read_model
from .language import MAX_REFRACTORY_STEPS, METHODS, MODULE_ATTRIBUTES, REFRACTORY_STATE, RESERVED_NAMES, SPIKE_OUTPUT
from .neuron import Assignment, Continuous, NeuronModel, Parameter, Recurrent, State
from .values import Folded, check_values, fold_values, refractory_steps

__all__ = ["MAX_REFRACTORY_STEPS", "METHODS", "MODULE_ATTRIBUTES", "REFRACTORY_STATE", "RESERVED_NAMES", "SPIKE_OUTPUT", "Assignment",
           "Continuous", "Folded", "NeuronModel", "Parameter", "Recurrent", "State", "build_model", "check_values",
           "fold_values", "read_model", "refractory_steps"]
