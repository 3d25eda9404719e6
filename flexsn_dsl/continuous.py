"""Stage 2b: a continuous-time model (``equations``) lowered to the lines of one discrete step.

The lines are those a user would write by hand in ``step``, so the step IR, the torch step,
the Triton kernels and their derived backward are the same as for a v1 spec. One step of
length dt, in the order of the language (v2, section 1):

1. integrate every state of ``equations`` by ``method`` (inputs held over the step; constant
   scalar parameters folded to numbers, learnable or shaped ones kept as symbols, so an exact
   propagator such as e^{-dt/tau} has one value per element of a shaped tau and a gradient
   for a learnable one); white noise (``xi``: equations ``f + g xi``, g free of the states) by
   Euler-Maruyama, ``x + dt f + sqrt(dt) g n`` with ``n`` the noise's ``randn()`` draw; a refractory neuron keeps
   the held states instead: ``v__int = where(refractory > 0.5, v, <integrated>)``;
2. ``s = spike(u)`` of the threshold on the integrated states (0 while refractory);
3. each reset line ``x: e`` as ``x__next = s * e + (1 - s) * x__int`` on the integrated values;
4. ``refractory__next``: the steps left, n - 1 after a spike (n = round(period / dt)), counted
   down by one per step, without gradient. With a refractory ``condition`` instead (Brian2's
   order), ``refractory`` is a flag: first ``refractory__start = where(condition, refractory, 0)``
   on the states at the start of the step (it ends once the condition fails), which gates steps
   1–2, and ``refractory__next = 1`` where the neuron spiked, else ``refractory__start``.

A state's integrated value is named ``x__int`` when a reset follows, else it is ``x__next``.
"""
from __future__ import annotations

import warnings

import sympy

from .errors import SpecError
from .integrators import METHODS
from .model import MAX_REFRACTORY_STEPS, REFRACTORY_STATE, SPIKE_OUTPUT, Assignment, NeuronModel, refractory_steps
from .propagators import PropagatorError, exact_step
from .symbolic import Detach, Spike, real_symbol

REFRACTORY_TEST = 0.5  # the counter is a whole number: refractory while it is > 0.5


def discrete_steps(model: NeuronModel, values: dict[str, float]) -> list[Assignment]:
    """The step lines of ``model`` with these parameter values: a v1 spec's own, or those
    derived from a continuous-time spec's equations."""
    if model.continuous is None:
        return model.steps
    try:
        return _lower(model, values)
    except SpecError as exc:
        raise exc.with_source(model.text.splitlines()) from None


def _lower(model: NeuronModel, values: dict[str, float]) -> list[Assignment]:
    c = model.continuous
    runtime = set(model.runtime_params)  # learnable or shaped: symbols, read by the kernels at run time
    constants = {real_symbol(n): sympy.Float(values[n]) for n in model.parameters if n not in runtime}
    dt = sympy.Float(values["dt"])
    f = {real_symbol(n): sympy.sympify(eq.expr).xreplace(constants) for n, eq in c.equations.items()}
    silent = {xi: 0 for xi in c.noise}
    noise = {x: sum((sympy.diff(fx, xi) * n for xi, n in c.noise.items()), sympy.S.Zero) for x, fx in f.items()}
    f = {x: fx.xreplace(silent) for x, fx in f.items()}  # the equations without their noise terms
    where = {real_symbol(n): eq.pos for n, eq in c.equations.items()}
    steps: list[Assignment] = []

    def emit(symbol: sympy.Symbol, expr: sympy.Expr, pos) -> None:
        steps.append(Assignment(symbol.name, symbol, expr, pos))

    states = list(f)
    if c.method == "exact":
        try:
            lines, values = exact_step(list(f.values()), states, float(dt))
        except PropagatorError as exc:
            raise SpecError(f"cannot derive the exact propagator: {exc}", c.method_pos, exc.hint) from None
        for symbol, expr in lines:
            emit(symbol, expr, c.method_pos)
        integrated = dict(zip(states, values))
    else:
        lines, integrated = METHODS[c.method](f, dt)
        for symbol, expr in lines:
            emit(symbol, expr, where[real_symbol(symbol.name.split("__")[0])])
    integrated = {x: e + sympy.sqrt(dt) * noise[x] for x, e in integrated.items()}  # (euler: the model checked)

    refractory = real_symbol(REFRACTORY_STATE) if c.refractory else None
    if c.condition is not None:  # refractory only while it was and the condition still holds (at the step's start)
        still = real_symbol(f"{REFRACTORY_STATE}__start")
        emit(still, sympy.Piecewise((refractory, sympy.sympify(c.condition).xreplace(constants)), (0, True)),
             c.condition_pos)
        refractory = still
    resting = refractory > REFRACTORY_TEST if refractory is not None else None
    value: dict[sympy.Symbol, sympy.Expr] = {}  # state -> its integrated value
    for x in states:
        value[x] = real_symbol(f"{x.name}__int" if x.name in c.reset else f"{x.name}__next")
        expr = integrated[x]
        if resting is not None and x.name in c.hold:
            expr = sympy.Piecewise((x, resting), (expr, True))
        emit(value[x], expr, where[x])
    if c.threshold is None:
        return steps

    s = real_symbol(SPIKE_OUTPUT)
    u = sympy.sympify(c.threshold).xreplace(constants).xreplace(value)
    emit(s, Spike(u) if resting is None else sympy.Piecewise((0, resting), (Spike(u), True)), c.threshold_pos)
    gate = Detach(s) if c.detach_reset else s
    for name, line in c.reset.items():
        x = real_symbol(name)
        e = sympy.sympify(line.expr).xreplace(constants).xreplace(value)
        emit(real_symbol(f"{name}__next"), gate * e + (1 - gate) * value.get(x, x), line.pos)
    if c.condition is not None:  # a spike makes it refractory; otherwise as at the start of the step
        emit(real_symbol(f"{REFRACTORY_STATE}__next"), sympy.Piecewise((1, Detach(s) > REFRACTORY_TEST),
                                                                        (refractory, True)), c.condition_pos)
    elif refractory is not None:
        period = sympy.sympify(c.period).xreplace(constants)
        if period.is_number:
            n, warning = refractory_steps(float(period), float(dt), c.period_pos)
            if warning is not None and warning.message not in {w.message for w in model.warnings}:
                warnings.warn(warning, stacklevel=2)  # with params= values; the spec's own are warned at load
            left = max(n - 1, 0)
        else:  # a random period (draws): round(period / dt) steps, drawn at each step, used where it spikes
            n = sympy.floor(period / dt + sympy.Rational(1, 2))
            left = sympy.Piecewise((0, n < 1), (MAX_REFRACTORY_STEPS - 1, n > MAX_REFRACTORY_STEPS), (n - 1, True))
        emit(real_symbol(f"{REFRACTORY_STATE}__next"),
             sympy.Piecewise((refractory - 1, resting), (left * Detach(s), True)), c.period_pos)
    return steps
