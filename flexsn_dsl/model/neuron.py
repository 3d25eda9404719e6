"""Stage 2: the validated model: a NeuronModel and the parameters, states, lines and parts it holds."""
from __future__ import annotations

from dataclasses import dataclass, field

import sympy

from ..errors import SourcePos, SpecWarning
from ..plugins import Surrogate
from ..symbolic import real_symbol
from .numbers import finite


@dataclass(frozen=True)
class Parameter:
    """A parameter; ``shape`` is None for a scalar, else its sizes (numbers or size names),
    and then ``init`` is the initial value of every element (an expression of scalar parameters)."""

    name: str
    value: float
    learnable: bool
    pos: SourcePos
    shape: tuple[int | str, ...] | None = None
    init: sympy.Expr | None = None

    @property
    def shaped(self) -> bool:
        return self.shape is not None

    def initial_value(self, scalars: dict[str, float]) -> float | None:
        """A shaped parameter's initial element value with these scalar parameter values
        (None when it is not a finite real number)."""
        number = self.init.xreplace({real_symbol(n): sympy.Float(v) for n, v in scalars.items()})
        if not number.is_number or not finite(number):
            return None
        return float(number)


@dataclass(frozen=True)
class State:
    name: str
    init: sympy.Expr  # an expression of parameter symbols
    pos: SourcePos


@dataclass(frozen=True)
class Recurrent:
    """``NAME: {from: SOURCE}``: a per-step value ``NAME_t = W · SOURCE_{t-1}`` over the last
    dimension, with a learnable ``NAME_weight`` W [N, N]; ``symbol`` is SOURCE's value after a
    step (its next-state symbol for a state)."""

    name: str
    source: str
    symbol: sympy.Symbol
    pos: SourcePos

    @property
    def weight_name(self) -> str:
        return f"{self.name}_weight"

    @property
    def prev_name(self) -> str:
        """The key of the carried previous value of SOURCE in ``FlexSN.states``."""
        return f"{self.name}_prev"


@dataclass(frozen=True)
class Assignment:
    """One line of ``step``: ``symbol = expr`` (``symbol`` is unique; ``name`` the user's)."""

    name: str
    symbol: sympy.Symbol
    expr: sympy.Expr
    pos: SourcePos


@dataclass(frozen=True)
class Continuous:
    """The continuous-time part of a spec (``equations``), lowered to step lines by
    :mod:`flexsn_dsl.continuous`. Expressions use the symbols of inputs, parameters and
    states (a state symbol in ``threshold`` and ``reset`` means its integrated value)."""

    equations: dict[str, Assignment]   # state -> its derivative (``symbol`` is d<state>__dt)
    method: str                        # one of METHODS (the default already resolved)
    method_pos: SourcePos
    threshold: sympy.Expr | None       # u of s = spike(u); None: no spike output
    threshold_pos: SourcePos | None
    reset: dict[str, Assignment]       # state -> its value where the neuron spiked
    detach_reset: bool
    period: sympy.Expr | None          # refractory period (an expression of parameters); None: none
    period_pos: SourcePos | None
    hold: tuple[str, ...]              # states not integrated while refractory
    condition: sympy.Basic | None = None  # refractory while this holds after a spike (instead of a period)
    condition_pos: SourcePos | None = None
    noise: dict[sympy.Symbol, sympy.Symbol] = field(default_factory=dict)  # white noise -> its randn() draw

    @property
    def refractory(self) -> bool:
        """Whether spikes make the neuron refractory (for a period, or while a condition holds)."""
        return self.period is not None or self.condition is not None

    @property
    def lines(self) -> list[Assignment]:
        """Every expression, as pseudo step lines (for checks of parameter values)."""
        lines = [Assignment(f"the equation of {eq.name!r}", eq.symbol, eq.expr, eq.pos)
                 for eq in self.equations.values()]
        if self.threshold is not None:
            lines.append(Assignment("`threshold`", real_symbol("threshold__"), self.threshold, self.threshold_pos))
        return lines + [Assignment(f"the reset of {r.name!r}", r.symbol, r.expr, r.pos) for r in self.reset.values()]


@dataclass(frozen=True)
class SimulateDefaults:
    """`simulate`: a constant drive per input, the steps and the sizes to simulate with (empty, None:
    not given)."""

    drive: dict[str, float] = field(default_factory=dict)
    steps: int | None = None
    sizes: dict[str, int] = field(default_factory=dict)


@dataclass
class NeuronModel:
    """A validated spec. Expressions use one real sympy symbol per input, parameter,
    previous state and assigned name; a reassigned state ``v`` gets ``v__next``."""

    name: str
    description: str
    file: str
    text: str
    inputs: list[str]
    parameters: dict[str, Parameter]
    states: dict[str, State]
    surrogate: Surrogate
    surrogate_params: dict[str, float]
    steps: list[Assignment]
    outputs: list[tuple[str, sympy.Symbol]]
    next_states: dict[str, sympy.Symbol]
    passes: list[str] = field(default_factory=list)
    positions: dict[str, SourcePos] = field(default_factory=dict)
    continuous: Continuous | None = None  # set for `equations` specs (then ``steps`` is empty)
    warnings: list[SpecWarning] = field(default_factory=list)
    recurrent: dict[str, Recurrent] = field(default_factory=dict)
    draws: tuple[sympy.Symbol, ...] = ()  # every draw of the spec, by occurrence (see symbolic.draw_symbol)
    simulate: SimulateDefaults = field(default_factory=SimulateDefaults)

    @property
    def checked_lines(self) -> list[Assignment]:
        """The expressions :func:`fold_values` checks: the steps, or the continuous-time lines."""
        return self.steps + (self.continuous.lines if self.continuous else [])

    @property
    def learnable(self) -> list[str]:
        return [p.name for p in self.parameters.values() if p.learnable]

    @property
    def shaped(self) -> list[str]:
        return [p.name for p in self.parameters.values() if p.shaped]

    @property
    def size_names(self) -> list[str]:
        """The sizes that ``sizes=`` (``--size``) may give: those named in parameter shapes, and N
        of a recurrent weight [N, N]."""
        names = [d for p in self.parameters.values() if p.shaped for d in p.shape if isinstance(d, str)]
        return list(dict.fromkeys(names + (["N"] if self.recurrent else [])))

    @property
    def runtime_params(self) -> list[str]:
        """Parameters passed to the kernels at run time (learnable or shaped); the other
        (scalar, constant) ones are baked into the generated code."""
        return [p.name for p in self.parameters.values() if p.learnable or p.shaped]

    def symbol(self, name: str) -> sympy.Symbol:
        return real_symbol(name)
