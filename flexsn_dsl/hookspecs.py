"""Hook specifications: every way a plugin can extend flexsn-dsl.

A plugin is a module (or object) with functions marked ``@flexsn_dsl.hookimpl``
whose names match the hooks below. It is found through the entry-point group
``flexsn_dsl`` of an installed package, or given as a Python file
(``flexsn-dsl ... --plugin FILE``, ``flexsn_dsl.load(..., plugins=[FILE])``,
the ``os.pathsep``-separated environment variable ``FLEXSN_DSL_PLUGINS``).
The built-in surrogates (:mod:`flexsn_dsl.builtin_surrogates`) register
themselves through the same hook a third party uses. ``flexsn-dsl plugins``
lists what is registered and where each item came from.
"""
from __future__ import annotations

import pluggy

PROJECT = "flexsn_dsl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def flexsn_dsl_register_surrogates(registry) -> None:
    """Register surrogate gradients: ``registry.register(name, gradient=..., params={...}, description="")``.

    ``gradient`` is the formula of dS/dx in ``x`` (the argument of ``spike``)
    and the parameter names: a string in sympy syntax (``Abs``, ``Max``,
    ``Min``, ``exp``, ``sqrt``, ``tanh``, ``erf``, ``Heaviside``, ``where``, ...
    are understood; it is parsed with the language's own whitelisted grammar,
    never evaluated) or a sympy expression. ``params`` maps each parameter to
    its default; a spec overrides them (``surrogate: {name: NAME, alpha: 2}``).
    ``description`` says where the surrogate comes from (shown by ``flexsn-dsl plugins``).

    ``register`` raises :class:`flexsn_dsl.PluginError` for a name that is not an
    identifier or is already taken, a gradient that does not parse, uses
    unknown names, cannot be printed for torch or Triton, or is not a finite
    real number near the threshold (x in [-2, 2]) with the default parameters.
    """


@hookspec
def flexsn_dsl_register_passes(registry) -> None:
    """Register code-generation passes:
    ``registry.register(name, stage=..., function=..., order=100, default=False, description="")``.

    Stages, in the order they run for every spec that enables the pass:

    1. ``stage="ir"``: ``function(ir) -> ir`` rewrites the sympy IR of one time
       step (a :class:`flexsn_dsl.ir.StepIR`) before any code is printed, so
       the rewrite reaches both backends (the torch step and the Triton
       kernels) and the derived backward. Return a new IR:
       ``ir.replace_exprs(fn)`` applies ``fn`` to every assigned expression;
       ``dataclasses.replace(ir, surrogate=...)`` changes the surrogate g(x).
       The result is checked: a StepIR with the same name, inputs, states,
       learnable parameters and output names, whose lines assign unreserved
       identifiers and only use inputs, states, learnable parameters and names
       assigned on earlier lines, and that both printers can print.
    2. ``stage="source"``: ``function(source, module_name) -> str`` rewrites the
       text of the generated Triton module (``module_name`` is its name, e.g.
       ``lif_0123abcd...``) before it is written, imported and run. The result
       must be a string that parses as Python and still defines ``INFO`` and
       every kernel. With a source pass the module is regenerated on every
       load (never read back from the cache). ``flexsn-dsl show SPEC --kernel
       module`` and ``flexsn-dsl build`` show the rewritten module.

    Within a stage, passes run in ascending ``order`` (default 100), then by
    name. A pass runs when the spec lists it (``passes: [NAME]``), when the
    build enables it (``flexsn-dsl build|show|check --pass NAME``,
    ``flexsn_dsl.load(..., passes=[NAME])``), or always when registered with
    ``default=True``. A pass that raises or returns something invalid is a
    :class:`flexsn_dsl.PluginError` naming the pass and its plugin (a
    ``default=True`` pass that nobody asked for is skipped with a warning
    instead, so one broken plugin cannot break every build).
    """
