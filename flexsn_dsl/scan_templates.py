"""Stage 5b: time-parallel kernels for specs whose states are affine in the previous states
(:mod:`flexsn_dsl.parallel`): a call splits T into chunks of ``_L`` steps, and a program takes a
block of neurons and one chunk (``tl.program_id(1)``), so that few neurons over many steps still
fill the GPU. Three launches a direction:

  scan_summary          each chunk's steps composed into one affine map ``s -> A s + b`` (its
                        coefficients printed from the IR), written ``[chunks, rows, N]``: the
                        entries of A, then b
  scan_carry            the maps applied in turn to the initial states: the states before each chunk
  scan_<variant>        the sequential kernel's steps over one chunk, from the states before it
                        (:func:`flexsn_dsl.templates._forward_kernel` with ``chunked``), named
                        ``<neuron>_scan_<variant>_kernel``, with the sequential variant's arguments
                        and ``_starts``, ``_L``

The backward does the same from the last chunk with the adjoint maps (``scan_adjoint_summary``,
``scan_adjoint_carry``, then ``scan_backward``: the state gradients after each chunk, then the
sequential backward over each chunk). An adjoint map takes the state gradients after a step to those
before it; its matrix (A transposed) and offset come from the backward core itself (its results are
linear in the upstream gradients: with a unit gradient of one state after the step and no other, it
gives a column of A transposed). A spec with a learnable parameter with a shape keeps the sequential
(tiled) backward, which walks all of T in each program. With one chunk, a call is the sequential
kernels' arithmetic; with several, the states at the chunks' boundaries come from the composed maps,
which reorder it: results equal the sequential kernels' to rounding. Each walk through a chunk is a
sequential time loop (:func:`flexsn_dsl.templates._time_loops`: tiles of ``_TC`` steps).
"""
from __future__ import annotations

from .codegen_triton import Cores, FlexSNInfo
from .literals import identifier
from .names import VARIANTS, kernel_name
from .parallel import Affine
from .printer import TRITON, Printer
from .templates import (I1, I2, _backward_kernel, _backward_names, _backward_reads, _chunk_head, _draws,
                        _forward_kernel, _head, _if, _initial_states, _load, _param_args, _params_load, _Read,
                        _seed_args, _seed_load, _signature, _time_loops)


def _compose_source(name: str, pattern: tuple[tuple[int, int], ...], k: int, what: str) -> str:
    """The combine of a scan of affine maps ``s -> A s + b`` over ``k`` states whose matrices have
    nonzero entries only at ``pattern`` (closed under products): the later map after the earlier one."""
    entries = [f"{i}_{j}" for i, j in pattern]
    earlier = [f"a{e}" for e in entries] + [f"b{i}" for i in range(k)]
    later = [f"c{e}" for e in entries] + [f"d{i}" for i in range(k)]
    at = set(pattern)
    products = [" + ".join(f"c{i}_{m} * a{m}_{j}" for m in range(k) if (i, m) in at and (m, j) in at)
                for i, j in pattern]
    offsets = [" + ".join([f"c{i}_{m} * b{m}" for m in range(k) if (i, m) in at] + [f"d{i}"]) for i in range(k)]
    return "\n".join(["@triton.jit", f"def {name}({', '.join(earlier + later)}):",
                      f'{I1}"""{what}: (c, d) after (a, b), as s -> c (a s + b) + d."""',
                      f"{I1}return {', '.join(products + offsets)}"]) + "\n"


def _transposed(pattern: tuple[tuple[int, int], ...]) -> tuple[tuple[int, int], ...]:
    return tuple(sorted((j, i) for i, j in pattern))


