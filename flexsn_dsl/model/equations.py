"""Stage 2: the continuous-time sections: `equations`, `method`, `threshold`, `reset`, `detach_reset`
and `refractory`."""
from __future__ import annotations

import sympy

from ..errors import SourcePos, SpecError, SpecWarning
from ..expressions import closest
from ..source import Node
from ..symbolic import Detach, Spike, draw_symbol, language_text, nonlinear_term, real_symbol
from .context import SpecContext
from .language import DT_HINT, METHODS, REFRACTORY_STATE, SPIKE_OUTPUT
from .neuron import Assignment, Continuous
from .numbers import finite
from .values import dt_problem, period_problem, refractory_steps


def read_continuous(spec: SpecContext, inputs, parameters, states, recurrent=()):
    """`equations` with `method`, `threshold`, `reset`, `detach_reset` and `refractory`."""
    top = spec.root.value
    node = top["equations"]
    spec.expect(node, "mapping", "`equations`", "equations: {v: (x - v) / tau}")
    if not node.value:
        raise SpecError("`equations` is empty", node.pos, "give the time derivative of a state, e.g. v: (x - v) / tau")
    dt = parameters.get("dt")
    if dt is None:
        raise SpecError("`equations` need the length of one step: a parameter `dt`", spec.key_pos("equations"),
                        "add `dt: 0.5` under `parameters:` (in the unit of the time constants)")
    if dt.shaped:
        raise SpecError("`dt` cannot have a shape: it is the length of one step, the same for every neuron "
                        "(the kernels advance all neurons together)", dt.pos,
                        "write dt: 0.5 (a number); give per-neuron time constants a shape instead")
    if dt.learnable:
        raise SpecError(f"`dt` must be a positive constant, not {dt.value:g}, learnable", dt.pos, DT_HINT)
    if dt_problem(dt.value) is not None:
        raise SpecError(dt_problem(dt.value), dt.pos, DT_HINT)
    user_states = [n for n in states if n != REFRACTORY_STATE]
    env = {n: real_symbol(n) for n in [*inputs, *recurrent, *parameters, *user_states]}
    equations: dict[str, Assignment] = {}
    noise: dict[sympy.Symbol, sympy.Symbol] = {}  # white noise (xi, xi_a) -> its standard normal draw per step
    for name, value in node.value.items():
        pos = node.key_pos[name]
        if name not in user_states:
            kind = spec.declared.get(name, (None,))[0]
            what = f"the {kind} {name!r}" if kind else f"{name!r}, which is not declared"
            hint = closest(name, user_states) or f"declare it under `states:` (e.g. {name}: 0.0), or give the " \
                f"derivative of one of the states: {', '.join(user_states)}"
            raise SpecError(f"`equations` gives the time derivative of {what}; only states have one", pos, hint)
        expr = spec.expression(value, env, f"the equation of {name!r}", noise=True)
        _no_spike(expr, value, f"the equation of {name!r}")
        for xi in sorted(expr.free_symbols - set(env.values()), key=lambda s: s.name):
            if xi.name.endswith("__white"):
                _additive(expr, xi, [real_symbol(n) for n in user_states], name, value)
                if xi not in noise:  # (one draw per noise name, in every equation it is in)
                    noise[xi] = _noise_draw(spec)
        equations[name] = Assignment(name, real_symbol(f"d{name}__dt"), expr, value.pos)
    method, method_pos = _method(spec, equations, noise)
    threshold, threshold_pos = None, None
    if "threshold" in top:
        threshold, threshold_pos = _threshold(spec, top["threshold"], env, [*inputs, *recurrent, *user_states])
    reset = _reset(spec, env, user_states, threshold is not None)
    detach_reset = False
    if "detach_reset" in top:
        flag = top["detach_reset"]
        if not isinstance(flag.value, bool):
            raise SpecError(f"`detach_reset` must be true or false, not {flag.value!r}", flag.pos,
                            "write detach_reset: true")
        detach_reset = flag.value
    (period, period_pos), (condition, condition_pos), hold = _refractory(spec, parameters, env, user_states, reset,
                                                                         threshold is not None)
    changed = [*equations, *reset] + ([REFRACTORY_STATE] if REFRACTORY_STATE in states else [])
    next_states = {n: real_symbol(f"{n}__next") if n in changed else real_symbol(n) for n in states}
    out_env = {**{n: real_symbol(n) for n in inputs}, **next_states}
    if threshold is not None:
        out_env[SPIKE_OUTPUT] = real_symbol(SPIKE_OUTPUT)
    part = Continuous(equations, method, method_pos, threshold, threshold_pos, reset, detach_reset,
                      period, period_pos, hold, condition, condition_pos, noise)
    return part, next_states, out_env


