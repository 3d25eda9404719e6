"""Bad specs: every mistake is one ``flexsn_dsl.SpecError`` that names the place and the fix.

``TABLE`` holds (spec text, line, column, a piece of the message or hint): loading the text
must raise ``SpecError`` whose ``.line``/``.col`` (1-based) point at the offending token,
with a non-empty ``.hint``. Further tests check that a spec never runs code (YAML tags,
Python syntax in expressions) and that pathological input (deep nesting, huge specs,
alias bombs, constant blow-ups, sympy's exponential corners) fails fast with a
``SpecError`` instead of a hang, a ``RecursionError`` or a ``MemoryError``. "Fast" is a bound
on the work (the sympy objects built), not on wall-clock time, with a hang guard of minutes.
"""
from __future__ import annotations

import faulthandler

import pytest
import sympy
from sympy.core.cache import clear_cache

import flexsn_dsl

BASE = """\
neuron: n
states:
  v: 0.0
step:
  s: spike(v + x - 1.0)
  v: v * (1 - s) + x
"""


def expr(e: str) -> str:
    """BASE with the argument of spike (line 5, starting at column 12) replaced."""
    return BASE.replace("v + x - 1.0", e)


def step(e: str) -> str:
    """BASE with the whole right-hand side of line 5 (column 6) replaced."""
    return BASE.replace("spike(v + x - 1.0)", e)