def _summary_start(info: FlexSNInfo, pattern: tuple[tuple[int, int], ...], k: int, chunk: str) -> list[str]:
    """A summary kernel's block, parameters, seed and chunk (``chunk``: its index), then the chunk's map so far,
    ``_S`` (entries of the matrix) and ``_Sb`` (the offset): the identity."""
    lines = _head() + _params_load(info) + _seed_load(info, "_N", True) + _chunk_head([], "", chunk)
    lines += [f"{I1}_zero = tl.zeros([_BLOCK], dtype=_DTYPE)"]
    return lines + [f"{I1}_S{i}_{j} = tl.full([_BLOCK], {1.0 if i == j else 0.0}, _DTYPE)" for i, j in pattern] + \
        [f"{I1}_Sb{i} = tl.zeros([_BLOCK], dtype=_DTYPE)" for i in range(k)]


def _map_names(pattern: tuple[tuple[int, int], ...], k: int, a: str, b: str) -> list[str]:
    """An affine map's variables: ``a`` + each entry of the matrix, then ``b`` + each row of the offset."""
    return [f"{a}{i}_{j}" for i, j in pattern] + [f"{b}{i}" for i in range(k)]


def _summary_step(pattern: tuple[tuple[int, int], ...], k: int, a: str, b: str, combine: str) -> str:
    """The step's map (``a``, ``b``) after the chunk's map so far."""
    total = _map_names(pattern, k, "_S", "_Sb")
    return f"{', '.join(total)}, = {combine}({', '.join(total + _map_names(pattern, k, a, b))})"


def _summary_end(pattern: tuple[tuple[int, int], ...], k: int) -> list[str]:
    """The chunk's map into ``_maps`` [chunks, rows, N] (entries of the matrix, then the offset)."""
    total = _map_names(pattern, k, "_S", "_Sb")
    return [f"{I1}tl.store(_maps + tl.cast(_chunk * {len(total)} + {r}, tl.int64) * _N + _offs, {v}, mask=_mask)"
            for r, v in enumerate(total)]


def _summary_kernel(cores: Cores, affine: Affine, p: Printer) -> str:
    """Each chunk's steps composed into one affine map, step after step (``p`` prints the coefficients and
    records the helpers they call)."""
    info = cores.info
    k = len(info.state_names)
    used = {s.name for s in set().union(*(affine.matrix[i][j].free_symbols for i, j in affine.pattern),
                                        *(b.free_symbols for b in affine.offset))}
    inputs = [n for n in info.input_names if n in used]
    draws = [d for d in info.draws if d in used]
    lines = _signature(info, "scan_summary", [
        ([f"{n}__in" for n in info.input_names], "inputs [T, N]"),
        (["_maps", "_L"], "written: the map of each chunk of _L steps [chunks, rows, N] (entries of A, then b)"),
        _param_args(info),
        _seed_args(info),
    ], "")
    lines += [f'{I1}"""The map of a chunk of steps of {info.neuron} (the states before it to those after it), '
              f'for one block of neurons."""']
    lines += _summary_start(info, affine.pattern, k, "tl.program_id(1)")  # (launched for all chunks but the last)
    lines += [f"{I1}{n}__in_ptr = {n}__in + tl.cast(_cs, tl.int64) * _N + _offs" for n in inputs]
    step = _draws(info, draws, "_cs + _s", True)
    step += [f"_a{i}_{j} = _zero + ({p(affine.matrix[i][j])})" for i, j in affine.pattern]
    step += [f"_b{i} = _zero + ({p(b)})" for i, b in enumerate(affine.offset)]
    step += [_summary_step(affine.pattern, k, "_a", "_b", "_compose")]
    lines += _time_loops([_Read(n, f"{n}__in") for n in inputs], step, "+=", bool(draws), length="_len")
    return "\n".join(lines + _summary_end(affine.pattern, k)) + "\n"


