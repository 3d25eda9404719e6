"""Stage 5: the template engine: single-step cores -> fused multi-step kernels.

Every kernel walks one block of neurons through time with a runtime ``_T`` (a time-parallel kernel:
one chunk of ``_len`` of the steps; a real loop: compile time does not grow with T), plain pointer arithmetic and
masks (no block pointers), and computes in ``_DTYPE`` (float32 for 16-bit and
32-bit storage, float64 for float64).

Time tiles: the block kernels walk time in whole tiles of ``_TC`` steps (a constexpr power of two,
chosen by the runtime from the neurons and steps of a call), then the last ``_T % _TC`` steps one at
a time (all of them when ``_TC`` is 1: a plain loop, pipelined ``_STAGES`` deep). Nothing a step reads
(inputs; backward: upstream gradients and kept values) depends on the recurrence, so each read's tile
is one ``[_TC, _BLOCK]`` load, and the next tile's load is issued before this tile's steps run: two
tiles' loads in flight. ``_tile_rows`` takes a tile apart into its steps in registers (``tl.split``
halves it into neighbouring pairs until single steps are left). Then the steps run in order, storing
each step's results as it goes. Each step does the arithmetic of a step of the loop after the tiles:
every ``_TC`` gives the same bits in the interpreter (compiled, the compiler may contract multiply-adds
differently in the two loops). Few neurons over many steps need tiles to keep the memory busy; with
many neurons the runtime launches ``_TC = 1``. A tile's steps are unrolled, and compile time grows
faster than ``_TC``: the runtime keeps tiles of large steps small. The tiled backward (learnable shaped
parameters, ``[_ROWS, _COLS]`` tiles of the step) loads its tiles as tuples of one load a step instead.

Variants:
  inference              outputs and state sequences
  inference_final_state  outputs and final states
  forward                training: outputs, saved values, state sequences, final states
  forward_final_state    training: outputs, saved values, final states
  backward               time reversed: gradients of inputs, initial states and parameters
  recurrent_forward      specs with `recurrent`: a program owns rows of the batch and all N
  recurrent_backward     features; ``tl.dot`` with the weight (from L2, in chunks) in the time loop

Flags (constexpr, so each setting compiles to its own kernel without dead branches):
``_CONST_INIT`` starts the states from the spec's constant initial values instead of
reading ``<state>__init`` (a fresh or reset module); ``_HAS_FINAL_GRADS`` and
``_HAS_STATE_GRADS`` say which upstream state gradients exist; ``_WRITE_INIT_GRADS``
says whether the initial states need gradients; ``_CARRY_SUMS`` (a backward with learnable
parameters) starts each neuron's running parameter-gradient sums from ``_grad_sums`` [P, N] and
stores them back at the end, so that a backward run over consecutive chunks of steps, last chunk
first, adds the same terms in the same order as one launch over all steps (recompute). The recurrent kernels' ``_PRECISION`` is the
``input_precision`` of their ``tl.dot`` (``"tf32x3"``, ``"ieee"`` or ``"tf32"``, from the runtime).

Draws (``rand()``, ``randn()``): a spec with draws takes ``_seed``, an int64 pair (the call's seed, the
index of its first step). A Philox call (``_rand4x``/``_randn4x``) gives four numbers: element e of
a step takes number e % 4 of the call at counter ``(step · K + k) · calls + e // 4`` (K: the spec's draws,
k: this one's occurrence, calls: ceil(elements / 4); int64), so every element, step, occurrence and call
gets its own number, a block of neurons needs a quarter of the calls, and the backward regenerates the
forward's. The numbers depend only on the seed and the counter, never on the block size, time tiles,
chunks of steps (time-parallel kernels, recompute) or the launch. In ``_DTYPE``: float32 kernels take
``tl.rand4x``/``tl.randn4x``'s numbers (float32 uniforms, Box–Muller in float32); float64 kernels draw
float64 numbers: each uniform takes 53 random bits, the high 32 from ``tl.randint4x``'s words (the
Philox counter ``(offset low, offset high, 0, 0)``) and the low 21 from a second Philox call at
``(offset low, offset high, 1, 0)``, a stream the first never reaches; ``(hi · 2**21 + (lo >> 11)) ·
2**-53`` is exact, in [0, 1). Normals are Box–Muller in float64 on pairs of those (numbers 0, 1 and 2, 3
of a call), with ``log(1 - u)``: never log(0).

Names come from a :class:`FlexSNInfo`, whose fields are checked identifiers and
finite numbers (:mod:`flexsn_dsl.literals`); INFO is printed with ``literals.value``.

Parameters: learnable scalars come packed in ``_params``; a parameter with a shape
comes as ``<name>__param``, its values in the order they broadcast against one step,
read per neuron at ``(offset // <name>__inner) % <name>__size`` (``__inner``: neurons
per value, ``__size``: values), never a full-size copy.

Tiled backward: when a learnable parameter has a shape, the backward sees one step as rows
of ``_P`` neurons (``_P``: the neurons after which every shaped parameter repeats, so a
column has one value of each) and each program takes a tile of ``_ROWS`` rows by ``_COLS``
columns. It sums its gradient over the tile's rows, then over the columns sharing one value
(a segmented scan), into ``<name>__grad`` [row tiles, segments, ``<name>__split``] (a
segment: the ``__inner`` columns sharing one value; split: the column tiles one segment can
span). With every row in one tile, a per-neuron parameter's partial sums are its gradient;
otherwise the runtime sums them: deterministic, no atomics. The recurrent kernels read shaped
parameters the same way (a step's offset is row · N + feature) and write a learnable one's
gradient per element [B, N], summed over the steps, which the runtime reduces to the
parameter's values.
"""
from __future__ import annotations

from typing import NamedTuple

from .codegen_triton import Cores, FlexSNInfo, draw_parts
from .literals import identifier, value
from .names import RECURRENT_VARIANTS, VARIANTS, kernel_name, scan_variant
from .printer import float_literal

