"""NIR (the Neuromorphic Intermediate Representation) import and export, on top of the package.

:func:`from_nir` turns a NIR graph into an ``nn.Module`` over ``[T, B, ...]``: each NIR neuron
node becomes a :class:`~flexsn_dsl.FlexSN` generated from a spec with the node's equations
(parameters from the node's arrays, one value per neuron where they differ); the other nodes
become torch layers applied to every step at once. :func:`to_nir` goes the other way, and
recognises each neuron module by comparing its spec's equations with NIR's, symbolically.

Needs the ``nir`` package (``pip install flexsn-dsl[nir]``); nothing else in the package imports
this module. Names in a NIR graph are untrusted: they never reach spec text or generated code
(the specs are fixed texts, the values go in as numbers and tensors).
"""
from __future__ import annotations

from .kinds import NEURONS, NIRError, NeuronKind, _nir, neuron_spec
from .match import match_neuron
from .read import NIRNetwork, from_nir
from .write import to_nir

__all__ = ["NEURONS", "NIRError", "NIRNetwork", "NeuronKind", "from_nir", "match_neuron", "neuron_spec", "to_nir", "_nir"]
