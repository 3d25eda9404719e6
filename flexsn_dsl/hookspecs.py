"""Hook specifications: every way a plugin can extend flexsn-dsl.

A plugin is a module (or object) with functions marked ``@flexsn_dsl.hookimpl``
whose names match the hooks below. The built-in surrogates
(:mod:`flexsn_dsl.builtin_surrogates`) register themselves through the same hook
a third party uses.
"""
from __future__ import annotations

import pluggy

PROJECT = "flexsn_dsl"
hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)


@hookspec
def flexsn_dsl_register_surrogates(registry) -> None:
    """Register surrogate gradients: ``registry.register(name, gradient=..., params={...})``.

    ``gradient`` is a formula in ``x`` (the argument of ``spike``) and the
    parameter names: a string in sympy syntax (``Abs``, ``Max``, ``Min``,
    ``exp``, ``Heaviside``, ``where``, ... are understood; it is parsed with the
    language's own whitelisted grammar, never evaluated) or a sympy expression.
    """


@hookspec
def flexsn_dsl_register_passes(registry) -> None:
    """Register code-generation passes: ``registry.register(name, stage=..., function=...)``.

    Stages run in this order for every spec that enables the pass:

    1. ``stage="ir"``: ``function(ir) -> ir`` rewrites the sympy IR of the step
       (a :class:`flexsn_dsl.ir.StepIR`) before any code is printed; return a
       new IR (``ir.replace_exprs(fn)`` helps).
    2. ``stage="source"``: ``function(source, kernel_module) -> str`` rewrites
       the generated Triton module source text (``kernel_module`` is the
       module name) before it is written and imported.

    Within a stage, passes run in ascending ``order`` (default 100), then by name.
    A pass runs when the spec lists it under ``passes:`` or the build enables it
    (``flexsn-dsl build --pass NAME``, ``flexsn_dsl.load(..., passes=[...])``),
    or always when registered with ``default=True``.
    """