HEAVISIDE = '''@triton.jit
def _heaviside(u):
    """spike() forward: 1 where u >= 0, else 0, in u's dtype (the comparison converted: no float32 select in a
    float64 kernel)."""
    return (u >= 0.0).to(u.dtype)
'''
SEGMENTED_ADD = '''@triton.jit
def _segmented_add(a, a_segment, b, b_segment):
    """Combine of a sum within runs of equal (non-decreasing) segment ids."""
    return tl.where(a_segment == b_segment, a + b, b), b_segment
'''
TILES = '''@triton.jit
def _tile_load(ptrs, offs, mask, count):
    """A tile of a block of neurons' values from ``ptrs`` (the tile's first step) and ``offs`` (row k's step,
    [TC, 1], in elements): none if ``count``, the steps left in whole tiles, is 0."""
    return tl.load(ptrs[None, :] + offs, mask=mask[None, :] & (tl.zeros_like(offs) < count), other=0.0)


@triton.jit
def _tile_rows(tile, TC: tl.constexpr, BLOCK: tl.constexpr):
    """The TC rows of a [TC, BLOCK] tile as a tuple of [BLOCK] values, in order: each part (the steps of one
    residue modulo a power of two, in order) split into its even and odd places, the evens first."""
    parts = (tl.trans(tile),)
    for level in tl.static_range(6):
        if (1 << level) < TC:
            evens = ()
            odds = ()
            for j in tl.static_range(1 << level):
                even, odd = tl.split(tl.reshape(parts[j], [BLOCK, TC >> (level + 1), 2]))
                evens += (even,)
                odds += (odd,)
            parts = evens + odds
    rows = ()
    for k in tl.static_range(TC):
        rows += (tl.reshape(parts[k], [BLOCK]),)
    return rows
'''
DRAWS = '''@triton.jit
def _uniform53(hi, lo):
    """A float64 uniform in [0, 1) with 53 random bits: the 32 of ``hi`` over the top 21 of ``lo`` (uint32),
    (hi * 2**21 + (lo >> 11)) * 2**-53, exact."""
    return ((hi.to(tl.uint64) << 21) | (lo >> 11).to(tl.uint64)).to(tl.float64) * 1.1102230246251565e-16


@triton.jit
def _box_muller(u, v):
    """Two independent standard normals from two uniforms in [0, 1), in their dtype (1 - u > 0: no log(0))."""
    r = tl.sqrt(-2.0 * tl.log(1.0 - u))
    angle = 6.283185307179586 * v
    return r * tl.cos(angle), r * tl.sin(angle)


@triton.jit
def _rand4x(seed, offset, dtype: tl.constexpr):
    """The four uniforms in [0, 1) of the Philox call at ``offset`` (int64), in ``dtype``: float32, tl.rand4x's;
    float64, 53 random bits each, the high 32 from tl.randint4x's call (counter: offset's two words, 0, 0) and the
    low 21 from a second call (offset's two words, 1, 0), which the first stream never reaches."""
    if dtype == tl.float64:
        hi0, hi1, hi2, hi3 = tl.randint4x(seed, offset)
        low = offset.to(tl.uint32)
        zero = low * 0
        lo0, lo1, lo2, lo3 = tl.philox(seed, low, (offset >> 32).to(tl.uint32), zero + 1, zero)
        return _uniform53(hi0, lo0), _uniform53(hi1, lo1), _uniform53(hi2, lo2), _uniform53(hi3, lo3)
    else:
        return tl.rand4x(seed, offset)


@triton.jit
def _randn4x(seed, offset, dtype: tl.constexpr):
    """The four standard normals of the Philox call at ``offset``, in ``dtype``: float32, tl.randn4x's; float64,
    Box-Muller in float64 on _rand4x's uniforms 0, 1 and 2, 3."""
    if dtype == tl.float64:
        u0, u1, u2, u3 = _rand4x(seed, offset, dtype)
        n0, n1 = _box_muller(u0, u1)
        n2, n3 = _box_muller(u2, u3)
        return n0, n1, n2, n3
    else:
        return tl.randn4x(seed, offset)
'''
I1, I2 = "    ", "        "


def _params_load(info: FlexSNInfo, tiled: bool = False) -> list[str]:
    """Each runtime parameter's value: a scalar for all neurons, or a shaped parameter's value per neuron
    (in a tile, per column: every row of a column has the same values)."""
    lines = [f"{I1}{name} = tl.load(_params + {k}).to(_DTYPE)" for k, name in enumerate(info.scalar_params)]
    if tiled:
        return lines + [f"{I1}{n} = tl.broadcast_to(tl.load({n}__param + (_cols // {n}__inner) % {n}__size)"
                        f".to(_DTYPE)[None, :], [_ROWS, _COLS])" for n in info.shaped_names]
    return lines + [f"{I1}{n} = tl.load({n}__param + (_offs // {n}__inner) % {n}__size).to(_DTYPE)"
                    for n in info.shaped_names]


def _param_args(info: FlexSNInfo) -> tuple[list[str], str]:
    args = ["_params"] if info.scalar_params else []
    args += [f"{n}__{k}" for n in info.shaped_names for k in ("param", "inner", "size")]
    return args, f"runtime parameters {list(info.param_names + info.fixed_names)}"


def _shaped_grads(info: FlexSNInfo) -> list[str]:
    """Learnable shaped parameters (tiled backward): each column's gradient summed over the tile's rows,
    then each segment's over its columns, stored per (row tile, segment, column tile)."""
    if not info.learnable_shaped:
        return []
    lines = [f"{I1}_cols_last = tl.minimum(tl.program_id(0) * _COLS + _COLS, _P) - 1"]
    for n in info.learnable_shaped:
        lines += [f"{I1}{n}__column = tl.sum({n}__grad_sum, axis=0)",
                  f"{I1}{n}__segment = _cols // {n}__inner",
                  f"{I1}{n}__total, _ = tl.associative_scan(({n}__column, {n}__segment), 0, _segmented_add)",
                  f"{I1}{n}__end = (_cols < _P) & ((((_cols + 1) % {n}__inner) == 0) | (_cols == _cols_last))",
                  f"{I1}tl.store({n}__grad + (tl.program_id(1) * (_P // {n}__inner) + {n}__segment) * {n}__split + "
                  f"tl.program_id(0) - ({n}__segment * {n}__inner) // _COLS, {n}__total, mask={n}__end)"]
    return lines


