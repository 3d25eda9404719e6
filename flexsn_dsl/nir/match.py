"""Stage 7 (NIR): matching a neuron module's equations to a NIR neuron kind, symbolically: the
spec as continuous-time dynamics (a `step` spec read as an Euler step) compared with each kind's
equations, giving the kind's parameters as expressions of the module's."""
from __future__ import annotations

import itertools
import warnings
from dataclasses import dataclass

import sympy

from ..runtime import FlexSN
from ..symbolic import Detach, Spike, language_text, nonlinear_term, real_symbol
from ..errors import NIRError
from .kinds import NEURONS, NeuronKind


X = sympy.Dummy("x", real=True)  # the input, in the NIR templates and in every spec once renamed


@dataclass
class Match:
    """How one spec compares with one NIR neuron kind: the kind's parameters (expressions of
    the spec's shaped parameters) when it matches, else the differences found."""

    kind: NeuronKind
    values: dict[str, sympy.Expr]
    differences: list[str]


@dataclass
class Dynamics:
    """A neuron's continuous-time form, in the spec's own state names: derivatives, the threshold
    u (spike where u >= 0, on the integrated states), reset values, the output, initial values."""

    derivatives: dict[str, sympy.Expr]
    threshold: sympy.Expr | None
    reset: dict[str, sympy.Expr]
    output: str                     # "s" or a state name
    initial: dict[str, sympy.Expr]


def _template(kind: NeuronKind) -> Dynamics:
    symbols = {p: real_symbol(p) for p in kind.params}
    parse = lambda text: sympy.sympify(text, locals={**symbols, "x": X, "v": real_symbol("v"),  # noqa: E731
                                                      "i_syn": real_symbol("i_syn")})
    return Dynamics({s: parse(rhs) for s, rhs in kind.equations},
                    parse("v - v_threshold") if kind.spiking else None,
                    {"v": symbols["v_reset"]} if kind.spiking else {}, "s" if kind.spiking else "v",
                    {s: parse(init) for s, init in kind.states})


def _linear_parts(expr: sympy.Expr, variables: list[sympy.Symbol]) -> tuple[dict[sympy.Symbol | int, sympy.Expr],
                                                                              sympy.Expr | None]:
    """``expr`` as c0 + sum c_z z over ``variables``: the coefficients (key 1 for c0) and a
    nonlinear term (None when ``expr`` is affine in the variables)."""
    term = nonlinear_term(expr, variables)
    zero = {z: 0 for z in variables}
    coeffs: dict[sympy.Symbol | int, sympy.Expr] = {1: sympy.simplify(expr.subs(zero))}
    for z in variables:
        coeffs[z] = sympy.simplify(sympy.diff(expr, z).subs(zero))
    return coeffs, term


def _same(a: sympy.Expr, b: sympy.Expr) -> bool:
    """Whether two coefficients are equal (numbers to rounding: they come from float parameters)."""
    d = sympy.simplify(a - b)
    if d == 0:
        return True
    return bool(d.is_number) and abs(complex(d)) <= 1e-9 * max(1.0, abs(complex(a)))


def _compare(ours: Dynamics, kind: NeuronKind, back: dict[str, str]) -> Match:
    """Read the kind's parameters off ``ours`` (states already renamed to the kind's; ``back`` maps
    them to the spec's names for messages), and list what differs."""
    ref = _template(kind)
    params = [real_symbol(p) for p in kind.params]
    variables = [real_symbol(s) for s in ref.derivatives] + [X]
    spec_symbols = {real_symbol(a): real_symbol(b) for a, b in back.items()}
    show = lambda e: language_text(e.xreplace(spec_symbols)).replace(str(X), "input")  # noqa: E731
    nir_kind = f"NIR {kind.kind}"
    differences: list[str] = []
    equations, checks = [], []
    for state, rhs in ref.derivatives.items():
        mine, term = _linear_parts(ours.derivatives[state], variables)
        if term is not None:
            differences.append(f"d{back[state]}/dt has the term {show(term)}, which {nir_kind} has not")
            continue
        theirs, _ = _linear_parts(rhs, variables)
        for key in theirs:
            pair = (mine[key], theirs[key], state, key)
            (equations if theirs[key].free_symbols & set(params) else checks).append(pair)
    if (ref.threshold is None) != (ours.threshold is None):
        differences.append(f"it spikes, {nir_kind} does not" if ours.threshold is not None else
                           f"it does not spike, {nir_kind} does")
    if ours.output != ref.output:
        differences.append(f"its output is {back.get(ours.output, ours.output)!r}, {nir_kind}'s is "
                           f"{back.get(ref.output, ref.output)!r}")
    if differences:
        return Match(kind, {}, differences)
    solution = sympy.solve([sympy.Eq(a, b) for a, b, _, _ in equations], params, dict=True) if equations else [{}]
    values = solution[0] if solution else {}
    if not solution:
        differences.append(f"its coefficients admit no parameters of {nir_kind}")
    for a, b, state, key in checks + equations:
        if solution and not _same(a, b.xreplace(values)):
            what = "the constant term" if key == 1 else f"the coefficient of {show(key)}"
            differences.append(f"in d{back[state]}/dt, {what} is {show(a)}, {nir_kind} has {show(b.xreplace(values))}")
    if ref.threshold is not None and not differences:
        v = real_symbol("v")
        mine, term = _linear_parts(ours.threshold, variables)
        if term is not None or any(mine[z] != 0 for z in mine if z not in (1, v)):
            differences.append(f"the threshold {show(ours.threshold)} >= 0 is not {back['v']} >= a constant")
        elif mine[v].is_number and mine[v] <= 0:
            differences.append(f"the threshold {show(ours.threshold)} >= 0 fires below a level, not above")
        else:
            values[real_symbol("v_threshold")] = sympy.simplify(-mine[1] / mine[v])
            reset = dict(ours.reset)
            value = reset.pop("v", None)
            if value is None or value.free_symbols & set(variables):
                shown = f"no reset of {back['v']}" if value is None else f"the reset {back['v']}: {show(value)}"
                differences.append(f"{shown}; {nir_kind} resets {back['v']} to a constant v_reset")
            else:
                values[real_symbol("v_reset")] = value
            for state in reset:
                differences.append(f"it resets {back[state]!r}, which {nir_kind} does not")
    return Match(kind, {str(k): v for k, v in values.items()}, differences)