def _no_spike(expr: sympy.Expr, node: Node, what: str) -> None:
    if expr.has(Spike, Detach):
        raise SpecError(f"{what} may not use spike() or detach()", node.pos,
                        "spikes come from `threshold`; `detach_reset: true` detaches the reset")


def _noise_draw(spec: SpecContext) -> sympy.Symbol:
    """The standard normal draw of a white-noise process: one of the spec's draws."""
    symbol = draw_symbol("randn", len(spec.draws))
    spec.draws.append(symbol)
    return symbol


def _additive(expr: sympy.Expr, xi: sympy.Symbol, states: list[sympy.Symbol], name: str, node: Node) -> None:
    """Refuse noise whose coefficient depends on a state, or that is not linear (multiplicative noise)."""
    noise = xi.name.removesuffix("__white")
    for term in sympy.Add.make_args(sympy.expand(expr, deep=False, mul=True, multinomial=False, power_exp=False,
                                                 power_base=False, log=False)):
        if not term.has(xi):
            continue
        coefficient = sympy.diff(term, xi)
        if coefficient.has(xi) or coefficient.free_symbols & set(states):
            shown = language_text(term.xreplace({xi: real_symbol(noise)}))
            raise SpecError(f"the equation of {name!r} has multiplicative noise: the term {shown} (its "
                            f"coefficient of {noise} must not depend on the states or on {noise})", node.pos,
                            f"write additive noise, `... + sigma * {noise}` with sigma a parameter or a number")


def _method(spec: SpecContext, equations: dict[str, Assignment], noise) -> tuple[str, SourcePos]:
    top = spec.root.value
    states = [real_symbol(n) for n in equations]
    nonlinear = next(((name, term) for name, eq in equations.items()
                      if (term := nonlinear_term(eq.expr, states)) is not None), None)
    if noise and "method" in top and top["method"].value != "euler":
        node = top["method"]
        shown = node.value if node.kind == "scalar" else node.kind
        raise SpecError(f"`method: {shown}` cannot integrate white noise ({', '.join(sorted(x.name.removesuffix('__white') for x in noise))}): "
                        "stochastic equations are integrated by Euler-Maruyama", node.pos, "write method: euler")
    if "method" not in top:
        pos = spec.key_pos("equations")
        if nonlinear is None:
            return "euler" if noise else "exact", pos
        name, term = nonlinear
        spec.warnings.append(SpecWarning(
            f"no `method` given and the equations are not linear in the states (the equation of {name!r} "
            f"has the term {term}): they are integrated with `euler`", pos,
            "add `method: euler` to keep it, or choose a more accurate one: `rk2`, `rk4`, or "
            "`exponential_euler` (for equations linear in their own state, like gating variables)"))
        return "euler", pos
    node = top["method"]
    if node.kind != "scalar" or not isinstance(node.value, str) or node.value not in METHODS:
        shown = node.value if node.kind == "scalar" else node.kind
        hint = closest(str(shown), METHODS) if isinstance(shown, str) else ""
        raise SpecError(f"unknown method {shown!r}", node.pos, hint or f"methods: {', '.join(METHODS)}")
    if node.value == "exact" and nonlinear is not None:
        name, term = nonlinear
        raise SpecError(f"`method: exact` needs equations linear in the states, but the equation of {name!r} "
                        f"has the nonlinear term {term}", equations[name].pos,
                        "choose method: rk4 (or rk2, euler, exponential_euler), or make the equations linear")
    return node.value, node.pos