def _seed_args(info: FlexSNInfo) -> tuple[list[str], str]:
    return ["_seed"] if info.draws else [], "random seed and first step, int64 [2]"


def _seed_load(info: FlexSNInfo, numel: str, flat: bool) -> list[str]:
    """The seed, the first step, and the Philox call of each element (``flat``: a block of _BLOCK neurons, whose
    groups of four are generated once each; else per element, with its lane)."""
    if not info.draws:
        return []
    lines = [f"{I1}_seed_value = tl.load(_seed)", f"{I1}_step0 = tl.load(_seed + 1)",
             f"{I1}_calls = ({numel} + 3) // 4  # Philox calls a step: four numbers each"]
    if flat:
        return lines + [f"{I1}_groups = tl.program_id(0) * (_BLOCK // 4) + tl.arange(0, _BLOCK // 4)"]
    return lines + [f"{I1}_groups = _offs // 4", f"{I1}_lanes = _offs % 4"]


def _draws(info: FlexSNInfo, names, step: str, flat: bool) -> list[str]:
    """This step's draws among ``names`` (``step``: its index after ``_step0``), in ``_DTYPE``, unindented: element e
    takes number e % 4 of the Philox call at counter (step · K + k) · calls + e // 4 (``flat``: the block's calls
    made once each, their four numbers interleaved; else each element's call, its lane picked: the same numbers)."""
    lines = []
    for name in names:
        if name in info.draws:
            kind, k = draw_parts(name)
            lines.append(f"_d0, _d1, _d2, _d3 = _{kind}4x(_seed_value, ((_step0 + {step}) * {info.draw_count} + "
                         f"{k}) * _calls + _groups, _DTYPE)")
            # (join adds its axis last: [i, j, m] = (first if m == 0 else second)[i, j], so numbers 0 1 2 3 in order)
            picked = "tl.reshape(tl.join(tl.join(_d0, _d2), tl.join(_d1, _d3)), [_BLOCK])" if flat else \
                "tl.where(_lanes == 0, _d0, tl.where(_lanes == 1, _d1, tl.where(_lanes == 2, _d2, _d3)))"
            lines.append(f"{name} = {picked}")
    return lines


def _partial_grads(info: FlexSNInfo, tiled: bool, chunked: bool = False) -> list[str]:
    """The end of a backward kernel: one row of scalar partial sums per program, in launch order, then the
    shaped parameters' partial sums (a tiled backward). ``chunked``: blocks of neurons over a second axis
    of chunks of steps (a time-parallel backward)."""
    program = "(tl.program_id(1) * tl.num_programs(0) + tl.program_id(0))" if tiled or chunked else "tl.program_id(0)"
    total = "tl.sum(tl.sum({}, axis=1), axis=0)" if tiled else "tl.sum({}, axis=0)"
    lines = [f"{I1}tl.store(_params_grad + {program} * {info.num_params} + {k}, {total.format(f'{n}__grad_sum')})"
             for k, n in enumerate(info.scalar_params)]
    return lines + _shaped_grads(info)


def _load(ptr: str) -> str:
    return f"tl.load({ptr}, mask=_mask, other=0.0).to(_DTYPE)"


def _store(ptr: str, value: str) -> str:
    target = ptr if ptr.isidentifier() else f"({ptr})"
    return f"tl.store({ptr}, {value}.to({target}.dtype.element_ty), mask=_mask)"


# the size and type arguments after ``_T``: a block of neurons, a tile of the tiled backward, the recurrent kernels
BLOCK_SIZES = "_N, _BLOCK: tl.constexpr, _DTYPE: tl.constexpr, _STAGES: tl.constexpr, _TC: tl.constexpr"
TILE_SIZES = ("_N, _P, _ROWS: tl.constexpr, _COLS: tl.constexpr, _DTYPE: tl.constexpr, _STAGES: tl.constexpr, "
              "_TC: tl.constexpr")
RECURRENT_SIZES = ("_B, _N, _BLOCK_B: tl.constexpr, _NP: tl.constexpr, _BLOCK_K: tl.constexpr, "
                   "_DTYPE: tl.constexpr, _DOT_DTYPE: tl.constexpr, _PRECISION: tl.constexpr")


def _signature(info: FlexSNInfo, name: str, groups: list[tuple[list[str], str]], flags: str,
               sizes: str = BLOCK_SIZES) -> list[str]:
    lines = ["@triton.jit", f"def {identifier(kernel_name(info.neuron, name))}("]
    lines += [f"{I1}{', '.join(args)},  # {comment}" for args, comment in groups if args]
    lines += [f"{I1}_T, {sizes}{flags},", "):"]
    return lines


def _if(flag: str, then: list[str], otherwise: list[str] | None = None) -> list[str]:
    """A constexpr branch at the kernel's top level (nothing when ``then`` is empty)."""
    if not then:
        return []
    lines = [f"{I1}if {flag}:"] + [I1 + line for line in then]
    return lines + ([f"{I1}else:"] + [I1 + line for line in otherwise] if otherwise else [])


def _initial_states(info: FlexSNInfo, shape: str) -> list[str]:
    """The states before step 0, read from ``<state>__init``; a spec with constant initial values
    has ``_CONST_INIT``, which fills them (``shape``: the program's block) instead."""
    loads = [f"{I1}{n} = {_load(f'{n}__init + _offs')}" for n in info.state_names]
    if not info.initial_values:
        return loads
    return _if("_CONST_INIT", [f"{I1}{n} = tl.full({shape}, {float_literal(v)}, _DTYPE)"
                               for n, v in zip(info.state_names, info.initial_values)], loads)