P = pytest.param
TABLE = [
    # -- YAML syntax ----------------------------------------------------------------------
    P("neuron: n\nstates: {v: 0.0\nstep:\n  s: spike(v)\n", 3, 5, "YAML syntax error", id="yaml-flow-unclosed"),
    P("neuron: n\nstates:\n  v: 0.0\n step:\n  s: spike(v)\n", 4, 2, "indentation", id="yaml-indent"),
    P('neuron: n\nstates: {v: 0}\nstep:\n  s: "spike(x)\n', 4, 6, "never closed", id="yaml-quote-unclosed"),
    P("neuron: n\nstates: {v: 0}\nstep: [s\n", 3, 7, "[ list is never closed", id="yaml-list-unclosed"),
    P(step("a: b"), 5, 7, "quote the value", id="yaml-colon-in-value"),
    P("neuron: n\nstates: {v: *nothing}\n", 2, 13, "undefined alias", id="yaml-undefined-alias"),
    P("neuron: n\n---\nneuron: m\n", 2, 1, "more than one YAML document", id="yaml-two-documents"),
    P("neuron: n\x01\n", 1, 10, "control character", id="yaml-control-character"),
    # -- tabs --------------------------------------------------------------------------------
    P("neuron: n\nstates:\n\tv: 0.0\nstep:\n  s: spike(v)\n", 3, 1, "tab", id="tab-indent"),
    P("neuron: n\nstates:\n  \tv: 0.0\n", 3, 3, "tab", id="tab-after-spaces"),
    P("neuron: n\nstates:\n  v:\t0.0\nstep:\n  s: spike(v)\n", 3, 5, "tab", id="tab-after-colon"),
    # -- empty, not a mapping ---------------------------------------------------------------
    P("", 1, 1, "empty", id="empty"),
    P("\n\n   \n", 1, 1, "empty", id="blank"),
    P("# only a comment\n", 1, 1, "empty", id="comment-only"),
    P("- neuron: n\n- states: {}\n", 1, 1, "mapping, not a list", id="top-list"),
    P("just some text\n", 1, 1, "mapping, not a scalar", id="top-scalar"),
    P("42\n", 1, 1, "must be a mapping", id="top-number"),
    # -- missing and wrongly typed keys ------------------------------------------------------
    P("states:\n  v: 0\nstep:\n  s: spike(v)\n", 1, 1, "missing required key 'neuron'", id="missing-neuron"),
    P("neuron: n\nstep:\n  s: spike(x)\n", 1, 1, "missing required key 'states'", id="missing-states"),
    P("neuron: n\nstates:\n  v: 0.0\n", 1, 1, "missing required key 'step'", id="missing-step"),
    P(BASE.replace("neuron: n", "neuron: [a, b]"), 1, 9, "`neuron` must be a value, not list", id="neuron-list"),
    P(BASE.replace("neuron: n", "neuron: 123"), 1, 9, "not a valid identifier", id="neuron-number"),
    P(BASE.replace("neuron: n", "neuron: my-lif"), 1, 9, "not a valid identifier", id="neuron-dash"),
    P(BASE.replace("neuron: n", "neuron:"), 1, 8, "`neuron` must be a value, not nothing", id="neuron-null"),
    P("neuron: n\nstates: [v]\nstep:\n  s: spike(x)\n", 2, 9, "`states` must be a mapping, not list",
      id="states-list"),
    P("neuron: n\nstates:\nstep:\n  s: spike(x)\n", 2, 8, "`states` must be a mapping, not nothing",
      id="states-null"),
    P("neuron: n\nstates: {}\nstep:\n  s: spike(x)\n", 2, 9, "`states` is empty", id="states-empty"),
    P("neuron: n\nstates: {v: 0}\nstep: spike(x)\n", 3, 7, "`step` must be a mapping, not str", id="step-scalar"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  - s: spike(x)\n", 4, 3, "`step` must be a mapping, not list",
      id="step-list"),
    P("neuron: n\nstates: {v: 0}\nstep: {}\n", 3, 7, "`step` is empty", id="step-empty"),
    P(BASE + "inputs: x\n", 7, 9, "`inputs` must be a list, not str", id="inputs-scalar"),
    P(BASE + "inputs: []\n", 7, 9, "`inputs` is empty", id="inputs-empty"),
    P(BASE + "outputs: s\n", 7, 10, "`outputs` must be a list, not str", id="outputs-scalar"),
    P(BASE + "parameters: 3\n", 7, 13, "`parameters` must be a mapping, not int", id="parameters-number"),
    P(BASE + "description: [a]\n", 7, 14, "`description` must be text", id="description-list"),
    P(BASE + "parameters:\n  tau: {value: 2.0, learnable: maybe}\n", 8, 32, "must be true or false",
      id="learnable-not-bool"),
    P(BASE + "parameters:\n  tau: {learnable: true}\n", 8, 8, "has no `value`", id="parameter-no-value"),
    P("neuron: n\nstates:\n  v: {value: 0}\nstep:\n  s: spike(v)\n", 3, 7, "unknown key 'value' in state 'v'",
      id="state-wrong-key"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: [1, 2]\n", 4, 6, "must be a number or an expression, not list",
      id="step-value-list"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s:\n", 4, 5, "not nothing", id="step-value-null"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: true\n", 4, 6, "not bool", id="step-value-bool"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  u: v + x\n", 3, 1, "no outputs", id="no-spike-no-outputs"),
    # -- unknown keys and names: suggest the closest -------------------------------------------
    P(BASE + "ouputs: [s]\n", 7, 1, "did you mean 'outputs'", id="unknown-top-key"),
    P(BASE + "parameters:\n  tau: {valeu: 2.0}\n", 8, 9, "did you mean 'value'", id="unknown-parameter-key"),
    P(expr("vv + x"), 5, 12, "did you mean 'v'", id="unknown-name"),
    P(expr("v + tua"), 5, 16, "unknown name 'tua'", id="unknown-name-no-match"),
    P("neuron: n\nparameters: {tau: 2}\nstates: {v: 0, w: v}\nstep:\n  s: spike(x)\n", 3, 19,
      "an initial value cannot use the state 'v'", id="init-uses-state"),
    P("neuron: n\nparameters: {tau: 2}\nstates: {v: w, w: 0}\nstep:\n  s: spike(x)\n", 3, 13,
      "an initial value cannot use the state 'w'", id="init-uses-later-state"),
    P("neuron: n\nparameters: {tau: 2}\nstates: {v: x}\nstep:\n  s: spike(x)\n", 3, 13,
      "an initial value cannot use the input 'x'", id="init-uses-input"),
    P("neuron: n\nparameters: {tau: 2}\nstates: {v: taux}\nstep:\n  s: spike(x)\n", 3, 13,
      "did you mean 'tau'? (an initial value may use numbers and parameters only)", id="init-unknown-name"),
    # -- expression syntax errors ---------------------------------------------------------------
    P(expr("v + * x"), 5, 16, "syntax error", id="syntax-operator"),
    P(expr("(v + x"), 5, 11, "'(' was never closed", id="syntax-unclosed-paren"),  # spike's own (
    P(step("spike(v + x))"), 5, 18, "syntax error", id="syntax-extra-paren"),
    P(expr("v +"), 5, 15, "syntax error", id="syntax-trailing-operator"),
    P(expr("v x"), 5, 12, "syntax error", id="syntax-missing-operator"),
    P(expr("2v"), 5, 12, "syntax error", id="syntax-bad-number"),
    P(step("'spike(x'"), 5, 12, "syntax error", id="syntax-in-quoted-scalar"),
    P(step('"spike(v\\t+ vv)"'), 5, 18, "unknown name 'vv'", id="position-double-quoted-escape"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: |\n    spike(v +\n      vv)\n", 6, 7, "unknown name 'vv'",
      id="position-literal-block"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: >\n    spike(v +\n      vv)\n", 6, 7, "unknown name 'vv'",
      id="position-folded-block"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: spike(v +\n    vv)\n", 5, 5, "unknown name 'vv'",
      id="position-plain-multiline"),
    P("neuron: n\nstates: {v: 0}\nstep: {s: spike(v + vv)}\n", 3, 21, "unknown name 'vv'", id="position-flow"),
    P("neuron: n\r\nstates: {v: 0}\r\nstep:\r\n  s: spike(vv)\r\n", 4, 12, "unknown name 'vv'", id="position-crlf"),
    P(expr("x / (1 - 1)"), 5, 12, "division by zero", id="division-by-zero"),
    # -- a name used before it is assigned; a name assigned twice --------------------------------
    P("neuron: n\nstates: {v: 0}\nstep:\n  s: spike(h - 1)\n  h: v + x\n", 4, 12,
      "'h' is used before it is assigned", id="used-before-assigned"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  h: h + x\n  s: spike(h)\n", 4, 6, "'h' is used in its own definition",
      id="used-in-own-definition"),
    P(BASE + "  v: v + 1\n", 7, 3, "'v' is assigned twice", id="state-assigned-twice"),
    P(BASE + "  s: 0\n", 7, 3, "'s' is assigned twice", id="name-assigned-twice"),
    P("neuron: n\nstates: {v: 0}\nstep: {s: spike(x), v: 1, s: 2}\n", 3, 27, "'s' is assigned twice",
      id="assigned-twice-flow"),
    # -- duplicate YAML keys (PyYAML would keep the last) ----------------------------------------
    P(BASE + "neuron: m\n", 7, 1, "top-level key 'neuron' is given twice", id="duplicate-top-key"),
    P("neuron: n\nstates:\n  v: 0\n  v: 1\nstep:\n  s: spike(v)\n", 4, 3, "state 'v' is declared twice",
      id="duplicate-state"),
    P(BASE + "parameters:\n  tau: 1\n  tau: 2\n", 9, 3, "parameter 'tau' is declared twice",
      id="duplicate-parameter"),
    P(BASE + "surrogate: {name: atan, alpha: 1, alpha: 2}\n", 7, 35, "duplicate key 'alpha'",
      id="duplicate-surrogate-key"),
    P(BASE + "parameters:\n  tau: {value: 1, value: 2}\n", 8, 19, "duplicate key 'value'",
      id="duplicate-nested-key"),
    # -- outputs ------------------------------------------------------------------------------------
    P(BASE + "outputs: [q]\n", 7, 11, "output 'q' is not an input, state or step name", id="undefined-output"),
    P(BASE + "outputs: [s, vv]\n", 7, 14, "did you mean 'v'", id="undefined-output-suggest"),
    P(BASE + "outputs: [s, s]\n", 7, 14, "listed twice", id="output-twice"),
    P(BASE + "outputs: []\n", 7, 10, "`outputs` is empty", id="outputs-empty"),
    # -- surrogates ---------------------------------------------------------------------------------
    P(BASE + "surrogate: atn\n", 7, 12, "did you mean 'atan'", id="unknown-surrogate"),
    P(BASE + "surrogate: {name: sigmod, alpha: 4}\n", 7, 19, "did you mean 'sigmoid'",
      id="unknown-surrogate-mapping"),
    P(BASE + "surrogate: {name: atan, alph: 3}\n", 7, 25, "did you mean 'alpha'", id="unknown-surrogate-parameter"),
    P(BASE + "surrogate: {name: straight_through, alpha: 3}\n", 7, 37, "has no parameter 'alpha'",
      id="surrogate-without-parameters"),
    P(BASE + "surrogate: {name: piecewise_leaky_relu, alpha: 3}\n", 7, 41, "its parameters: w, c",
      id="surrogate-parameter-list"),
    P(BASE + "surrogate: {alpha: 2}\n", 7, 12, "`surrogate` has no `name`", id="surrogate-no-name"),
    P(BASE + "surrogate: 5\n", 7, 12, "`surrogate` must be a name or a mapping", id="surrogate-number"),
    P(BASE + "surrogate: {name: atan, alpha: big}\n", 7, 32, "surrogate parameter 'alpha' must be a number",
      id="surrogate-parameter-text"),
    # -- functions ----------------------------------------------------------------------------------
    P(step("spik(v - 1)"), 5, 6, "did you mean 'spike'", id="unknown-function"),
    P(expr("v + tanhh(x)"), 5, 16, "did you mean 'tanh'", id="unknown-function-inner"),
    P(expr("gamma(x)"), 5, 12, "unknown function 'gamma'", id="unknown-function-list"),
    P(step("spike(v, x)"), 5, 6, "spike() takes 1 argument, got 2", id="arity-too-many"),
    P(expr("clip(x, 0)"), 5, 12, "clip() takes 3 arguments, got 2", id="arity-too-few"),
    P(expr("where(x > 0, 1)"), 5, 12, "where() takes 3 arguments, got 2", id="arity-where"),
    P(expr("exp()"), 5, 12, "exp() takes 1 argument, got 0", id="arity-none"),
    P(expr("max(x, v, 1)"), 5, 12, "max() takes 2 arguments, got 3", id="arity-max"),
    P(expr("v + exp"), 5, 16, "'exp' is a function", id="function-not-called"),
    P(expr("exp(x, base=2)"), 5, 19, "takes no keyword arguments", id="keyword-argument"),
    P(expr("sqrt(-1)"), 5, 12, "not a finite real number", id="constant-complex"),
    P(expr("log(0) + x"), 5, 12, "not a finite real number", id="constant-infinite"),
    # -- parameters that are not numbers -------------------------------------------------------------
    P(BASE + "parameters:\n  tau: abc\n", 8, 8, "parameter 'tau' must be a number, not str 'abc'",
      id="parameter-text"),
    P(BASE + "parameters:\n  tau: '2.0'\n", 8, 8, "without quotes", id="parameter-quoted"),
    P(BASE + "parameters:\n  tau: true\n", 8, 8, "must be a number, not bool", id="parameter-bool"),
    P(BASE + "parameters:\n  tau: [1, 2]\n", 8, 8, "must be a number, not a list", id="parameter-list"),
    P(BASE + "parameters:\n  tau:\n", 8, 7, "parameter 'tau' must be a number, not nothing |", id="parameter-null"),
    P(BASE + "parameters:\n  tau: {value: x}\n", 8, 16, "the value of parameter 'tau' must be a number",
      id="parameter-value-text"),
    P(BASE + "parameters:\n  tau: .nan\n", 8, 8, "is NaN", id="parameter-nan"),
    P(BASE + "parameters:\n  tau: .inf\n", 8, 8, "infinite", id="parameter-inf"),
    P(BASE + "parameters:\n  tau: 1e999\n", 8, 8, "infinite", id="parameter-overflow"),
    P(BASE + "parameters:\n  tau: 2001-01-01\n", 8, 8, "as a date", id="parameter-date"),
    P("neuron: n\nstates:\n  v: .inf\nstep:\n  s: spike(v)\n", 3, 6, "infinite", id="state-init-inf"),
    P(expr("1e400 * x"), 5, 12, "too large for a float64", id="literal-overflow"),
    # -- parameter values that make an expression infinite or complex ------------------------------------
    P("neuron: n\nparameters: {tau: 0.0}\nstates: {v: 0}\nstep:\n  s: spike(v + x / tau)\n", 5, 3,
      "step 's' is not a finite real number with tau = 0 (line 2)", id="parameter-divides-by-zero"),
    P("neuron: n\nparameters: {tau: {value: 0.0, learnable: true}}\nstates: {v: 0}\nstep:\n  h: x / tau\n"
      "  s: spike(h)\n", 5, 3, "step 'h' is not a finite real number with tau = 0", id="learnable-divides-by-zero"),
    P("neuron: n\nparameters: {a: -1.0}\nstates: {v: 0}\nstep:\n  s: spike(v + sqrt(a) * x)\n", 5, 3,
      "with a = -1 (line 2)", id="parameter-negative-root"),
    P("neuron: n\nparameters: {tau: 0.0}\nstates: {v: 1 / tau}\nstep:\n  s: spike(v + x)\n", 3, 10,
      "initial value of state 'v' is not a finite real number", id="parameter-init-divides-by-zero"),
    P(BASE + "surrogate: {name: q_pseudo_spike, alpha: 1}\n", 7, 42, "not a finite real number",
      id="surrogate-parameter-divides-by-zero"),
    P(BASE + "surrogate: {name: rect, alpha: 0.0}\n", 7, 32, "surrogate 'rect' with alpha=0", id="surrogate-rect-zero"),
    # -- names that collide or are reserved -----------------------------------------------------------
    P(BASE + "parameters:\n  v: 1.0\n", 8, 3, "parameter 'v' collides with the state", id="parameter-vs-state"),
    P(BASE + "inputs: [v]\n", 7, 10, "input 'v' collides with the state", id="input-vs-state"),
    P(BASE + "inputs: [x]\nparameters:\n  x: 1.0\n", 9, 3, "parameter 'x' collides with the input",
      id="parameter-vs-input"),
    P("neuron: n\nparameters: {x: 1}\nstates: {v: 0}\nstep:\n  s: spike(v)\n", 2, 14,
      "(the default input when `inputs` is not given)", id="parameter-vs-default-input"),
    P("neuron: n\nstates: {x: 1}\nstep:\n  s: spike(x)\n", 2, 10, "name the inputs yourself",
      id="state-vs-default-input"),
    P(BASE + "inputs: [x, y, x]\n", 7, 16, "input 'x' is listed twice", id="input-twice"),
    P(BASE + "parameters:\n  exp: 1.0\n", 8, 3, "a function of the language", id="reserved-function-name"),
    P("neuron: n\nstates:\n  pi: 0\nstep:\n  s: spike(x)\n", 3, 3, "state name 'pi' is reserved",
      id="reserved-pi"),
    P(BASE + "  lambda: x\n", 7, 3, "Python keyword", id="reserved-keyword"),
    P(BASE + "  torch: x\n", 7, 3, "used by the generated code", id="reserved-generated"),
    P(BASE + "  _t: x\n", 7, 3, "may not start with '_'", id="reserved-underscore"),
    P(BASE + "  a__b: x\n", 7, 3, "contain '__'", id="reserved-double-underscore"),
    P(BASE + "  x: v\n", 7, 3, "cannot assign the input 'x'", id="assign-input"),
    P(BASE + "parameters:\n  tau: 2\n" + "step2: 1\n", 9, 1, "unknown key 'step2'", id="unknown-key-after-params"),
    P("neuron: n\nparameters: {tau: 2}\nstates: {v: 0}\nstep:\n  tau: v\n  s: spike(tau)\n", 5, 3,
      "cannot assign the parameter 'tau'", id="assign-parameter"),
    P("neuron: n\nstates: {vé: 0}\nstep:\n  s: spike(x)\n", 2, 10, "not a valid identifier",
      id="non-ascii-name"),
    # -- comparisons as values (1 or 0): & and | join comparisons only -----------------------------------
    P(expr("(v > 1) & x"), 5, 22, "& and | join comparisons", id="and-of-a-value"),
    P(expr("x | (v > 1)"), 5, 12, "& and | join comparisons", id="or-of-a-value"),
    P(expr("where(v > 1, x > 0, 0) & 1"), 5, 12, "& and | join comparisons", id="and-of-a-where"),
    P(expr("heaviside(v, 0.5, 1)"), 5, 12, "heaviside() takes 1 or 2 arguments, got 3", id="heaviside-arity"),
    P(expr("sign()"), 5, 12, "sign() takes 1 argument, got 0", id="sign-arity"),
    P(expr("where(v, 1, 0)"), 5, 18, "must be a comparison", id="where-condition-not-comparison"),
    P(expr("where((v > 1) and (x < 0), 1, 0)"), 5, 18, "`and`/`or` are not part of the language",
      id="python-and-in-where"),
    P(expr("x or v"), 5, 12, "`and`/`or`", id="python-or"),
    P(expr("not x"), 5, 12, "`not` is not part of the language", id="python-not"),
    P(expr("where(v is x, 1, 0)"), 5, 18, "only < <= > >= == != comparisons", id="comparison-is"),
    # -- other Python syntax ------------------------------------------------------------------------------
    P(expr("x if v else 1"), 5, 12, "write where(c, a, b)", id="python-ifexp"),
    P(expr("x // 2"), 5, 12, "operator // is not part of the language", id="python-floordiv"),
    P(expr("x % 2"), 5, 12, "operator %", id="python-mod"),
    P(expr("~x"), 5, 12, "operator ~", id="python-invert"),
    P(expr("x.real"), 5, 12, "attribute access", id="python-attribute"),
    P(expr("x[0]"), 5, 12, "indexing", id="python-subscript"),
    P(expr("'abc'"), 5, 12, "'abc' is not a number", id="python-string"),
    P(expr("True"), 5, 12, "True is not a number", id="python-bool"),
    P(expr("1j"), 5, 12, "1j is not a number", id="python-complex"),
    P(expr("(x, v)"), 5, 12, "a tuple is not part of the language", id="python-tuple"),
    P(expr("[x]"), 5, 12, "a list is not part of the language", id="python-list"),
    P(expr("f'{x}'"), 5, 12, "f-string", id="python-fstring"),
    P(expr("(q := x)"), 5, 13, "`:=`", id="python-walrus"),
    P(expr("exp(*x)"), 5, 16, "`*` unpacking", id="python-starred"),
    P(step('"lambda q: 1"'), 5, 7, "lambda is not part of the language", id="python-lambda"),
    P(expr("x; v"), 5, 13, "syntax error", id="python-two-statements"),
    # -- YAML tags: specs are data, never code ------------------------------------------------------------
    P("neuron: !!python/object/apply:os.system ['true']\n", 1, 9, "never create Python objects",
      id="tag-python-apply"),
    P(BASE + "description: !!python/name:os.system\n", 7, 14, "!!python/name:os.system", id="tag-python-name"),
    P("!!python/object:collections.OrderedDict\nneuron: n\n", 1, 1, "never create Python objects",
      id="tag-python-top"),
    P(BASE + "description: !!binary aGVsbG8=\n", 7, 14, "YAML tag '!!binary' is not allowed", id="tag-binary"),
    P(BASE + "description: !custom text\n", 7, 14, "YAML tag '!custom' is not allowed", id="tag-custom"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  <<: {s: spike(x)}\n", 4, 3, "merge keys", id="yaml-merge-key"),
    P("neuron: n\nstates: {v: 0}\nstep:\n  ? [s]\n  : spike(x)\n", 4, 5, "mapping keys must be plain names",
      id="yaml-complex-key"),
    P("neuron: n\nstates: &a [*a]\nstep: {s: spike(x)}\n", 2, 9, "recursive alias", id="yaml-recursive-alias"),
    # -- limits ------------------------------------------------------------------------------------------------
    P(expr("x" + " + x" * 1300), 5, 6, "more than the limit of 4000", id="expression-too-long"),
    P(expr("x" + "+x" * 1100), 5, 6, "more than 2000 terms", id="expression-too-many-terms"),
    P(expr("(" * 250 + "x" + ")" * 250), 5, 211, "too many nested parentheses", id="too-many-parentheses"),
    P(expr("exp(" * 70 + "x" + ")" * 70), 5, 248, "nested more than 60 levels", id="expression-too-deep"),
    P(expr("9**9**9**9"), 5, 15, "out of the range of a float64", id="power-bomb"),
    P(expr("clip(" * 7 + "x" + ", v, 1)" * 7), 5, 12, "nests too many conditional functions",
      id="conditionals-in-condition"),
]


def test_a_value_yaml_split_at_its_commas_gets_the_quoting_hint():
    """Only an unbalanced value from an inline mapping or list gets the hint; the quoted value loads."""
    split = "neuron: n\nstates: {v: 0.0}\nstep: {s: spike(v + x - 1), v: min(max(v, 0), 0.2)}\n"
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(split, filename="bad.yaml", backend="torch")
    assert "split this value at its commas (it read `min(max(v`)" in info.value.hint
    flexsn_dsl.loads(split.replace("v: min(max(v, 0), 0.2)", 'v: "min(max(v, 0), 0.2)"'), backend="torch")
    for block in (BASE.replace("v: v * (1 - s) + x", "v: min(max(v, 0), 0.2"),
                  "neuron: n\nstates: {v: 0.0}\nstep: {s: spike(v + x - 1), v: (v}\n"):
        with pytest.raises(flexsn_dsl.SpecError) as info:
            flexsn_dsl.loads(block, filename="bad.yaml", backend="torch")
        assert "commas" not in info.value.hint, str(info.value)


@pytest.mark.parametrize("text, line, col, fragment", TABLE)
def test_bad_spec(text, line, col, fragment):
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="bad.yaml", backend="torch")
    exc = info.value
    explained = f"{exc.message} | hint: {exc.hint}"
    assert fragment in explained, str(exc)
    assert (exc.file, exc.line, exc.col) == ("bad.yaml", line, col), str(exc)
    assert exc.hint.strip(), str(exc)
    assert "Traceback" not in str(exc)
    text = str(exc)
    assert text.startswith(f"bad.yaml:{line}:{col}: error: "), text
    assert exc.message in text and exc.hint in text


def test_error_format_shows_the_line_and_a_caret():
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(expr("v + tua"), filename="bad.yaml")
    assert str(info.value).splitlines() == [
        "bad.yaml:5:16: error: unknown name 'tua'",
        "      s: spike(v + tua)",
        "                   ^",
        "  hint: declare it as an input, parameter or state, or assign it in step",
    ]


def test_a_long_line_is_shown_as_a_window_around_the_column():
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(expr("x" + " + x" * 1300), filename="bad.yaml")
    assert max(len(line) for line in str(info.value).splitlines()) < 200


def test_load_names_the_file(tmp_path):
    path = tmp_path / "neuron.yaml"
    path.write_text(expr("vv"))
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.load(path)
    assert (info.value.file, info.value.line, info.value.col) == (str(path), 5, 12)
    assert str(info.value).startswith(f"{path}:5:12: error: unknown name 'vv'")


def test_load_of_a_missing_or_binary_file(tmp_path):
    with pytest.raises(flexsn_dsl.SpecError, match="cannot read"):
        flexsn_dsl.load(tmp_path / "nope.yaml")
    path = tmp_path / "binary.yaml"
    path.write_bytes(b"neuron: n\n\xff\xfe\n")
    with pytest.raises(flexsn_dsl.SpecError, match="not UTF-8") as info:
        flexsn_dsl.load(path)
    assert info.value.hint


def test_the_error_type_is_exported_with_its_fields():
    assert issubclass(flexsn_dsl.SpecError, Exception)
    error = flexsn_dsl.SpecError("what", flexsn_dsl.SourcePos("f.yaml", 3, 4), "fix")
    assert (error.file, error.line, error.col, error.message, error.hint) == ("f.yaml", 3, 4, "what", "fix")


def test_numbers_in_exponent_notation_are_numbers():
    """YAML 1.1 reads a plain 1e-3 as text; a spec means a number."""
    from flexsn_dsl.compiler import compile_spec
    compiled = compile_spec(text=BASE + "parameters:\n  tau: 1e-3\n  c: -2E+2\n")
    assert compiled.values == {"tau": 1e-3, "c": -200.0}


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_conditionals_inside_conditions_build_and_run(backend):
    """sympy folds where/min/max/clip/relu inside a condition into ITE: it must still compile and run."""
    import torch
    text = ("neuron: n\ninputs: [x, w]\nstates: {v: 0.0}\nstep:\n"
            "  a: where(clip(x, 0, 1) > 0.5, 1, 0)\n"
            "  b: max(relu(x), w)\n"
            "  c: where((clip(x, 0, 1) > 0) & (clip(w, 0, 1) > 0), 1, 0)\n"
            "  d: clip(clip(x, 0, 1), 0.2, 0.8)\n"
            "  e: clip(clip(clip(x, w, 1), w - 1, 0.5), -0.5, w)\n"
            "  f: where(max(x, w) > min(relu(x - 0.5), 0.7), min(x, w), max(x, w))\n"
            "  s: spike(a + b + c + d + e + f - 1)\n"
            "outputs: [a, b, c, d, e, f]\n")
    x = torch.linspace(-1, 2, 31, dtype=torch.float64).reshape(1, -1)
    w = torch.linspace(2, -1.3, 31, dtype=torch.float64).reshape(1, -1)
    a, b, c, d, e, f = flexsn_dsl.loads(text, backend=backend)(x, w)

    def clip(t, lo, hi):  # the language's clip: lo below lo, else hi above hi (lo wins if lo > hi)
        return torch.where(t < lo, lo, torch.where(t > hi, hi, t))
    torch.testing.assert_close(a, (x.clamp(0, 1) > 0.5).double())
    torch.testing.assert_close(b, torch.maximum(x.relu(), w))
    torch.testing.assert_close(c, ((x.clamp(0, 1) > 0) & (w.clamp(0, 1) > 0)).double())
    torch.testing.assert_close(d, x.clamp(0, 1).clamp(0.2, 0.8))
    torch.testing.assert_close(e, clip(clip(clip(x, w, torch.ones_like(x)), w - 1, 0.5 + 0 * x), -0.5 + 0 * x, w))
    torch.testing.assert_close(f, torch.where(torch.maximum(x, w) > torch.minimum((x - 0.5).relu(), 0.7 + 0 * x),
                                              torch.minimum(x, w), torch.maximum(x, w)))


# --------------------------------------------------------------------------
# no code from a spec ever runs
# --------------------------------------------------------------------------
CODE = [
    "__import__('os').system('touch {f}')",
    "exec(\"open('{f}', 'w')\")",
    "eval(\"open('{f}', 'w')\")",
    "open('{f}', 'w')",
    "().__class__.__bases__[0].__subclasses__()",
    "x.__class__",
    "(lambda: __import__('os').system('touch {f}'))()",
    "[c for c in ().__class__.__mro__]",
    "f\"{{__import__('os').system('touch {f}')}}\"",
    "spike(x, cmd=__import__('os').system('touch {f}'))",
    "getattr(x, 'y')",
    "globals()",
    "x[__import__('os').system('touch {f}')]",
    "breakpoint()",
]


@pytest.mark.parametrize("code", CODE)
def test_expressions_never_run_code(tmp_path, code):
    target = tmp_path / "PWNED"
    text = "neuron: n\nstates: {v: 0}\nstep:\n  s: |\n    " + code.format(f=target) + "\n"
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="bad.yaml", backend="torch")
    assert info.value.line == 5 and info.value.hint
    assert not target.exists()


