"""Stage 5b: time-parallel kernels for specs whose states are affine in the previous states
(:mod:`flexsn_dsl.parallel`): the same arguments as the sequential variants, named
``<neuron>_scan_<variant>_kernel``, with one more constexpr, ``_TC``, the steps of a tile.

A program takes a block of ``_BLOCK`` neurons and walks T in tiles of ``_TC`` steps, each a
``[_TC, _BLOCK]`` tile. Forward: row r of a tile holds the affine map of step t - 1
(``s -> A s + b``, its coefficients printed from the IR; row 0 the identity), so that the
inclusive ``tl.associative_scan`` of these maps along the rows takes the states before the tile
(the carry) to the states before each row's step. The forward core then computes every row's
outputs, next states and saved values at once, and the last row's next states are the next
tile's carry. Backward (time runs down a tile: row r is step t1 - r): row r holds the adjoint
map of step t + 1, which takes the state gradients after that step to those after step t; its
matrix (A transposed) and offset come from the backward core itself (its results are linear in
the upstream gradients: with unit state gradients and no others it gives a column of A
transposed). After the reverse scan, the backward core gives every row's input and parameter
gradients. The scan reorders the arithmetic: results equal the sequential kernels' to rounding.

Chunks: a call may also split T into chunks of ``_L`` steps, a program for each block of neurons and
chunk (``tl.program_id(1)``), so that few neurons over many steps still fill the GPU. Three launches:
``scan_summary`` composes each chunk's maps into one (entries of A, then b: ``[chunks, rows, N]``),
``scan_carry`` applies them in turn to the initial states (the states before each chunk), then the
kernels above run every chunk from its states. The backward does the same with the adjoint maps, from
the last chunk (``scan_adjoint_summary``, ``scan_adjoint_carry``), but for the tiled backward (a
learnable parameter with a shape), which walks all of T in each program.
"""
from __future__ import annotations

from typing import NamedTuple

from .codegen_triton import Cores, FlexSNInfo, draw_parts
from .literals import identifier
from .names import VARIANTS, kernel_name, scan_variant
from .parallel import Affine
from .printer import TRITON, Printer
from .templates import (BLOCK_SIZES, I1, I2, TILE_SIZES, _backward_names, _head, _if, _initial_states, _load,
                        _param_args, _params_load, _partial_grads, _seed_args, _seed_load, _tile_head)

I3 = I2 + I1


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


def _signature(cores: Cores, variant: str, groups: list[tuple[list[str], str]], flags: str,
               sizes: str = BLOCK_SIZES) -> list[str]:
    lines = ["@triton.jit", f"def {identifier(kernel_name(cores.info.neuron, scan_variant(variant)))}("]
    lines += [f"{I1}{', '.join(args)},  # {comment}" for args, comment in groups if args]
    return lines + [f"{I1}_T, {sizes}{flags},", "):"]  # (the sizes hold the tile of steps, _TC)


class _Layout(NamedTuple):
    """A program's neurons: a block ``[_BLOCK]``, or a tile ``[_ROWS, _COLS]`` of the tiled backward (a
    learnable parameter with a shape); a tile of steps adds a leading axis of ``_TC`` steps."""

    shape: str   # the neurons' shape
    each: str    # indexes a value of the neurons' shape for each step: [None, :]
    step: str    # indexes a step's value for each neuron: [:, None]


BLOCK = _Layout("[_BLOCK]", "[None, :]", "[:, None]")
TILED = _Layout("[_ROWS, _COLS]", "[None, :, :]", "[:, None, None]")


def _steps_head(layout: _Layout) -> list[str]:
    """``_tt``: the rows of a tile of steps; ``_first`` its first row; ``_zero`` a tile of zeros."""
    return [f"{I1}_tt = tl.arange(0, _TC)",
            f"{I1}_first = _tt{layout.step} == 0",
            f"{I1}_zero = tl.zeros([_TC, {layout.shape[1:-1]}], dtype=_DTYPE)"]


def _tile_load(ptr: str, mask: str) -> str:
    return f"tl.load({ptr}, mask={mask}, other=0.0).to(_DTYPE)"


def _tile_store(ptr: str, value: str) -> str:
    return f"tl.store({ptr} + _at, {value}.to({ptr}.dtype.element_ty), mask=_here)"