def _head() -> list[str]:
    return [f"{I1}_offs = tl.program_id(0) * _BLOCK + tl.arange(0, _BLOCK)", f"{I1}_mask = _offs < _N"]


def _tile_head() -> list[str]:
    """A tile of _ROWS rows by _COLS columns of the step seen as [_N // _P, _P]."""
    return [f"{I1}_rows = tl.program_id(1) * _ROWS + tl.arange(0, _ROWS)",
            f"{I1}_cols = tl.program_id(0) * _COLS + tl.arange(0, _COLS)",
            f"{I1}_offs = _rows[:, None] * _P + _cols[None, :]",
            f"{I1}_mask = (_rows[:, None] < _N // _P) & (_cols[None, :] < _P)"]


CHUNKS = (["_starts", "_L"], "chunks of _L steps; the states before each [chunks, K, N] (read from the second on)")
ADJOINT_CHUNKS = (["_starts", "_L"], "chunks of _L steps; the state gradients after each [chunks, K, N] (read but "
                  "for the last)")


def _chunk_head(targets: list[str], starts_where: str, chunk: str = "tl.program_id(1)", writer: str = "") -> list[str]:
    """A time-parallel kernel's chunk of steps, ``[_cs, _ce)`` (``chunk``: its index; ``_len``: its steps), and
    where ``starts_where`` holds, ``targets`` (the states, or the state gradients, at the chunk's boundary)
    read from ``_starts`` (which the kernel ``writer`` wrote)."""
    lines = [f"{I1}_chunk = {chunk}", f"{I1}_cs = _chunk * _L", f"{I1}_ce = _cs + tl.minimum(_L, _T - _cs)",
             f"{I1}_len = _ce - _cs"]
    if targets:
        lines += [f"{I1}if {starts_where}:  # ({writer} wrote them)"]
        lines += [f"{I2}{n} = tl.load(_starts + tl.cast(_chunk * {len(targets)} + {i}, tl.int64) * _N + _offs, "
                  f"mask=_mask, other=0.0).to(_DTYPE)" for i, n in enumerate(targets)]
    return lines


class _Read(NamedTuple):
    """A sequence one step reads: ``name`` holds the step's value, ``<seq>_ptr`` walks the sequence
    through time; ``flag``: a constexpr that says whether it is read at all ("" when always)."""
    name: str
    seq: str
    flag: str = ""


def _backward_reads(info: FlexSNInfo, grad_out: list[str], read_unique: list[str]) -> list[_Read]:
    """What a backward step reads: the outputs' upstream gradients, the kept sequences its core reads, and
    the state sequences' upstream gradients where there are any (``_HAS_STATE_GRADS``)."""
    reads = [_Read(f"{p}_t", p) for p in grad_out + read_unique]
    return reads + [_Read(f"{n}__grad_states_t", f"{n}__grad_states", "_HAS_STATE_GRADS") for n in info.state_names]


def _time_loops(reads: list[_Read], step: list[str], move: str, index: bool = False, blocks: bool = True,
                length: str = "_T") -> list[str]:
    """The time loop: with ``_TC`` > 1, whole tiles of ``_TC`` steps, then the steps after the tiles one at a
    time (all of them with ``_TC`` = 1, the loop pipelined ``_STAGES`` deep). Nothing a step ``reads``
    depends on the recurrence, so a tile's loads are issued before any of its steps run, and the next
    tile's before this one's steps (``blocks``: each read's tile as one ``[_TC, _BLOCK]`` block, taken apart
    into its steps by ``_tile_rows``; else a tuple of one load a step, and no next tile in flight).
    ``step``: the lines of one step once its reads are bound (indented as at the loop's top level);
    ``move``: ``+=`` when time runs forward, ``-=`` when it runs backward; ``index``: bind ``_s``, the
    loop's count of the step (for draws); ``length``: the variable holding the steps walked (a time-parallel kernel's: its chunk's)."""
    def each(template: str, walk: bool) -> list[str]:
        """A line per read from ``template`` (and its pointer's step when ``walk``), one branch per flag."""
        def of(r: _Read) -> list[str]:
            line = template.format(name=r.name, seq=r.seq, load=_load(f"{r.seq}_ptr"))
            return [line, f"{r.seq}_ptr {move} _N"] if walk else [line]
        lines = [line for r in reads if not r.flag for line in of(r)]
        for flag in dict.fromkeys(r.flag for r in reads if r.flag):
            lines += [f"if {flag}:"] + [I1 + line for r in reads if r.flag == flag for line in of(r)]
        return lines

    I3, I4 = I2 + I1, I2 + I2
    lines = [f"{I1}_tiled = 0  # the steps in whole tiles",
             f"{I1}if _TC > 1:",
             f"{I2}_tiled = {length} - {length} % _TC"]
    if blocks:
        def tile_load(count: str) -> str:
            """A read's tile at its pointer, none where ``count`` (the steps left in whole tiles) is 0."""
            return "_tile_load({seq}_ptr, _tile_offs, _mask, " + count + ").to(_DTYPE)"
        lines += [f"{I2}_tile_offs = tl.cast(tl.arange(0, _TC), tl.int64)[:, None] * {'-' if move == '-=' else ''}_N"
                  "  # row k: step k of a tile",
                  f"{I2}_tile_step = _TC * tl.cast(_N, tl.int64)"
                  "  # a tile's elements (int64: _TC * _N may not fit int32)"]
        lines += [I2 + line for line in each("{seq}_block = " + tile_load("_tiled"), False)]
        lines += [f"{I2}for _t0 in tl.range(0, _tiled, _TC):"]
        lines += [f"{I3}# the next tile's loads: in flight while this tile's steps run"]
        lines += [I3 + line for line in each("{seq}_ptr " + move + " _tile_step", False)]
        lines += [I3 + line for line in each("{seq}_next = " + tile_load("_tiled - _t0 - _TC"), False)]
        lines += [I3 + line for line in each("{seq}_tile = _tile_rows({seq}_block, _TC, _BLOCK)", False)]
    else:
        lines += [f"{I2}for _t0 in tl.range(0, _tiled, _TC):"]
        lines += [f"{I3}{r.seq}_tile = ()" for r in reads]
        lines += [f"{I3}for _k in tl.static_range(_TC):  # the tile's loads first: all of them in flight together"]
        lines += [I4 + line for line in each("{seq}_tile += ({load},)", True)]
    lines += [f"{I3}for _k in tl.static_range(_TC):  # then its steps, in order"]
    lines += [I4 + line for line in each("{name} = {seq}_tile[_k]", False) + (["_s = _t0 + _k"] if index else [])]
    lines += [I4 + line for line in step]
    if blocks:
        lines += [I3 + line for line in each("{seq}_block = {seq}_next", False)]
    lines += [f"{I1}for _t in tl.range(_tiled, {length}, num_stages=_STAGES):  # the steps after the tiles, one at a time"]
    lines += [I2 + line for line in each("{name} = {load}", True) + (["_s = _t"] if index else [])]
    lines += [I2 + line for line in step]
    return lines