TAGS = [
    '!!python/object/apply:os.system ["touch {f}"]',
    '!!python/object/new:os.system ["touch {f}"]',
    '!!python/object/apply:subprocess.call [["touch", "{f}"]]',
    "!!python/name:os.system",
    "!!python/module:os",
    '!!python/object/apply:builtins.open ["{f}", "w"]',
]


@pytest.mark.parametrize("where", ["neuron", "state", "step", "key"])
@pytest.mark.parametrize("tag", TAGS)
def test_yaml_tags_never_run_code(tmp_path, tag, where):
    target = tmp_path / "PWNED"
    value = tag.format(f=target)
    text = {"neuron": f"neuron: {value}\nstates: {{v: 0}}\nstep: {{s: spike(x)}}\n",
            "state": f"neuron: n\nstates:\n  v: {value}\nstep: {{s: spike(x)}}\n",
            "step": f"neuron: n\nstates: {{v: 0}}\nstep:\n  s: {value}\n",
            "key": f"neuron: n\nstates: {{v: 0}}\nstep:\n  ? {value}\n  : spike(x)\n"}[where]
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="bad.yaml", backend="torch")
    assert "not allowed" in info.value.message or "plain names" in info.value.message
    assert info.value.hint
    assert not target.exists()


def test_cli_never_runs_code_either(tmp_path):
    target = tmp_path / "PWNED"
    spec = tmp_path / "evil.yaml"
    spec.write_text(f'neuron: !!python/object/apply:os.system ["touch {target}"]\n')
    from flexsn_dsl.cli import main
    assert main(["check", str(spec)]) == 1
    assert not target.exists()