def _tile_draws(info: FlexSNInfo, names, steps: str, layout: _Layout) -> list[str]:
    """The draws among ``names`` of the step ``steps`` of each row (``[_TC]``; a row before the first step,
    which no result reads, draws at step 0), the numbers the sequential kernels draw (each element's lane
    of its Philox call: :func:`flexsn_dsl.templates._draws`)."""
    lines = []
    lanes = f"_lanes{layout.each}"
    for name in names:
        if name in info.draws:
            kind, k = draw_parts(name)
            lines += [f"{I2}_d0, _d1, _d2, _d3 = tl.{kind}4x(_seed_value, ((_step0 + tl.maximum({steps}, 0)){layout.step}"
                      f" * {info.draw_count} + {k}) * _calls + _groups{layout.each})",
                      f"{I2}{name} = tl.where({lanes} == 0, _d0, tl.where({lanes} == 1, _d1, tl.where({lanes} == 2, "
                      f"_d2, _d3))).to(_DTYPE)"]
    return lines


def _carry(target: str, rows: str) -> str:
    """The last step's row of ``rows`` (a tile of steps) as the carry ``target`` (the neurons' shape)."""
    return f"{target} = tl.sum(tl.where(_last, {rows}, 0.0), axis=0).to(_DTYPE)"


CHUNKS = (["_starts", "_L"], "chunks of _L steps; the states before each [chunks, K, N] (read from the second on)")


def _chunk_head(targets: list[str], starts_where: str) -> list[str]:
    """This program's chunk of steps, ``[_cs, _ce)``, and where ``starts_where`` holds, ``targets`` (the
    states, or the state gradients, at the chunk's boundary) read from ``_starts``."""
    lines = [f"{I1}_chunk = tl.program_id(1)", f"{I1}_cs = _chunk * _L", f"{I1}_ce = _cs + tl.minimum(_L, _T - _cs)"]
    if targets:
        lines += [f"{I1}if {starts_where}:  # (scan_carry wrote them)"]
        lines += [f"{I2}{n} = tl.load(_starts + tl.cast(_chunk * {len(targets)} + {i}, tl.int64) * _N + _offs, "
                  f"mask=_mask, other=0.0).to(_DTYPE)" for i, n in enumerate(targets)]
    return lines


def _map_rows(info: FlexSNInfo, affine: Affine, p: Printer, shifted: bool) -> list[str]:
    """Each row's affine map ``_a``, ``_b`` and their inclusive scan ``_A``, ``_B``: with ``shifted``, row r
    holds the map of step t - 1 (row 0: the identity); else the map of its own step t."""
    used = set().union(*(affine.matrix[i][j].free_symbols for i, j in affine.pattern),
                       *(b.free_symbols for b in affine.offset))
    at, mask, steps = ("_at - _N", "(_tt[:, None] > 0) & _here", "_steps - 1") if shifted else \
        ("_at", "_here", "_steps")
    lines = [f"{I2}{n} = {_tile_load(f'{n}__in + {at}', mask)}"
             for n in info.input_names if any(s.name == n for s in used)]
    lines += _tile_draws(info, [s.name for s in sorted(used, key=lambda s: s.name)], steps, BLOCK)
    for i, j in affine.pattern:
        value = f"_zero + ({p(affine.matrix[i][j])})"
        identity = 1.0 if i == j else 0.0
        lines.append(f"{I2}_a{i}_{j} = " + (f"tl.where(_first, {identity}, {value})" if shifted else value))
    for i in range(len(affine.offset)):
        value = f"_zero + ({p(affine.offset[i])})"
        lines.append(f"{I2}_b{i} = " + (f"tl.where(_first, 0.0, {value})" if shifted else value))
    return lines + [_scan_line(affine.pattern, len(affine.offset), "a", "b", "A", "B", "_compose")]


def _scan_line(pattern, k: int, a: str, b: str, A: str, B: str, combine: str) -> str:
    entries = [f"{i}_{j}" for i, j in pattern]
    return (f"{I2}{', '.join(f'_{A}{e}' for e in entries)}, {', '.join(f'_{B}{i}' for i in range(k))}, = "
            f"tl.associative_scan(({', '.join(f'_{a}{e}' for e in entries)}, "
            f"{', '.join(f'_{b}{i}' for i in range(k))},), 0, {combine})")