def _forward_kernel(cores: Cores, variant: str, chunked: bool = False) -> str:
    """Pointer arguments are named after the spec: ``x__in``, ``s__out``, ``h__saved``,
    ``v__init``, ``v__states`` and ``v__final``; ``<arg>_ptr`` walks one through time. ``chunked``: the
    time-parallel kernel (``scan_<variant>``), which walks one chunk of steps from the states before it."""
    info = cores.info
    training = variant.startswith("forward")
    state_seqs = variant in ("inference", "forward")
    inputs = [f"{n}__in" for n in info.input_names]
    written = [f"{n}__out" for n in info.output_names]
    written += [f"{n}__saved" for n in info.saved_names] if training else []
    written += [f"{n}__states" for n in info.state_names] if state_seqs else []
    walking = inputs + written
    recipients = list(info.fwd_core_recipients)
    if not training:  # the saved values are computed but not stored
        recipients = recipients[:info.num_outputs + info.num_states] + ["_"] * len(info.saved_names)
    call_args = list(info.input_names) + list(info.state_names) + list(info.param_names) + list(info.fixed_names) + \
        list(info.draws)
    lines = _signature(info, scan_variant(variant) if chunked else variant, [
        (inputs + [f"{n}__init" for n in info.state_names], "inputs [T, N], initial states [N]"),
        (written + [f"{n}__final" for n in info.state_names], "written"),
        CHUNKS if chunked else ([], ""),
        _param_args(info),
        _seed_args(info),
    ], ", _CONST_INIT: tl.constexpr" if info.initial_values else "")
    what = "one chunk of _L steps (from the states before it)" if chunked else "_T steps"
    lines += [f'{I1}"""{variant.replace("_", " ")} of {info.neuron} over {what} for one block of neurons."""']
    lines += _head() + _params_load(info) + _seed_load(info, "_N", True)
    lines += _initial_states(info, "[_BLOCK]")
    if chunked:
        lines += _chunk_head(list(info.state_names), "_chunk > 0", writer="scan_carry")
    start = "tl.cast(_cs, tl.int64) * _N + " if chunked else ""
    lines += [f"{I1}{p}_ptr = {p} + {start}_offs" for p in walking]
    step = _draws(info, info.draws, "_cs + _s" if chunked else "_s", True)
    step += [f"{', '.join(recipients)} = {cores.forward_name}({', '.join(call_args)})"]
    step += [f"{n} = {n}.to(_DTYPE)" for n in info.state_names]
    step += [_store(f"{n}__out_ptr", v) for n, v in zip(info.output_names, info.output_vars)]
    if training:
        step += [_store(f"{n}__saved_ptr", f"{n}__saved_t") for n in info.saved_names]
    if state_seqs:
        step += [_store(f"{n}__states_ptr", n) for n in info.state_names]
    step += [f"{p}_ptr += _N" for p in written]
    lines += _time_loops([_Read(n, f"{n}__in") for n in info.input_names], step, "+=", bool(info.draws),
                         length="_len" if chunked else "_T")
    finals = [f"{I1}{_store(f'{n}__final + _offs', n)}" for n in info.state_names]
    lines += [f"{I1}if _ce == _T:  # (the last chunk)"] + [I1 + f for f in finals] if chunked and finals else finals
    return "\n".join(lines) + "\n"


class _BackwardNames(NamedTuple):
    """The pointer arguments and core call of a backward kernel (plain or recurrent)."""
    kept: list[str]         # what the forward kept: saved values, inputs, outputs
    read_unique: list[str]  # the kept sequences the backward core reads, each once
    grad_out: list[str]
    grad_in: list[str]
    call_args: list[str]    # the backward core's arguments (``<kept>_t`` for a read sequence)
    results: list[str]      # what it returns: input and state gradients, parameter gradients


def _backward_names(info: FlexSNInfo) -> _BackwardNames:
    kept = [f"{n}__saved" for n in info.saved_names] + [f"{n}__in" for n in info.input_names] + \
           [f"{n}__out" for n in info.output_names]
    suffix = {"saved": "__saved", "input": "__in", "output": "__out"}
    names = {"saved": info.saved_names, "input": info.input_names, "output": info.output_names}
    read = [f"{names[kind][i]}{suffix[kind]}" for kind, i in info.c2k_return_mapping]
    call_args = [f"{r}_t" for r in read] + [f"{n}__grad_out_t" for n in info.output_names] + \
                [f"{n}__grad_next" for n in info.state_names] + list(info.param_names) + list(info.fixed_names) + \
                [d for d in info.bwd_core_args if d in info.draws]
    results = [f"{n}__grad_in_t" for n in info.input_names] + [f"{n}__grad_acc" for n in info.state_names] + \
              [f"{n}__grad_t" for n in info.param_names]
    return _BackwardNames(kept, sorted(set(read), key=kept.index), [f"{n}__grad_out" for n in info.output_names],
                          [f"{n}__grad_in" for n in info.input_names], call_args, results)