# --------------------------------------------------------------------------
# pathological input: fast, a SpecError, never RecursionError or MemoryError
# --------------------------------------------------------------------------
def _laughs(levels: int) -> str:
    lines = ["a0: &a0 [x, x, x, x, x, x, x, x, x, x]"]
    lines += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 10) + "]" for i in range(1, levels)]
    return "\n".join(lines) + "\n"


def _deep_block(levels: int) -> str:
    return "neuron: n\nstates:\n" + "".join(" " * i + "a:\n" for i in range(1, levels)) + " " * levels + "v: 0\n"


HEAD = "neuron: n\nstates: {v: 0}\nstep:\n"
PATHOLOGICAL = [
    P(expr("(" * 5000 + "x" + ")" * 5000), "4000", id="parens-5000"),
    P(expr("-" * 100000 + "x"), "4000", id="unary-minus-100000"),
    P(expr("x+" * 50000 + "x"), "4000", id="sum-50000"),
    P(expr("-" * 3990 + "x"), "nested", id="unary-minus-3990"),
    P(expr("(" * 1900 + "x" + ")" * 1900), "nested", id="parens-1900"),
    P(expr("exp(" * 790 + "x" + ")" * 790), "nested", id="calls-790"),
    P(expr("x**" * 1300 + "x"), "nested", id="power-tower"),
    P(expr("where(" * 300 + "x > 0" + ", 1, 0)" * 300), "nested", id="where-300"),
    P(expr("x+" * 1990 + "x"), "terms", id="sum-1990"),
    P(expr("2**2**2**2**2**2"), "range", id="power-bomb-2"),
    P(expr("10**10**10"), "range", id="power-bomb-10"),
    P(expr("(2.0**1000)**1000 * x"), "range", id="power-float"),
    P(expr("clip(" * 12 + "x" + ", v, 1)" * 12), "too many conditional", id="nested-clips"),
    P(expr("clip(" * 12 + "x" + "".join(f", v, {k})" for k in range(12))), "too many conditional",
      id="nested-clips-2"),
    P(expr("relu(" + " + ".join(f"clip(x - {i}, 0, 1)" for i in range(8)) + ")"), "too many conditional",
      id="relu-of-clips"),
    P(HEAD + "".join(f"  a{i}: clip(clip(clip(clip(clip(x, v, 1), v, 1), v, 1), v, 1), v, {i})\n" for i in range(8))
      + "  s: spike(a0)\n", "too many conditional", id="conditions-over-the-spec"),
    P("neuron: n\nstates: " + "[" * 100000 + "\n", "nested", id="yaml-brackets-100000"),
    P("neuron: n\nstates: " + "[" * 5000 + "]" * 5000 + "\n", "nested", id="yaml-brackets-5000"),
    P("neuron: n\nstates: " + "{a: " * 50000 + "\n", "nested", id="yaml-braces"),
    P(_deep_block(1300), "nested", id="yaml-indentation-1300"),
    P("neuron: n\nstates: " + "[" * 60 + "]" * 60 + "\n", "nested more than", id="yaml-brackets-60"),
    P(_laughs(9), "more than", id="alias-bomb"),
    P(_laughs(4) + "neuron: n\nstates: {v: *a3}\nstep: {s: spike(x)}\n", "more than", id="alias-bomb-small"),
    P("neuron: n\ndescription: " + "a" * 1_100_000 + "\n", "limit", id="description-1.1MB"),
    P(HEAD + "  s: spike(" + "x+" * 600_000 + "x)\n", "limit", id="expression-1.2MB"),
    P("a: [" + "1," * 490_000 + "]\n", "YAML values", id="flow-list-1MB"),
    P("".join(f"k{i}: {i}\n" for i in range(90_000))[:999_000], "YAML values", id="keys-1MB"),
    P("#" + "a" * 990_000 + "\n" + HEAD + "  s: spike(zz)\n", "unknown name", id="comment-1MB"),
    P(HEAD + "".join(f"  a{i}: x + {i}\n" for i in range(4000)) + "  s: spike(a0)\n", "limit",
      id="step-4000-lines"),
    P(HEAD + "".join(f"  a{i}: " + "+".join(f"where(x > {k}, {k}, {k + 1})" for k in range(150)) + "\n"
                     for i in range(20)) + "  s: spike(a0)\n", "terms in all", id="terms-in-all"),
    P("neuron: n\nstates:\n" + "".join(f"  v{i}: {i}\n" for i in range(12000)) + "step: {s: spike(zz)}\n",
      "YAML values", id="states-12000"),
]