def _forward_kernel(cores: Cores, affine: Affine, variant: str, p: Printer) -> str:
    """``p`` prints the coefficients (and records the helpers they call)."""
    info = cores.info
    training = variant.startswith("forward")
    state_seqs = variant in ("inference", "forward")
    states = list(info.state_names)
    before, after = [f"{n}__before" for n in states], [f"{n}__after" for n in states]
    inputs = [f"{n}__in" for n in info.input_names]
    written = [f"{n}__out" for n in info.output_names]
    written += [f"{n}__saved" for n in info.saved_names] if training else []
    written += [f"{n}__states" for n in states] if state_seqs else []
    n_out = info.num_outputs
    recipients = list(info.fwd_core_recipients[:n_out]) + after + \
        ([f"{n}__saved_t" for n in info.saved_names] if training else ["_"] * len(info.saved_names))
    call_args = list(info.input_names) + before + list(info.param_names) + list(info.fixed_names) + list(info.draws)
    output_vars = [after[states.index(v)] if v in states else v for v in info.output_vars]
    lines = _signature(cores, variant, [
        (inputs + [f"{n}__init" for n in states], "inputs [T, N], initial states [N]"),
        (written + [f"{n}__final" for n in states], "written"),
        CHUNKS,
        _param_args(info),
        _seed_args(info),
    ], ", _CONST_INIT: tl.constexpr" if info.initial_values else "")
    lines += [f'{I1}"""{variant.replace("_", " ")} of {info.neuron} over _T steps for one block of neurons and '
              f'one chunk of steps, time-parallel: a scan over tiles of _TC steps."""']
    lines += _head() + _params_load(info) + _seed_load(info, "_N", False) + _initial_states(info, "[_BLOCK]")
    lines += _chunk_head(states, "_chunk > 0") + _steps_head(BLOCK)
    lines += [f"{I1}for _t0 in tl.range(_cs, _ce, _TC):",
              f"{I2}_steps = _t0 + _tt",
              f"{I2}_here = (_steps[:, None] < _ce) & _mask[None, :]",
              f"{I2}_at = tl.cast(_steps, tl.int64)[:, None] * _N + _offs[None, :]",
              f"{I2}# row r: the map of step t - 1 (row 0: the identity), from the inputs of that step"]
    lines += _map_rows(info, affine, p, shifted=True)
    k = len(states)
    lines += [f"{I2}# the states before each row's step, then the step itself"]
    for i, name in enumerate(before):
        terms = [f"_A{i}_{j} * {states[j]}[None, :]" for j in range(k) if (i, j) in affine.pattern]
        lines.append(f"{I2}{name} = {' + '.join(terms)} + _B{i}")
    lines += [f"{I2}{n} = {_tile_load(f'{n}__in + _at', '_here')}" for n in info.input_names]
    lines += _tile_draws(info, info.draws, "_steps", BLOCK)
    lines += [f"{I2}{', '.join(recipients)} = {cores.forward_name}({', '.join(call_args)})"]
    lines += [f"{I2}{_tile_store(f'{n}__out', v)}" for n, v in zip(info.output_names, output_vars)]
    if training:
        lines += [f"{I2}{_tile_store(f'{n}__saved', f'{n}__saved_t')}" for n in info.saved_names]
    if state_seqs:
        lines += [f"{I2}{_tile_store(f'{n}__states', a)}" for n, a in zip(states, after)]
    lines += [f"{I2}_last = _tt[:, None] == tl.minimum(_ce - _t0, _TC) - 1"]
    lines += [f"{I2}{_carry(n, a)}" for n, a in zip(states, after)]
    lines += [f"{I1}if _ce == _T:  # (the last chunk)"]
    lines += [f"{I2}tl.store({n}__final + _offs, {n}.to({n}__final.dtype.element_ty), mask=_mask)" for n in states]
    return "\n".join(lines) + "\n"