def _backward_kernel(cores: Cores, chunked: bool = False) -> str:
    """Reads upstream gradients ``s__grad_out``, ``v__grad_states``, ``v__grad_final`` and the kept
    ``h__saved``, ``x__in``, ``s__out``; writes ``x__grad_in``, ``v__grad_init`` and per-block
    partial parameter gradients ``_params_grad``. ``chunked``: the time-parallel kernel (``scan_backward``;
    not for learnable shaped parameters), which walks one chunk of steps from the state gradients after it."""
    info = cores.info
    kept, read_unique, grad_out, grad_in, call_args, results = _backward_names(info)
    walking = grad_out + read_unique + grad_in
    param_args, param_comment = _param_args(info)
    grads = ["_params_grad"] if info.scalar_params else []
    grads += [f"{n}__{k}" for n in info.learnable_shaped for k in ("grad", "split")]
    carries = bool(info.param_names) and not chunked  # (running sums over launches: recompute)
    grads += ["_grad_sums"] if carries else []
    tiled = bool(info.learnable_shaped)
    shape = "[_ROWS, _COLS]" if tiled else "[_BLOCK]"
    lines = _signature(info, scan_variant("backward") if chunked else "backward", [
        (grad_out + [f"{n}__grad_states" for n in info.state_names] + [f"{n}__grad_final" for n in info.state_names],
         "upstream gradients"),
        (kept, "what the forward kept"),
        (grad_in + [f"{n}__grad_init" for n in info.state_names], "written"),
        ADJOINT_CHUNKS if chunked else ([], ""),
        (param_args, param_comment),
        (grads, ("partial parameter gradients: scalars [programs, P]; shaped [row tiles, segments, split]"
                 if tiled else "partial parameter gradients [programs, P]") + ("; running sums [P, N]" if carries else "")),
        _seed_args(info),
    ], ", _HAS_STATE_GRADS: tl.constexpr, _HAS_FINAL_GRADS: tl.constexpr, _WRITE_INIT_GRADS: tl.constexpr"
        + (", _CARRY_SUMS: tl.constexpr" if carries else ""), TILE_SIZES if tiled else BLOCK_SIZES)
    what = ", one chunk of _L steps from the state gradients after it" if chunked else ""
    lines += [f'{I1}"""Backward of {info.neuron}{what}: time runs in reverse, state gradients accumulate."""']
    lines += (_tile_head() if tiled else _head()) + _params_load(info, tiled) + _seed_load(info, "_N", not tiled)
    lines += _if("_HAS_FINAL_GRADS", [f"{I1}{n}__grad_acc = {_load(f'{n}__grad_final + _offs')}" for n in info.state_names],
                 [f"{I1}{n}__grad_acc = tl.zeros({shape}, dtype=_DTYPE)" for n in info.state_names])
    sums = ["_grad_sums + _offs"] + [f"_grad_sums + {k} * tl.cast(_N, tl.int64) + _offs"
                                     for k in range(1, len(info.param_names))]
    zero_sums = [f"{I1}{n}__grad_sum = tl.zeros({shape}, dtype=_DTYPE)" for n in info.param_names]
    lines += _if("_CARRY_SUMS", [f"{I1}{n}__grad_sum = {_load(p)}" for n, p in zip(info.param_names, sums)],
                 zero_sums) if carries else zero_sums
    if chunked:
        lines += _chunk_head([f"{n}__grad_acc" for n in info.state_names], "_chunk < tl.num_programs(1) - 1",
                             writer="scan_adjoint_carry")
    end = "_ce" if chunked else "_T"  # (time runs down from the step before it)
    lines += [f"{I1}_last = tl.cast({end} - 1, tl.int64) * _N"]
    lines += [f"{I1}{p}_ptr = {p} + _last + _offs" for p in walking + [f"{n}__grad_states" for n in info.state_names]]
    reads = _backward_reads(info, grad_out, read_unique)
    step = [f"{n}__grad_next = {n}__grad_acc" for n in info.state_names]
    if info.state_names:
        step += ["if _HAS_STATE_GRADS:"] + [f"{I1}{n}__grad_next += {n}__grad_states_t" for n in info.state_names]
    step += _draws(info, call_args, f"{end} - 1 - _s", not tiled)
    step += [f"{', '.join(results)} = {cores.backward_name}({', '.join(call_args)})"]
    step += [_store(f"{n}__grad_in_ptr", f"{n}__grad_in_t") for n in info.input_names]
    step += [f"{n}__grad_acc = {n}__grad_acc.to(_DTYPE)" for n in info.state_names]
    step += [f"{n}__grad_sum += tl.where(_mask, {n}__grad_t, 0.0)" for n in info.param_names]
    step += [f"{p}_ptr -= _N" for p in grad_in]
    lines += _time_loops(reads, step, "-=", bool(info.draws), not tiled, "_len" if chunked else "_T")
    init_grads = [f"{I1}{_store(f'{n}__grad_init + _offs', f'{n}__grad_acc')}" for n in info.state_names]
    if chunked and init_grads:
        init_grads = [f"{I1}if _cs == 0:  # (the first chunk)"] + [I1 + line for line in init_grads]
    lines += _if("_WRITE_INIT_GRADS", init_grads)
    if carries:
        lines += _if("_CARRY_SUMS", [f"{I1}{_store(p, f'{n}__grad_sum')}" for n, p in zip(info.param_names, sums)])
    lines += _partial_grads(info, tiled, chunked)
    return "\n".join(lines) + "\n"


def _recurrent_parts(info: FlexSNInfo) -> tuple[str, str, list[str]]:
    """The recurrent input, the kernel variable holding the value it feeds back, the other inputs."""
    (r, _, index), = info.recurrent
    return r, info.output_vars[index], [n for n in info.input_names if n != r]


