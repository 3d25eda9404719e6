"""NIR (the Neuromorphic Intermediate Representation) import and export, on top of the package.

:func:`from_nir` turns a NIR graph into an ``nn.Module`` over ``[T, B, ...]``: each NIR neuron
node becomes a :class:`~flexsn_dsl.FlexSN` generated from a spec with the node's equations
(parameters from the node's arrays, one value per neuron where they differ); the other nodes
become torch layers applied to every step at once. :func:`to_nir` goes the other way, and
recognises each neuron module by comparing its spec's equations with NIR's, symbolically.

Needs the ``nir`` package (``pip install flexsn-dsl[nir]``); only the CLI imports this package
(lazily). NIR files and graphs are untrusted input, like specs: a file is checked before it is
read (:mod:`.files`), every graph's fields and shapes along its edges (:mod:`.check`), every value
per element (:mod:`.read`), and names never reach spec text or generated code (the specs are fixed
texts, the values go in as numbers and tensors).

Modules: :mod:`.kinds` (the NIR neuron kinds and the spec text of each), :mod:`.files` (a NIR
file checked before reading), :mod:`.check` (a graph's fields and shapes), :mod:`.read` (a graph
into modules), :mod:`.match` (a spec's equations against NIR's), :mod:`.write` (a module as a graph).
"""
from __future__ import annotations

from ..errors import NIRError
from .kinds import NEURONS, NeuronKind, _nir, neuron_spec  # noqa: F401 (_nir: the CLI asks it for nir)
from .match import match_neuron
from .read import NIRNetwork, from_nir, read_graph
from .write import to_nir

__all__ = ["NEURONS", "NIRError", "NIRNetwork", "NeuronKind", "from_nir", "match_neuron", "neuron_spec", "read_graph",
           "to_nir"]