def _carry_kernel(cores: Cores, pattern: tuple[tuple[int, int], ...], adjoint: bool) -> str:
    """The states before each chunk (``adjoint``: the state gradients after each, from the last chunk back):
    the chunks' maps applied in turn, one block of neurons a program, in groups of ``_CP`` chunks: a group's
    maps are read at once as ``[_CP, _BLOCK]`` tiles and composed by a scan along the chunks (the combine of
    the summaries: the maps applied first come first), which the states before the group go through."""
    info = cores.info
    states = list(info.state_names)
    k = len(states)
    name = identifier(kernel_name(info.neuron, "scan_adjoint_carry" if adjoint else "scan_carry"))
    first = [f"{n}__grad_final" for n in states] if adjoint else [f"{n}__init" for n in states]
    flag = "_HAS_FINAL_GRADS" if adjoint else ("_CONST_INIT" if info.initial_values else "")
    what = "state gradients after" if adjoint else "states before"
    lines = ["@triton.jit", f"def {name}(",
             f"{I1}{', '.join(first)},  # " + ("the final states' gradients [N]" if adjoint else "initial states [N]"),
             f"{I1}_maps, _starts, _C,  # each chunk's map [chunks, rows, N]; written: the {what} each [chunks, K, N]",
             f"{I1}_N, _BLOCK: tl.constexpr, _CP: tl.constexpr, _DTYPE: tl.constexpr"
             f"{f', {flag}: tl.constexpr' if flag else ''},", "):"]
    lines += [f'{I1}"""The {what} each chunk of steps of {info.neuron}, for one block of neurons."""']
    lines += _head()
    if adjoint:
        lines += _if("_HAS_FINAL_GRADS", [f"{I1}{n} = {_load(f'{n}__grad_final + _offs')}" for n in states],
                     [f"{I1}{n} = tl.zeros([_BLOCK], dtype=_DTYPE)" for n in states])
    else:
        lines += _initial_states(info, "[_BLOCK]")
    order = "from the last chunk down" if adjoint else "from the first"
    lines += [f"{I1}_cc = tl.arange(0, _CP)",
              f"{I1}for _g in tl.range(0, _C - 1, _CP):  # groups of chunks, {order}",
              f"{I2}_valid = _g + _cc < _C - 1  # the maps that apply: of every chunk but the " +
              ("first" if adjoint else "last"),
              f"{I2}_c = " + ("_C - 1 - _g - _cc" if adjoint else "_g + _cc") + "  # the chunk whose map applies",
              f"{I2}_to = " + ("_c - 1" if adjoint else "_c + 1") + "  # the chunk its result starts",
              f"{I2}_here = _valid[:, None] & _mask[None, :]",
              f"{I2}_row = tl.cast(_c * {len(pattern) + k}, tl.int64)[:, None] * _N + _offs[None, :]"]
    maps = _map_names(pattern, k, "_m", "_o")  # (a row of _maps each, in order)
    lines += [f"{I2}{m} = tl.load(_maps + _row + {r} * _N, mask=_here, other=0.0).to(_DTYPE)" for r, m in enumerate(maps)]
    combine = "_compose_adjoint" if adjoint else "_compose"
    lines += [f"{I2}{', '.join(_map_names(pattern, k, '_A', '_B'))}, = "
              f"tl.associative_scan(({', '.join(maps)},), 0, {combine})"]
    for i, n in enumerate(states):
        terms = [f"_A{i}_{j} * {states[j]}[None, :]" for j in range(k) if (i, j) in pattern]
        lines += [f"{I2}{n}__to = {' + '.join(terms)} + _B{i}",
                  f"{I2}tl.store(_starts + tl.cast(_to * {k} + {i}, tl.int64)[:, None] * _N + _offs[None, :], "
                  f"{n}__to, mask=_here)"]
    lines += [f"{I2}_last = (_cc == tl.minimum(_C - 1 - _g, _CP) - 1)[:, None]  # the group's last map"]
    lines += [f"{I2}{n} = tl.sum(tl.where(_last, {n}__to, 0.0), axis=0).to(_DTYPE)" for n in states]
    return "\n".join(lines) + "\n"