def _dynamics(m: FlexSN, dt: float | None) -> tuple[Dynamics, str]:
    """:func:`_own_dynamics`, with a recurrent input (``recurrent: {r: {from: s}}``) taken out: NIR
    writes it as a Linear node on an edge from the neuron back to its input, which is only the same
    where the spec adds r to its input."""
    ours, convention = _own_dynamics(m, dt)
    spec = m.spec
    if not spec.recurrent:
        return ours, convention
    rec = list(spec.recurrent.values())
    out_name = spec.outputs[0][0]
    if len(rec) > 1 or rec[0].source != out_name:
        raise NIRError(f"{spec.name}: NIR feeds back a node's output through one edge; this spec's recurrent inputs "
                       f"feed back {[r.source for r in rec]}, its output is {out_name!r}")
    r = real_symbol(rec[0].name)
    show = {X: real_symbol(spec.inputs[0])}

    def added(e: sympy.Expr) -> sympy.Expr:
        without = e.xreplace({r: 0})
        if sympy.simplify(without.xreplace({X: X + r}) - e) != 0:
            raise NIRError(f"{spec.name}: its recurrent input {rec[0].name!r} is not added to its input "
                           f"{spec.inputs[0]!r} in {language_text(e.xreplace(show))}; NIR adds the recurrent edge "
                           "to the neuron's input")
        return without
    return Dynamics({s: added(e) for s, e in ours.derivatives.items()},
                    None if ours.threshold is None else added(ours.threshold),
                    {s: added(e) for s, e in ours.reset.items()}, ours.output, ours.initial), \
        convention + f"; the recurrent input {rec[0].name!r} as a Linear node on an edge back to the neuron"


def check_ports(m: FlexSN, where: str = "") -> None:
    """A NIRError unless the module takes one input and gives one output, as every NIR neuron does."""
    spec, at = m.spec, f"{where}: " if where else ""
    if len(spec.inputs) != 1:
        raise NIRError(f"{at}{spec.name} takes {len(spec.inputs)} inputs {spec.inputs}; NIR neurons take one")
    if len(spec.outputs) != 1:
        raise NIRError(f"{at}{spec.name} gives {len(spec.outputs)} outputs {[n for n, _ in spec.outputs]}; NIR "
                       "neurons give one (give it outputs: [s], or [v] for a neuron without spikes)")