def _recurrent_head() -> list[str]:
    """A program owns _BLOCK_B rows of the batch and all _N features (padded to _NP)."""
    return [f"{I1}_rows = tl.program_id(0) * _BLOCK_B + tl.arange(0, _BLOCK_B)",
            f"{I1}_cols = tl.arange(0, _NP)",
            f"{I1}_row_ok = _rows[:, None] < _B",
            f"{I1}_col_ok = _cols[None, :] < _N",
            f"{I1}_mask = _row_ok & _col_ok",
            f"{I1}_row = tl.cast(_rows[:, None], tl.int64) * _N  # each row's first feature",
            f"{I1}_offs = _row + _cols[None, :]",
            f"{I1}_step = tl.cast(_B, tl.int64) * _N"]


def _matvec(target: str, rows: str, w_index: str, indent: str) -> list[str]:
    """``target = A @ M`` in chunks of _BLOCK_K along the sum: A's rows read back from memory at
    ``rows`` (each row's first feature, just written by this program), M's chunk from the weight
    at ``w_index`` (of ``_kk``, the chunk, and ``_cols``). The weight stays in L2 and only a
    [_BLOCK_K, _NP] slice of it is held at a time: any N up to 512 fits in shared memory. ``_PRECISION``
    is tl.dot's ``input_precision`` (a constexpr: one kernel for every setting)."""
    return [f"{indent}{target} = tl.zeros([_BLOCK_B, _NP], dtype=_DTYPE)",
            f"{indent}for _k in range(0, _NP, _BLOCK_K):",
            f"{indent}{I1}_kk = _k + tl.arange(0, _BLOCK_K)",
            f"{indent}{I1}_a = tl.load({rows} + _kk[None, :], mask=_row_ok & (_kk[None, :] < _N), other=0.0)",
            f"{indent}{I1}_wk = tl.load(_weight + {w_index}, mask=(_kk[:, None] < _N) & _col_ok, other=0.0)",
            f"{indent}{I1}{target} += tl.dot(_a.to(_DOT_DTYPE), _wk.to(_DOT_DTYPE), input_precision=_PRECISION, "
            "out_dtype=_DTYPE)"]


def _recurrent_forward_kernel(cores: Cores) -> str:
    """The forward of a recurrent spec (inference with ``_TRAIN`` off): each step computes
    ``r = prev @ W.T`` with ``tl.dot`` (``prev``: the output fed back, as the last step stored
    it), runs the forward core, and stores the outputs."""
    info = cores.info
    r, fed, inputs = _recurrent_parts(info)
    fed_output = info.output_names[info.recurrent[0][2]]
    written = [f"{n}__out" for n in info.output_names]
    kept = [f"{n}__saved" for n in info.saved_names] + [f"{r}__in"]
    call_args = list(info.input_names) + list(info.state_names) + list(info.param_names) + list(info.fixed_names) + \
        list(info.draws)
    lines = _signature(info, "recurrent_forward", [
        ([f"{n}__in" for n in inputs] + [f"{n}__init" for n in info.state_names] + [f"{r}__init", "_weight"],
         "inputs [T, B, N], initial states [B, N], the value fed back before step 0 [B, N], weight [N, N]"),
        (written + kept + [f"{n}__final" for n in info.state_names] + [f"{r}__final"],
         f"written (the saved values, and {r} if the backward reads it, when training)"),
        _param_args(info),
        _seed_args(info),
    ], ", _TRAIN: tl.constexpr" + (", _CONST_INIT: tl.constexpr" if info.initial_values else ""), RECURRENT_SIZES)
    lines += [f'{I1}"""Recurrent forward of {info.neuron} over _T steps for _BLOCK_B rows of the batch."""']
    lines += _recurrent_head() + _params_load(info) + _seed_load(info, "_step", False)
    lines += _initial_states(info, "[_BLOCK_B, _NP]")
    lines += [f"{I1}_prev = {_load(f'{r}__init + _offs')}"]
    walking = [f"{n}__in" for n in inputs] + written + kept
    lines += [f"{I1}{p}_ptr = {p} + _offs" for p in walking]
    lines += [f"{I1}_fed_rows = {r}__init + _row  # the value fed back to step 0, then the output {fed_output}",
              f"{I1}_fed_next = {fed_output}__out + _row"]
    lines += [f"{I1}for _t in range(0, _T):"]
    lines += [f"{I2}{n} = {_load(f'{n}__in_ptr')}" for n in inputs]
    lines += _matvec(r, "_fed_rows", "_cols[None, :] * _N + _kk[:, None]", I2)  # M[k, i] = W[i, k]
    lines += [I2 + line for line in _draws(info, info.draws, "_t", False)]
    lines += [f"{I2}{', '.join(info.fwd_core_recipients)} = {cores.forward_name}({', '.join(call_args)})"]
    lines += [f"{I2}{n} = {n}.to(_DTYPE)" for n in info.state_names]
    lines += [f"{I2}_prev = {fed}"]
    lines += [f"{I2}{_store(f'{n}__out_ptr', v)}" for n, v in zip(info.output_names, info.output_vars)]
    train = [_store(f"{n}__saved_ptr", f"{n}__saved_t") for n in info.saved_names]
    if ("input", info.input_names.index(r)) in info.c2k_return_mapping:  # the backward reads r
        train.append(_store(f"{r}__in_ptr", r))
    lines += [I1 + line for line in _if("_TRAIN", [I1 + line for line in train])]  # nothing when none is kept
    lines += [f"{I2}{p}_ptr += _step" for p in walking]
    lines += [f"{I2}_fed_rows = _fed_next", f"{I2}_fed_next += _step",
              f"{I2}tl.debug_barrier()  # the next step reads back what this step stored, across threads"]
    lines += [f"{I1}{_store(f'{n}__final + _offs', n)}" for n in info.state_names]
    lines += [f"{I1}{_store(f'{r}__final + _offs', '_prev')}"]
    return "\n".join(lines) + "\n"