def _summary_start(info: FlexSNInfo, pattern: tuple[tuple[int, int], ...], k: int) -> list[str]:
    """A summary kernel's block, parameters, seed, chunk and tile of steps, then the chunk's map so far, ``_S``
    (entries of the matrix) and ``_Sb`` (the offset): the identity."""
    lines = _head() + _params_load(info) + _seed_load(info, "_N", False) + _chunk_head([], "") + _steps_head(BLOCK)
    return lines + [f"{I1}_S{i}_{j} = tl.full([_BLOCK], {1.0 if i == j else 0.0}, _DTYPE)" for i, j in pattern] + \
        [f"{I1}_Sb{i} = tl.zeros([_BLOCK], dtype=_DTYPE)" for i in range(k)]


def _summary_end(pattern: tuple[tuple[int, int], ...], k: int, A: str, B: str, combine: str) -> list[str]:
    """The tile's map (the last row of the scan ``_A``, ``_B``) after the chunk's map so far, in the loop; after
    it, the chunk's map into ``_maps`` [chunks, rows, N] (entries of the matrix, then the offset)."""
    entries = [f"{i}_{j}" for i, j in pattern]
    lines = [f"{I2}_tile{e} = tl.sum(tl.where(_last, _{A}{e}, 0.0), axis=0)" for e in entries]
    lines += [f"{I2}_tileb{i} = tl.sum(tl.where(_last, _{B}{i}, 0.0), axis=0)" for i in range(k)]
    total = [f"_S{e}" for e in entries] + [f"_Sb{i}" for i in range(k)]
    tile = [f"_tile{e}" for e in entries] + [f"_tileb{i}" for i in range(k)]
    lines += [f"{I2}{', '.join(total)}, = {combine}({', '.join(total + tile)})"]
    return lines + [f"{I1}tl.store(_maps + tl.cast(_chunk * {len(total)} + {r}, tl.int64) * _N + _offs, {v}, "
                    f"mask=_mask)" for r, v in enumerate(total)]


def _summary_kernel(cores: Cores, affine: Affine, p: Printer) -> str:
    """Each chunk's steps composed into one affine map: tiles of steps scanned, each tile's map after
    the ones before it."""
    info = cores.info
    k = len(info.state_names)
    lines = _signature(cores, "summary", [
        ([f"{n}__in" for n in info.input_names], "inputs [T, N]"),
        (["_maps", "_L"], "written: the map of each chunk of _L steps [chunks, rows, N] (entries of A, then b)"),
        _param_args(info),
        _seed_args(info),
    ], "")
    lines += [f'{I1}"""The map of a chunk of steps of {info.neuron} (the states before it to those after it), '
              f'for one block of neurons."""']
    lines += _summary_start(info, affine.pattern, k)
    lines += [f"{I1}for _t0 in tl.range(_cs, _ce, _TC):",
              f"{I2}_steps = _t0 + _tt",
              f"{I2}_here = (_steps[:, None] < _ce) & _mask[None, :]",
              f"{I2}_at = tl.cast(_steps, tl.int64)[:, None] * _N + _offs[None, :]",
              f"{I2}# row r: the map of its step; the scan's last row, the tile's"]
    lines += _map_rows(info, affine, p, shifted=False)
    lines += [f"{I2}_last = _tt[:, None] == tl.minimum(_ce - _t0, _TC) - 1"]
    return "\n".join(lines + _summary_end(affine.pattern, k, "A", "B", "_compose")) + "\n"