# The sympy objects a load may build: a valid spec of the zoo builds a few hundred, the specs
# below up to about 20,000 (on a cold cache); sympy's Piecewise folding, which took minutes on
# nested clips before the condition budget, builds millions.
MAX_SYMPY_OBJECTS = 100_000
HANG_GUARD_S = 600  # a hang ends the run with every thread's traceback instead of stalling CI


@pytest.fixture
def sympy_objects(monkeypatch):
    """A one-element list counting the sympy objects built (every one passes through
    ``Basic.__new__``) from a cold cache, under the hang guard."""
    count = [0]
    original = sympy.Basic.__new__

    def counting_new(cls, *args, **kwargs):
        count[0] += 1
        return original(cls, *args, **kwargs)

    clear_cache()
    monkeypatch.setattr(sympy.Basic, "__new__", staticmethod(counting_new))
    faulthandler.dump_traceback_later(HANG_GUARD_S, exit=True)
    try:
        yield count
    finally:
        faulthandler.cancel_dump_traceback_later()


def test_the_work_counter_counts(sympy_objects):
    flexsn_dsl.loads(BASE, backend="torch")
    assert 10 < sympy_objects[0] < 10_000


@pytest.mark.parametrize("text, fragment", PATHOLOGICAL)
def test_pathological_specs_fail_fast(text, fragment, sympy_objects):
    with pytest.raises(flexsn_dsl.SpecError) as info:
        flexsn_dsl.loads(text, filename="bad.yaml", backend="torch")
    exc = info.value
    assert fragment in f"{exc.message} {exc.hint}", str(exc)[:500]
    assert exc.line is not None and exc.col is not None and exc.hint
    assert len(str(exc)) < 2000
    assert sympy_objects[0] < MAX_SYMPY_OBJECTS


# sympy used to take seconds to minutes on these (its Piecewise folding): they are valid and load fast
FAST = [
    "where(" + " & ".join(f"(clip(x - {k}, v, 1) > 0)" for k in range(10)) + ", 1, 0)",
    "clip(sqrt(sigmoid(x)), v, where(where((clip(v, 0, pi) > (x / pi)) | ((0 ** x) > (1 / x)), tanh(-1), v)"
    " > clip(where(pi == 1, 0, v), (1 ** 0.0), 0.0), v, min(v, (x * 2.5))))",
    "clip(clip(clip(clip(clip(x, v, 1), v, 2), v, 3), v, 4), v, 5)",
    "relu(clip(x, 0, 1) + clip(v, 0, 1) + clip(x - v, 0, 1) + clip(x + v, 0, 1))",
    "max(max(max(max(max(max(x, v), x - 1), v - 1), x - 2), v - 2), x + 1)",
]


@pytest.mark.parametrize("text", FAST)
def test_nested_conditionals_load_fast(text, sympy_objects):
    flexsn_dsl.loads(expr(text), backend="torch")
    assert sympy_objects[0] < MAX_SYMPY_OBJECTS