def _threshold(spec: SpecContext, node: Node, env, varying: list[str]) -> tuple[sympy.Expr, SourcePos]:
    expr = spec.expression(node, env, "`threshold`", comparison=True)
    if isinstance(expr, (sympy.GreaterThan, sympy.StrictGreaterThan)):
        expr = expr.lhs - expr.rhs
    elif isinstance(expr, (sympy.LessThan, sympy.StrictLessThan)):
        expr = expr.rhs - expr.lhs
    elif isinstance(expr, sympy.logic.boolalg.Boolean):
        raise SpecError(f"`threshold` must be one comparison a >= b (or a > b), or an expression u "
                        f"meaning u >= 0, not {expr}", node.pos, "write e.g. threshold: v >= v_th")
    _no_spike(expr, node, "`threshold`")
    if not expr.free_symbols:
        raise SpecError(f"`threshold` is constant ({expr})", node.pos,
                        "compare a state with its threshold, e.g. v >= v_th")
    if not {s.name for s in expr.free_symbols} & set(varying):
        raise SpecError(f"`threshold` depends on no state or input (only on parameters: {expr} >= 0), so it "
                        "would spike every step or never", node.pos,
                        "compare a state with its threshold, e.g. v >= v_th")
    return expr, node.pos


def _reset(spec: SpecContext, env, user_states: list[str], has_threshold: bool) -> dict[str, Assignment]:
    node = spec.get("reset")
    if node is None:
        return {}
    if not has_threshold:
        raise SpecError("`reset` without `threshold`: nothing says when to reset", spec.key_pos("reset"),
                        "add `threshold: v >= v_th` (or remove `reset`)")
    spec.expect(node, "mapping", "`reset`", "reset: {v: v_reset}")
    out = {}
    for name, value in node.value.items():
        pos = node.key_pos[name]
        if name not in user_states:
            kind = spec.declared.get(name, (None,))[0]
            what = f"the {kind} {name!r}" if kind else f"{name!r}, which is not declared"
            raise SpecError(f"`reset` assigns {what}; only states can be reset", pos,
                            closest(name, user_states) or f"reset one of the states: {', '.join(user_states)}")
        expr = spec.expression(value, env, f"the reset of {name!r}")
        _no_spike(expr, value, f"the reset of {name!r}")
        out[name] = Assignment(name, real_symbol(f"{name}__reset"), expr, value.pos)
    return out


def _refractory(spec: SpecContext, parameters, env, user_states, reset, has_threshold):
    """`refractory`: ((period, where), (condition, where), hold); a period or a condition, not both."""
    node = spec.get("refractory")
    if node is None:
        return (None, None), (None, None), ()
    if not has_threshold:
        raise SpecError("`refractory` without `threshold`: nothing starts a refractory period",
                        spec.key_pos("refractory"), "add `threshold: v >= v_th` (or remove `refractory`)")
    spec.expect(node, "mapping", "`refractory`", "refractory: {period: 2.0, hold: [v]}")
    keys = ("period", "condition", "hold")
    for key in node.value:
        if key not in keys:
            raise SpecError(f"unknown key {key!r} in `refractory`", node.key_pos[key],
                            closest(key, keys) or "`refractory` takes `period` or `condition`, and `hold`")
    if "period" in node.value and "condition" in node.value:
        raise SpecError("`refractory` has both `period` and `condition`", node.key_pos["condition"],
                        "keep one: `period: 2.0` (a fixed time) or `condition: v > v_th` (while it holds)")
    hold = _hold(spec, node, user_states, reset)
    if "condition" in node.value:
        return (None, None), _refractory_condition(spec, node.value["condition"], env, user_states), hold
    if "period" not in node.value:
        raise SpecError("`refractory` has no `period` or `condition`", node.pos,
                        "write refractory: {period: 2.0}, or refractory: {condition: v > v_th}")
    return _refractory_period(spec, node.value["period"], parameters), (None, None), hold