def _carry_kernel(cores: Cores, pattern: tuple[tuple[int, int], ...], adjoint: bool) -> str:
    """The states before each chunk (``adjoint``: the state gradients after each, from the last chunk back):
    the chunks' maps applied in turn, one block of neurons a program."""
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
             f"{I1}_N, _BLOCK: tl.constexpr, _DTYPE: tl.constexpr{f', {flag}: tl.constexpr' if flag else ''},", "):"]
    lines += [f'{I1}"""The {what} each chunk of steps of {info.neuron}, for one block of neurons."""']
    lines += _head()
    if adjoint:
        lines += _if("_HAS_FINAL_GRADS", [f"{I1}{n} = {_load(f'{n}__grad_final + _offs')}" for n in states],
                     [f"{I1}{n} = tl.zeros([_BLOCK], dtype=_DTYPE)" for n in states])
        lines += [f"{I1}for _j in tl.range(1, _C):", f"{I2}_c = _C - _j  # the chunk whose map applies; its result, "
                  "the gradients after the chunk before", f"{I2}_to = _c - 1"]
    else:
        lines += _initial_states(info, "[_BLOCK]")
        lines += [f"{I1}for _c in tl.range(0, _C - 1):", f"{I2}_to = _c + 1"]
    rows = len(pattern) + k
    lines += [f"{I2}_row = tl.cast(_c * {rows}, tl.int64) * _N + _offs"]
    for r, (i, j) in enumerate(pattern):
        lines.append(f"{I2}_m{i}_{j} = tl.load(_maps + _row + {r} * _N, mask=_mask, other=0.0)")
    for i in range(k):
        lines.append(f"{I2}_o{i} = tl.load(_maps + _row + {len(pattern) + i} * _N, mask=_mask, other=0.0)")
    new = [" + ".join([f"_m{i}_{j} * {states[j]}" for j in range(k) if (i, j) in pattern] + [f"_o{i}"])
           for i in range(k)]
    lines += [f"{I2}{', '.join(states)}, = {', '.join(f'({e}).to(_DTYPE)' for e in new)},"]
    lines += [f"{I2}tl.store(_starts + tl.cast(_to * {k} + {i}, tl.int64) * _N + _offs, {n}, mask=_mask)"
              for i, n in enumerate(states)]
    return "\n".join(lines) + "\n"


def _adjoint_rows(cores: Cores, affine: Affine, layout: _Layout, shifted: bool) -> list[str]:
    """Each row's adjoint map ``_m``, ``_c`` and their inclusive scan ``_M``, ``_C``: with ``shifted``, row
    r holds the map of step t + 1 (row 0: the identity), else that of its own step t; its offset from
    that step's upstream gradients (outputs, state sequences), its matrix (A transposed) from the
    backward core with a unit gradient of one state after the step and none other."""
    info = cores.info
    _, read_unique, grad_out, _, call_args, _ = _backward_names(info)
    states = list(info.state_names)
    k = len(states)
    at, mask, steps = ("_at + _N", "_later", "_steps + 1") if shifted else ("_at", "_here", "_steps")
    lines = [f"{I2}_later = (_tt{layout.step} > 0) & _here"] if shifted else []
    lines += [f"{I2}{r}_t = {_tile_load(f'{r} + {at}', mask)}" for r in grad_out + read_unique]
    lines += [f"{I2}if _HAS_STATE_GRADS:"]
    lines += [f"{I3}{n}__grad_next = {_tile_load(f'{n}__grad_states + {at}', mask)}" for n in states]
    lines += [f"{I2}else:"] + [f"{I3}{n}__grad_next = _zero" for n in states]
    lines += _tile_draws(info, call_args, steps, layout)
    n_in = info.num_inputs
    offset_results = ["_"] * n_in + [f"_c{i}" for i in range(k)] + ["_"] * len(info.param_names)
    lines += [f"{I2}{', '.join(offset_results)} = {cores.backward_name}({', '.join(call_args)})"]
    adjoint = _transposed(affine.pattern)  # M = A transposed: M[i][j] = A[j][i]
    seeds_at = call_args.index(f"{states[0]}__grad_next")  # the state gradients, after the outputs' ones
    for j in range(k):  # column j of M: the backward with a unit gradient of state j after the step, no other
        args = list(call_args)
        args[seeds_at - info.num_outputs:seeds_at] = ["_zero"] * info.num_outputs
        args[seeds_at:seeds_at + k] = ["_zero + 1.0" if m == j else "_zero" for m in range(k)]
        column = ["_"] * n_in + [f"_m{i}_{j}" if (i, j) in adjoint else "_" for i in range(k)] + \
            ["_"] * len(info.param_names)
        lines += [f"{I2}{', '.join(column)} = {cores.backward_name}({', '.join(args)})"]
    if shifted:
        lines += [f"{I2}_m{i}_{j} = tl.where(_first, {1.0 if i == j else 0.0}, _m{i}_{j})" for i, j in adjoint]
        lines += [f"{I2}_c{i} = tl.where(_first, 0.0, _c{i})" for i in range(k)]
    return lines + [_scan_line(adjoint, k, "m", "c", "M", "C", "_compose_adjoint")]


