"""Stage 2: the language's vocabulary: its keys, methods, reserved names and limits."""
from __future__ import annotations

import re
import sys

from ..expressions import DSL_FUNCTIONS


CONTINUOUS_KEYS = ("equations", "method", "threshold", "reset", "detach_reset", "refractory")
TOP_LEVEL_KEYS = ("neuron", "description", "inputs", "parameters", "states", "recurrent", "surrogate", "step", *CONTINUOUS_KEYS,
                  "outputs", "passes", "simulate")
SIMULATE_KEYS = ("drive", "steps", "sizes")  # `simulate`: the defaults of flexsn-dsl simulate
MAX_SIMULATE_STEPS = 10_000_000
REQUIRED_KEYS = ("neuron", "states")
METHODS = ("exact", "euler", "rk2", "rk4", "exponential_euler")
SPIKE_OUTPUT = "s"             # the spike output of a continuous-time spec
REFRACTORY_STATE = "refractory"  # the steps a continuous-time neuron stays refractory
RESERVED_NAMES = frozenset({"pi", "tl", "triton", "libdevice", "torch", "math", "range", "float", *DSL_FUNCTIONS})
DEFAULT_SURROGATE = "sigmoid"
MAX_STEP_LINES = 1000
MAX_NEURON_NAME = 64  # the neuron's name is part of file and module names (build/NAME_torch.py, the cache)
MAX_NAME = 128  # any other name
# Attributes of the runtime module (a FlexSN, an nn.Module): every parameter becomes an
# attribute too, so it may not take one of these names (tests compare this with the real classes).
MODULE_ATTRIBUTES = frozenset({
    "T_destination", "add_module", "apply", "backend", "bfloat16", "buffers", "call_super_init", "children",
    "compile", "cpu", "cuda", "detach", "double", "dump_patches", "eval", "extra_repr", "float", "forward",
    "get_buffer", "get_extra_state", "get_parameter", "get_submodule", "half", "info", "ipu", "keep_states",
    "load_state_dict",
    "modules", "mtia", "named_buffers", "named_children", "named_modules", "named_parameters", "parameter_texts",
    "parameters", "recompute",
    "register_backward_hook", "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook", "register_load_state_dict_post_hook",
    "register_load_state_dict_pre_hook", "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "reset", "set_extra_state", "set_submodule",
    "share_memory", "spec", "specialize", "starting_states", "state_dict", "state_seqs", "states", "step_mode", "store_state_seqs", "to",
    "to_empty", "train", "training", "type", "xpu", "zero_grad",
})
# Modules a neuron's name may not shadow: `flexsn-dsl build` writes NAME.py and NAME_torch.py, which
# an import of the same name would pick up when run from the output folder.
SHADOWED_MODULES = frozenset({
    *sys.stdlib_module_names, *sys.builtin_module_names, "flexsn_dsl", "torch", "triton", "numpy", "sympy",
    "mpmath", "yaml", "pluggy", "pytest", "pip", "setuptools", "sitecustomize", "usercustomize",
})
MAX_SPEC_TERMS = 20_000  # syntax-tree nodes over all expressions of a spec (bounds the time sympy takes)
SIZE_NAME = re.compile(r"[A-Z][A-Za-z0-9_]*")  # a size in `shape`: C, N, H_out
MAX_REFRACTORY_STEPS = 2 ** 24  # a refractory period counts whole steps in a float32 counter: exact up to 2**24
DT_HINT = "write dt: 0.5 (a number of time units, not learnable)"
CANONICAL_LOOP_HINT = ("write the comparison (of min, max, clip, relu or where) another way, e.g. with each side a step line "
                       "of its own (m: tanh(a) - h, then min(m, n))")