def _refractory_condition(spec: SpecContext, node: Node, env, user_states: list[str]) -> tuple[sympy.Basic, SourcePos]:
    """A comparison (`<`, `<=`, `>`, `>=`, `==`, `!=`), or several joined with `&` / `|`, of the states at the start
    of a step."""
    expr = spec.expression(node, env, "the refractory condition", comparison=True)
    comparisons = (sympy.StrictLessThan, sympy.LessThan, sympy.StrictGreaterThan, sympy.GreaterThan, sympy.Eq,
                   sympy.Ne)
    parts = [expr]
    while any(isinstance(p, (sympy.And, sympy.Or)) for p in parts):
        parts = [a for p in parts for a in (p.args if isinstance(p, (sympy.And, sympy.Or)) else (p,))]
    if not all(isinstance(p, comparisons) for p in parts):
        raise SpecError(f"the refractory condition must be a comparison (<, <=, >, >=, ==, !=), or several joined "
                        f"with & or |, not {expr}", node.pos, "write e.g. condition: v > v_th")
    _no_spike(expr, node, "the refractory condition")
    if not any(real_symbol(n) in expr.free_symbols for n in user_states):
        raise SpecError(f"the refractory condition {expr} does not depend on a state: it cannot end",
                        node.pos, "compare a state, e.g. condition: v > v_th")
    return expr, node.pos


def _refractory_period(spec: SpecContext, period_node: Node, parameters) -> tuple[sympy.Expr, SourcePos]:
    env = {p: real_symbol(p) for p in parameters}
    period = spec.expression(period_node, env, "the refractory period", initial=True, draws=True)
    used = [parameters[s.name] for s in period.free_symbols if s.name in parameters]  # (the others: draws)
    shaped = sorted(p.name for p in used if p.shaped)
    if shaped:
        raise SpecError(f"the refractory period may not use the shaped parameter {shaped[0]!r}: it is one whole "
                        "number of steps for every neuron, compiled into the kernels", period_node.pos,
                        "use scalar constant parameters or a number, e.g. period: 2.0")
    if any(p.learnable for p in used):
        raise SpecError("the refractory period may not use learnable parameters (it is a whole number of "
                        "steps)", period_node.pos, "use constant parameters or a number")
    if len(used) < len(period.free_symbols):  # a random period: round(period / dt) steps, drawn at each spike
        return period, period_node.pos
    values = {real_symbol(p.name): sympy.Float(p.value) for p in parameters.values()}
    number = sympy.sympify(period).xreplace(values)
    if not number.is_number or not finite(number) or float(number) < 0:
        raise SpecError(f"the refractory period is {number}, not a number >= 0", period_node.pos,
                        "write a duration in the unit of dt, e.g. period: 2.0")
    problem = period_problem(float(number), parameters["dt"].value)
    if problem is not None:
        raise SpecError(problem, period_node.pos, "give a period >= 0 of at most that many steps")
    _, warning = refractory_steps(float(number), parameters["dt"].value, period_node.pos)
    if warning is not None:
        spec.warnings.append(warning)
    return period, period_node.pos


def _hold(spec: SpecContext, node: Node, user_states: list[str], reset) -> tuple[str, ...]:
    """The states `hold` lists (default: those `reset` sets)."""
    if "hold" not in node.value:
        return tuple(reset)
    hold_node = node.value["hold"]
    spec.expect(hold_node, "list", "`hold`", "hold: [v]")
    hold: list[str] = []
    for item in hold_node.value:
        if item.kind != "scalar" or item.value not in user_states:
            raise SpecError(f"`hold` lists {item.value!r}, which is not a state", item.pos,
                            closest(str(item.value), user_states) or f"states: {', '.join(user_states)}")
        if item.value in hold:
            raise SpecError(f"`hold` lists {item.value!r} twice", item.pos, "list each state once")
        hold.append(item.value)
    return tuple(hold)