def _recurrent_backward_kernel(cores: Cores) -> str:
    """The reverse recursion of a recurrent spec in one kernel: the gradient reaching the value fed
    back at step t is ``g_{t+1} @ W`` (``g``: the gradient of the recurrent input, written for the
    weight gradient, which the runtime takes from one matrix product, and read back for this one)."""
    info = cores.info
    r, _, _ = _recurrent_parts(info)
    fed_output = info.output_names[info.recurrent[0][2]]
    kept, read_unique, grad_out, grad_in, call_args, results = _backward_names(info)
    walking = grad_out + read_unique + grad_in
    shaped_grads = list(info.learnable_shaped)
    lines = _signature(info, "recurrent_backward", [
        (grad_out + [f"{n}__grad_final" for n in info.state_names] + [f"{r}__grad_final"], "upstream gradients"),
        (kept + ["_weight"], "what the forward kept, weight [N, N]"),
        (grad_in + [f"{n}__grad_init" for n in info.state_names] + [f"{r}__grad_init"], "written"),
        _param_args(info),
        ((["_params_grad"] if info.scalar_params else []) + [f"{n}__grad" for n in shaped_grads],
         "partial parameter gradients: scalars [blocks, P]; shaped [B, N] (summed over the steps)"),
        _seed_args(info),
    ], ", _HAS_FINAL_GRADS: tl.constexpr, _WRITE_INIT_GRADS: tl.constexpr", RECURRENT_SIZES)
    lines += [f'{I1}"""Recurrent backward of {info.neuron}: time runs in reverse through the steps and W."""']
    lines += _recurrent_head() + _params_load(info) + _seed_load(info, "_step", False)
    finals = [f"{n}__grad_acc = {_load(f'{n}__grad_final + _offs')}" for n in info.state_names]
    zeros = [f"{n}__grad_acc = tl.zeros([_BLOCK_B, _NP], dtype=_DTYPE)" for n in info.state_names]
    lines += _if("_HAS_FINAL_GRADS", [I1 + x for x in finals + [f"_fb = {_load(f'{r}__grad_final + _offs')}"]],
                 [I1 + x for x in zeros + ["_fb = tl.zeros([_BLOCK_B, _NP], dtype=_DTYPE)"]])
    lines += [f"{I1}{n}__grad_sum = tl.zeros([_BLOCK_B, _NP], dtype=_DTYPE)" for n in info.param_names]
    lines += [f"{I1}_last = tl.cast(_T - 1, tl.int64) * _step"]
    lines += [f"{I1}{p}_ptr = {p} + _last + _offs" for p in walking]
    lines += [f"{I1}_g_rows = {r}__grad_in + _last + _row"]
    lines += [f"{I1}for _t in range(0, _T):"]
    lines += [f"{I2}{p}_t = {_load(f'{p}_ptr')}" for p in grad_out + read_unique]
    lines += [f"{I2}{fed_output}__grad_out_t += _fb"]
    lines += [f"{I2}{n}__grad_next = {n}__grad_acc" for n in info.state_names]
    lines += [I2 + line for line in _draws(info, call_args, "_T - 1 - _t", False)]
    lines += [f"{I2}{', '.join(results)} = {cores.backward_name}({', '.join(call_args)})"]
    lines += [f"{I2}{_store(f'{n}__grad_in_ptr', f'{n}__grad_in_t')}" for n in info.input_names]
    lines += [f"{I2}tl.debug_barrier()  # {r}__grad_in of this step is read back across threads"]
    lines += _matvec("_fb", "_g_rows", "_kk[:, None] * _N + _cols[None, :]", I2)  # M[i, j] = W[i, j]
    lines += [f"{I2}_g_rows -= _step"]
    lines += [f"{I2}{n}__grad_acc = {n}__grad_acc.to(_DTYPE)" for n in info.state_names]
    lines += [f"{I2}{n}__grad_sum += tl.where(_mask, {n}__grad_t, 0.0)" for n in info.param_names]
    lines += [f"{I2}{p}_ptr -= _step" for p in walking]
    lines += _if("_WRITE_INIT_GRADS", [f"{I1}{_store(f'{n}__grad_init + _offs', f'{n}__grad_acc')}"
                                       for n in info.state_names] + [f"{I1}{_store(f'{r}__grad_init + _offs', '_fb')}"])
    lines += [f"{I1}tl.store(_params_grad + tl.program_id(0) * {info.num_params} + {k}, "
              f"tl.sum(tl.sum({n}__grad_sum, axis=1), axis=0))" for k, n in enumerate(info.scalar_params)]
    lines += [f"{I1}{_store(f'{n}__grad + _offs', f'{n}__grad_sum')}" for n in shaped_grads]
    return "\n".join(lines) + "\n"


def kernel_source(cores: Cores, variant: str) -> str:
    """Source of one multi-step kernel variant."""
    if variant == "backward":
        return _backward_kernel(cores)
    if variant == "recurrent_forward":
        return _recurrent_forward_kernel(cores)
    if variant == "recurrent_backward":
        return _recurrent_backward_kernel(cores)
    if variant not in VARIANTS:
        raise ValueError(f"unknown kernel variant {variant!r}; variants: {', '.join(VARIANTS)}")
    return _forward_kernel(cores, variant)


def module_source(cores: Cores, header: str) -> str:
    """A complete Python module: imports, cores, every kernel variant and INFO."""
    recurrent = RECURRENT_VARIANTS if [kind for _, kind, _ in cores.info.recurrent] == ["output"] else ()
    kernels = "\n\n".join(kernel_source(cores, v) for v in VARIANTS + recurrent)
    helpers = HEAVISIDE + "\n\n" + TILES + ("\n\n" + SEGMENTED_ADD if cores.info.learnable_shaped else "")
    helpers += "\n\n" + DRAWS if cores.info.draws else ""
    return (f"{header}\n"
            "import triton\nimport triton.language as tl\nfrom triton.language.extra import libdevice\n\n"
            "from flexsn_dsl.codegen_triton import FlexSNInfo\n\n"
            f"INFO = FlexSNInfo(**{value(cores.info.to_dict())})\n\n\n"
            f"{helpers}\n\n"
            f"{cores.source}\n\n{kernels}")