def _adjoint_summary_kernel(cores: Cores, affine: Affine) -> str:
    """Each chunk's adjoint maps composed into one, from its last step down (the state gradients after
    the chunk to those before it). A step's offset comes from the backward core with the step's upstream
    gradients (outputs, state sequences), its matrix (A transposed) from the core with a unit gradient of
    one state after the step and none other, a column a call."""
    info = cores.info
    kept, read_unique, grad_out, _, call_args, _ = _backward_names(info)
    states = list(info.state_names)
    k = len(states)
    adjoint = _transposed(affine.pattern)
    grad_states = [f"{n}__grad_states" for n in states]
    lines = _signature(info, "scan_adjoint_summary", [
        (grad_out + grad_states, "upstream gradients"),
        (kept, "what the forward kept"),
        (["_maps", "_L"], "written: the adjoint map of each chunk of _L steps [chunks, rows, N]"),
        _param_args(info),
        _seed_args(info),
    ], ", _HAS_STATE_GRADS: tl.constexpr")
    lines += [f'{I1}"""The adjoint map of a chunk of steps of {info.neuron} (the state gradients after it to '
              f'those before it), for one block of neurons."""']
    lines += _summary_start(info, adjoint, k, "tl.program_id(1) + 1")  # (launched for all chunks but the first)
    lines += [f"{I1}{p}_ptr = {p} + tl.cast(_ce - 1, tl.int64) * _N + _offs" for p in grad_out + read_unique + grad_states]
    reads = _backward_reads(info, grad_out, read_unique)
    step = ["if _HAS_STATE_GRADS:"] + [f"{I1}{n}__grad_next = {n}__grad_states_t" for n in states]
    step += ["else:"] + [f"{I1}{n}__grad_next = _zero" for n in states]
    step += _draws(info, call_args, "_ce - 1 - _s", True)
    n_in, params = info.num_inputs, ["_"] * len(info.param_names)
    step += [f"{', '.join(['_'] * n_in + [f'_c{i}' for i in range(k)] + params)} = "
             f"{cores.backward_name}({', '.join(call_args)})"]
    seeds_at = call_args.index(f"{states[0]}__grad_next")  # the state gradients, after the outputs' ones
    for j in range(k):  # column j of A transposed: a unit gradient of state j after the step, no other
        args = list(call_args)
        args[seeds_at - info.num_outputs:seeds_at] = ["_zero"] * info.num_outputs
        args[seeds_at:seeds_at + k] = ["_zero + 1.0" if m == j else "_zero" for m in range(k)]
        column = ["_"] * n_in + [f"_m{i}_{j}" if (i, j) in adjoint else "_" for i in range(k)] + params
        step += [f"{', '.join(column)} = {cores.backward_name}({', '.join(args)})"]
    step += [_summary_step(adjoint, k, "_m", "_c", "_compose_adjoint")]
    lines += _time_loops(reads, step, "-=", bool(info.draws), length="_len")
    return "\n".join(lines + _summary_end(adjoint, k)) + "\n"


def scan_source(cores: Cores, affine: Affine) -> str:
    """The time-parallel kernels of a spec with this affine step, and their combine functions (appended
    to the module of :func:`flexsn_dsl.templates.module_source`)."""
    k = len(cores.info.state_names)
    parts = [_compose_source("_compose", affine.pattern, k, "Combine of the forward scan")]
    printer = Printer(TRITON)
    parts += [_forward_kernel(cores, v, chunked=True) for v in VARIANTS if v != "backward"]
    parts += [_summary_kernel(cores, affine, printer), _carry_kernel(cores, affine.pattern, adjoint=False)]
    if not cores.info.learnable_shaped:  # (which keeps the sequential tiled backward)
        parts.insert(1, _compose_source("_compose_adjoint", _transposed(affine.pattern), k,
                                        "Combine of the backward (adjoint) scan"))
        parts += [_backward_kernel(cores, chunked=True), _adjoint_summary_kernel(cores, affine),
                  _carry_kernel(cores, _transposed(affine.pattern), True)]
    helpers = _missing_helpers(printer, cores.source)
    return (helpers.rstrip("\n") + "\n\n\n" if helpers else "") + "\n\n".join(parts)


def _missing_helpers(printer: Printer, source: str) -> str:
    """The helpers that the text ``printer`` printed calls and ``source`` (the cores) does not define."""
    missing = Printer(TRITON)
    missing.helpers = {h for h in printer.helpers if f"def {h if isinstance(h, str) else f'_pow_{h}'}(" not in source}
    return missing.helper_source()