def _reverse_loop(layout: _Layout) -> list[str]:
    """Tiles of steps from the chunk's last step down (row r: step _ce - 1 - _t1 - r)."""
    return [f"{I1}for _t1 in tl.range(0, _ce - _cs, _TC):",
            f"{I2}_steps = _ce - 1 - _t1 - _tt  # time runs down the tile",
            f"{I2}_here = (_steps{layout.step} >= _cs) & _mask{layout.each}",
            f"{I2}_at = tl.cast(_steps, tl.int64){layout.step} * _N + _offs{layout.each}"]


def _adjoint_summary_kernel(cores: Cores, affine: Affine) -> str:
    """Each chunk's adjoint maps composed into one, from its last step down (the state gradients after
    the chunk to those before it)."""
    info = cores.info
    kept, _, grad_out, _, _, _ = _backward_names(info)
    states = list(info.state_names)
    k = len(states)
    adjoint = _transposed(affine.pattern)
    lines = _signature(cores, "adjoint_summary", [
        (grad_out + [f"{n}__grad_states" for n in states], "upstream gradients"),
        (kept, "what the forward kept"),
        (["_maps", "_L"], "written: the adjoint map of each chunk of _L steps [chunks, rows, N]"),
        _param_args(info),
        _seed_args(info),
    ], ", _HAS_STATE_GRADS: tl.constexpr")
    lines += [f'{I1}"""The adjoint map of a chunk of steps of {info.neuron} (the state gradients after it to '
              f'those before it), for one block of neurons."""']
    lines += _summary_start(info, adjoint, k)
    lines += _reverse_loop(BLOCK) + [f"{I2}# row r: the adjoint map of its step; the scan's last row, the tile's"]
    lines += _adjoint_rows(cores, affine, BLOCK, shifted=False)
    lines += [f"{I2}_last = _tt[:, None] == tl.minimum(_ce - _cs - _t1, _TC) - 1"]
    return "\n".join(lines + _summary_end(adjoint, k, "M", "C", "_compose_adjoint")) + "\n"