def _own_dynamics(m: FlexSN, dt: float | None) -> tuple[Dynamics, str]:
    """The module's spec as continuous-time dynamics (a `step` spec read as an Euler step of
    length ``dt``); scalar parameters replaced by their values, shaped ones kept as symbols.
    Returns the dynamics and a note on the convention used."""
    spec = m.spec
    c = spec.continuous
    if c is not None and c.refractory:
        raise NIRError(f"{spec.name}: it has a refractory period, which no NIR neuron has")
    check_ports(m)
    scalars = {real_symbol(n): sympy.Float(float(getattr(m, n).detach())) for n in spec.parameters
               if n not in spec.shaped}
    shaped = {real_symbol(n): sympy.Dummy(n, real=True) for n in spec.shaped}  # apart from NIR's names
    rename = {real_symbol(spec.inputs[0]): X, **scalars, **shaped}
    plain = lambda e: sympy.sympify(e).xreplace(rename).replace(Detach, lambda a: a)  # noqa: E731
    initial = {s: plain(st.init) for s, st in spec.states.items()}
    out_name, out_symbol = spec.outputs[0]
    if c is not None:
        output = "s" if c.threshold is not None and out_name == "s" else out_name
        return Dynamics({s: plain(eq.expr) for s, eq in c.equations.items()},
                        None if c.threshold is None else plain(c.threshold),
                        {s: plain(r.expr) for s, r in c.reset.items()}, output, initial), \
            f"equations ({c.method} integration in this module)"
    if dt is None:
        raise NIRError(f"{spec.name} is a discrete-time (`step`) spec: NIR neurons are continuous-time; "
                       "give to_nir(..., dt=...) to export each step as an Euler step of that length")
    # inline the step lines, then read the step as x' = x + dt f(x) where no spike happened
    values: dict[sympy.Symbol, sympy.Expr] = {}
    for line in spec.steps:
        values[line.symbol] = plain(line.expr).xreplace(values)
    spikes = {call for e in values.values() for call in e.atoms(Spike)}
    if len(spikes) > 1:
        raise NIRError(f"{spec.name}: its step spikes on {len(spikes)} conditions; NIR neurons have one threshold")
    spike = next(iter(spikes), None)
    nexts = {s: values.get(sym, real_symbol(s)) for s, sym in spec.next_states.items()}
    quiet = {s: e.xreplace({spike: 0}) if spike is not None else e for s, e in nexts.items()}
    derivatives = {s: sympy.simplify((e - real_symbol(s)) / dt) for s, e in quiet.items()}
    threshold = reset = None
    if spike is not None:
        u = spike.args[0]
        # NIR thresholds the integrated state: write u in the integrated states where it is affine in them
        integrated = {real_symbol(s): e for s, e in quiet.items()}
        old = {X, *(real_symbol(s) for s in spec.states)}
        v = next((sym for sym, e in integrated.items() if sympy.simplify(u - e).free_symbols.isdisjoint(old)), None)
        threshold = sympy.simplify(u - integrated[v] + v) if v is not None else u
        reset = {}
        for s, e in nexts.items():
            shift = sympy.simplify(e.xreplace({spike: 1}) - quiet[s])
            if shift != 0:  # in the integrated state where the reset is a shift of it (v: v - v_th)
                fired = e.xreplace({spike: 1})
                reset[s] = real_symbol(s) + shift if shift.free_symbols.isdisjoint(old) else sympy.simplify(fired)
    output = "s" if spike is not None and out_symbol in values and values[out_symbol] == spike else out_name
    if output != "s" and out_name not in spec.states:
        output = out_name
    return Dynamics(derivatives, threshold, reset or {}, output, initial), \
        f"a discrete step read as an Euler step: x[t+1] = x[t] + dt * f(x[t], input[t]), dt = {dt!r}"


def _check_initial(m: FlexSN, ours: Dynamics, kind: NeuronKind, values: dict[str, sympy.Expr]) -> None:
    """NIR has no initial values; from_nir starts the states as the kinds' specs do. Warn where ours differ."""
    symbols = {real_symbol(k): v for k, v in values.items()}
    for state, init in _template(kind).initial.items():
        if sympy.simplify(ours.initial[state] - init.xreplace(symbols)) != 0:
            warnings.warn(f"{m.spec.name}: state {state!r} starts at {language_text(ours.initial[state])}; NIR "
                          f"graphs carry no initial values and from_nir starts it at {init}", stacklevel=4)


def match_neuron(m: FlexSN, dt: float | None = None) -> tuple[NeuronKind, dict[str, sympy.Expr], str]:
    """The NIR neuron kind whose equations ``m``'s spec has, with the kind's parameters as
    expressions of the spec's shaped parameters; :class:`NIRError` naming the closest kind
    and the term that differs when none matches."""
    ours, convention = _dynamics(m, dt)
    matches: list[Match] = []
    for kind in NEURONS.values():
        ref_states = [s for s, _ in kind.states]
        if len(ref_states) != len(ours.derivatives):
            matches.append(Match(kind, {}, [f"it has {len(ours.derivatives)} state(s) "
                                            f"{sorted(ours.derivatives)}, NIR {kind.kind} has {len(ref_states)}"]))
            continue
        for perm in itertools.permutations(ours.derivatives):
            names = dict(zip(perm, ref_states))
            sub = {real_symbol(a): real_symbol(b) for a, b in names.items()}
            renamed = Dynamics({names[s]: e.xreplace(sub) for s, e in ours.derivatives.items()},
                               None if ours.threshold is None else ours.threshold.xreplace(sub),
                               {names[s]: e.xreplace(sub) for s, e in ours.reset.items()},
                               names.get(ours.output, ours.output),
                               {names[s]: e.xreplace(sub) for s, e in ours.initial.items()})
            match = _compare(renamed, kind, {b: a for a, b in names.items()})
            if not match.differences:
                _check_initial(m, renamed, kind, match.values)
                return kind, match.values, convention
            matches.append(match)
    best = min(matches, key=lambda mt: (mt.differences[0].startswith("it has "), len(mt.differences)))
    raise NIRError(f"{m.spec.name} matches no NIR neuron; the closest is {best.kind.kind}, but "
                   f"{'; '.join(best.differences)}")