def _backward_kernel(cores: Cores, affine: Affine) -> str:
    """With a learnable parameter with a shape, a program takes a tile of the step seen as rows of
    ``_P`` neurons, walks all of T and sums the parameter gradients as the sequential tiled backward
    does; else a block of neurons and one chunk of steps."""
    info = cores.info
    kept, read_unique, grad_out, grad_in, call_args, results = _backward_names(info)
    states = list(info.state_names)
    k = len(states)
    tiled = bool(info.learnable_shaped)
    layout = TILED if tiled else BLOCK
    grads = ["_params_grad"] if info.scalar_params else []
    grads += [f"{n}__{x}" for n in info.learnable_shaped for x in ("grad", "split")]
    lines = _signature(cores, "backward", [
        (grad_out + [f"{n}__grad_states" for n in states] + [f"{n}__grad_final" for n in states],
         "upstream gradients"),
        (kept, "what the forward kept"),
        (grad_in + [f"{n}__grad_init" for n in states], "written"),
        CHUNKS if not tiled else ([], ""),
        _param_args(info),
        (grads, "partial parameter gradients: scalars [programs, P]; shaped [row tiles, segments, split]"
         if tiled else "partial parameter gradients [programs, P]"),
        _seed_args(info),
    ], ", _HAS_STATE_GRADS: tl.constexpr, _HAS_FINAL_GRADS: tl.constexpr, _WRITE_INIT_GRADS: tl.constexpr",
        TILE_SIZES if tiled else BLOCK_SIZES)
    lines += [f'{I1}"""Backward of {info.neuron}, time-parallel: tiles of _TC steps from the last, a reverse scan '
              f'of the adjoint maps in each."""']
    lines += (_tile_head() if tiled else _head()) + _params_load(info, tiled) + _seed_load(info, "_N", False)
    lines += _if("_HAS_FINAL_GRADS", [f"{I1}{n}__grad_acc = tl.load({n}__grad_final + _offs, mask=_mask, "
                                      f"other=0.0).to(_DTYPE)" for n in states],
                 [f"{I1}{n}__grad_acc = tl.zeros({layout.shape}, dtype=_DTYPE)" for n in states])
    lines += [f"{I1}_cs = 0", f"{I1}_ce = _T"] if tiled else \
        _chunk_head([f"{n}__grad_acc" for n in states], "_chunk < tl.num_programs(1) - 1")
    lines += [f"{I1}{n}__grad_sum = tl.zeros({layout.shape}, dtype=_DTYPE)" for n in info.param_names]
    lines += _steps_head(layout) + _reverse_loop(layout)
    lines += [f"{I2}# row r: the adjoint map of step t + 1 (row 0: the identity)"]
    lines += _adjoint_rows(cores, affine, layout, shifted=True)
    adjoint = _transposed(affine.pattern)
    lines += [f"{I2}# each row's state gradients after its step, then the step's backward"]
    for i, n in enumerate(states):
        terms = [f"_M{i}_{j} * {states[j]}__grad_acc{layout.each}" for j in range(k) if (i, j) in adjoint]
        lines.append(f"{I2}{n}__grad_next = {' + '.join(terms)} + _C{i}")
    lines += [f"{I2}if _HAS_STATE_GRADS:"]
    lines += [f"{I3}{n}__grad_next += {_tile_load(f'{n}__grad_states + _at', '_here')}" for n in states]
    lines += [f"{I2}{r}_t = {_tile_load(f'{r} + _at', '_here')}" for r in grad_out + read_unique]
    lines += _tile_draws(info, call_args, "_steps", layout)
    before = [r.replace("__grad_acc", "__grad_before") for r in results]
    lines += [f"{I2}{', '.join(before)} = {cores.backward_name}({', '.join(call_args)})"]
    lines += [f"{I2}{_tile_store(f'{n}__grad_in', f'{n}__grad_in_t')}" for n in info.input_names]
    lines += [f"{I2}{n}__grad_sum += tl.sum(tl.where(_here, {n}__grad_t, 0.0), axis=0)" for n in info.param_names]
    lines += [f"{I2}_last = _tt{layout.step} == tl.minimum(_ce - _cs - _t1, _TC) - 1"]
    lines += [f"{I2}{_carry(f'{n}__grad_acc', f'{n}__grad_before')}" for n in states]
    lines += _if("_WRITE_INIT_GRADS", [f"{I1}if _cs == 0:  # (the first chunk)"] + [
        f"{I2}tl.store({n}__grad_init + _offs, {n}__grad_acc.to({n}__grad_init.dtype.element_ty), mask=_mask)"
        for n in states])
    lines += _partial_grads(info, tiled, chunked=not tiled)  # (as the sequential backward)
    return "\n".join(lines) + "\n"


def scan_source(cores: Cores, affine: Affine) -> str:
    """The time-parallel kernels of a spec with this affine step, and their combine functions (appended
    to the module of :func:`flexsn_dsl.templates.module_source`)."""
    k = len(cores.info.state_names)
    parts = [_compose_source("_compose", affine.pattern, k, "Combine of the forward scan"),
             _compose_source("_compose_adjoint", _transposed(affine.pattern), k,
                             "Combine of the backward (adjoint) scan")]
    printer = Printer(TRITON)
    parts += [_forward_kernel(cores, affine, v, printer) for v in VARIANTS if v != "backward"]
    parts.append(_backward_kernel(cores, affine))
    parts += [_summary_kernel(cores, affine, printer), _carry_kernel(cores, affine.pattern, adjoint=False)]
    if not cores.info.learnable_shaped:  # (the tiled backward walks all of T)
        parts += [_adjoint_summary_kernel(cores, affine), _carry_kernel(cores, _transposed(affine.pattern), True)]
    helpers = _missing_helpers(printer, cores.source)
    return (helpers.rstrip("\n") + "\n\n\n" if helpers else "") + "\n\n".join(parts)


def _missing_helpers(printer: Printer, source: str) -> str:
    """The helpers that the text ``printer`` printed calls and ``source`` (the cores) does not define."""
    missing = Printer(TRITON)
    missing.helpers = {h for h in printer.helpers if f"def {h if isinstance(h, str) else f'_pow_{h}'}(" not in source}
    return missing.helper_source()

