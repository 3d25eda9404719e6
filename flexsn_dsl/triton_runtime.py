"""Launching the generated kernels: block sizes, the autograd Function, the interpreter on CPU."""
from __future__ import annotations

import contextlib
import copy
import functools
import inspect
import itertools
import math
import os
from typing import Callable, NamedTuple, Optional, Sequence

import torch

from .interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()  # (no GPU: the generated kernels run in Triton's interpreter)

import triton  # noqa: E402
from torch.library import wrap_triton  # noqa: E402

from .compiler import Compiled  # noqa: E402
from .names import CORES, VARIANTS, core_name, kernel_name, scan_variant

CPU_BLOCK = 1024
CPU_TILE = 4  # the interpreter's largest time tile: tiles and the steps after them both run in short tests
LONG_NEURONS = 65536  # below this, a launch has too few blocks of neurons to keep the GPU's memory busy
SCAN_PROGRAMS = 16  # a time-parallel call's programs an SM (blocks of neurons by chunks of steps) at least
SCAN_STEPS = 32  # the fewest steps of a built-in chunk: each chunk's map is composed step by step again
SCAN_GROUP = 32  # the chunks' maps a carry kernel composes at once (a scan over [_CP, _BLOCK] tiles)
MAX_PLANS = 64  # launch plans kept per spec and device type
MAX_STAGES = 16
MAX_TILE = 64  # the largest time tile a setting may ask for (each step of a tile is compiled code)
MAX_CHUNK = 1 << 30  # the most steps a setting may ask a chunk of a time-parallel call to take
MAX_GRID_Y = 65535  # CUDA's limit on a grid's second axis: the most chunks a call takes
TILE = 64  # the built-in largest time tile
TILE_VALUES = 128  # values a thread holds for a tile and the next one in flight: 2 tiles x reads x steps at most
TILE_CODE = 40_000  # characters of core source a built-in tile unrolls at most: Triton's compile time grows
# faster than the code it compiles (on an H200's host: LIF's inference kernel in 0.9 s with tiles of 32 steps,
# 4.2 s with 64; pipelined 2 deep as tiles once were, HH's took minutes)
MIN_COLS = 32  # the narrowest tile of the tiled backward: 128 contiguous bytes of float32 per row
RECURRENT_PRECISIONS = ("tf32x3", "ieee", "tf32")  # tl.dot's input_precision for float32; the first is the default
# Triton's compile options, passed at every launch: fused multiply-adds, Triton's default until 3.9 (3.10 makes
# them opt-in; without them HH and AdEx run 1.2x slower on an H200, BENCHMARKS.md)
COMPILE_OPTIONS = {"enable_fp_fusion": True}


class LaunchSettings(NamedTuple):
    autotune: bool  # $FLEXSN_DSL_AUTOTUNE=1: autotune block sizes (GPU only)
    stages: int     # $FLEXSN_DSL_STAGES: pipelining stages of the time loop (0: heuristic)
    recurrent_precision: str  # $FLEXSN_DSL_RECURRENT_PRECISION: the recurrent product's float32 precision
    block: int      # $FLEXSN_DSL_BLOCK: neurons per program (0: heuristic)
    warps: int      # $FLEXSN_DSL_WARPS: warps per program (0: heuristic; GPU only)
    time_tile: int  # $FLEXSN_DSL_TIME_TILE: steps per time tile, _TC (0: heuristic; 1: no tiles)
    time_parallel: bool = True  # $FLEXSN_DSL_TIME_PARALLEL=0: sequential kernels also for time-parallel specs
    scan_chunk: int = 0  # $FLEXSN_DSL_SCAN_CHUNK: steps per chunk of a time-parallel call (0: heuristic)


def launch_settings() -> LaunchSettings:
    """The launch settings from the environment, read at each launch (the torch backend never reads
    them); a ValueError saying what to set for a value that is not one of the allowed ones."""
    return _parse_settings(*_read_settings())


SETTINGS = ("FLEXSN_DSL_AUTOTUNE", "FLEXSN_DSL_STAGES", "FLEXSN_DSL_RECURRENT_PRECISION", "FLEXSN_DSL_BLOCK",
            "FLEXSN_DSL_WARPS", "FLEXSN_DSL_TIME_TILE", "FLEXSN_DSL_TIME_PARALLEL",
            "FLEXSN_DSL_SCAN_CHUNK")  # in LaunchSettings' order
_SETTING_KEYS = tuple(os.environ.encodekey(name) for name in SETTINGS)  # (as os.environ stores them)


def _read_settings() -> tuple[str | bytes | None, ...]:
    """The raw values of the launch settings (None where unset), as os.environ holds them. Looked up in
    its own dictionary (``_data``), because ``os.environ.get`` raises and catches a KeyError for an
    unset variable, the usual case: about 2 us a call inside a training step."""
    env = os.environ
    if type(env) is os._Environ:
        return tuple(map(env._data.get, _SETTING_KEYS))
    return tuple(map(env.get, SETTINGS))  # (os.environ replaced by a plain mapping)


@functools.lru_cache(maxsize=16)
def _parse_settings(*raw: str | bytes | None) -> LaunchSettings:
    autotune, stages, precision, block, warps, tile, parallel, chunk = map(_decode, raw)
    if autotune.strip() not in ("", "0", "1"):
        raise ValueError(f"FLEXSN_DSL_AUTOTUNE={autotune!r} is not 0 or 1: set it to 1 to autotune block sizes "
                         "on the GPU, to 0 or nothing for the built-in choice")
    stages_n = _whole("FLEXSN_DSL_STAGES", stages, range(MAX_STAGES + 1), f"a whole number from 0 to {MAX_STAGES}",
                      "the pipelining depth of the time loop (e.g. 2)")
    block_n = _whole("FLEXSN_DSL_BLOCK", block, [0] + [1 << k for k in range(4, 13)],
                     "0 or a power of two from 16 to 4096", "the neurons each program walks through time (e.g. 64)")
    warps_n = _whole("FLEXSN_DSL_WARPS", warps, (0, 1, 2, 4, 8, 16), "0 or a power of two from 1 to 16",
                     "the warps of each program (e.g. 1)")
    tile_n = _whole("FLEXSN_DSL_TIME_TILE", tile, [0] + [1 << k for k in range(MAX_TILE.bit_length())],
                    f"0 or a power of two from 1 to {MAX_TILE}",
                    "the steps whose loads a program issues together (e.g. 16; 1 for no tiles)")
    product = precision.strip() or RECURRENT_PRECISIONS[0]
    if product not in RECURRENT_PRECISIONS:
        raise ValueError(f"FLEXSN_DSL_RECURRENT_PRECISION={precision!r} is not one of "
                         f"{', '.join(RECURRENT_PRECISIONS)}: set it to the recurrent product's precision in float32 "
                         "layers: tf32x3 (float32 accuracy on tensor cores; the default, also when unset), ieee "
                         "(float32 FMA, slower) or tf32 (fastest, about 1e-3 relative error)")
    if parallel.strip() not in ("", "0", "1"):
        raise ValueError(f"FLEXSN_DSL_TIME_PARALLEL={parallel!r} is not 0 or 1: set it to 0 to run specs whose states "
                         "are affine (time-parallel) with the sequential kernels, to 1 or nothing for the scan kernels")
    chunk_n = _whole("FLEXSN_DSL_SCAN_CHUNK", chunk, range(MAX_CHUNK + 1), f"a whole number from 0 to {MAX_CHUNK}",
                     "the steps of each chunk a time-parallel call is split into (e.g. 512)")
    return LaunchSettings(autotune=autotune.strip() == "1", stages=stages_n, recurrent_precision=product,
                          block=block_n, warps=warps_n, time_tile=tile_n, time_parallel=parallel.strip() != "0",
                          scan_chunk=chunk_n)


def _whole(name: str, raw: str, allowed, described: str, meaning: str) -> int:
    """A whole-number setting (0 when unset); a ValueError saying what to set when it is not in ``allowed``."""
    text = raw.strip()
    if text and not (text.isascii() and text.isdigit() and int(text) in allowed):
        raise ValueError(f"{name}={raw!r} is not {described}: set it to {meaning}, or to 0 or nothing for the "
                         "built-in choice")
    return int(text or 0)


def _decode(raw: str | bytes | None) -> str:
    """An environment value as os.environ.get gives it ("" when unset)."""
    if raw is None:
        return ""
    return raw if isinstance(raw, str) else os.environ.decodevalue(raw)


def _compute_dtype(dtype: torch.dtype):
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _torch_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32


class Kernels:
    """The kernels of one compiled spec for one kind of device, and the launch plans of its calls."""

    def __init__(self, compiled: Compiled, device: torch.device):
        self.interpret = interpreting()
        self.device_type = device.type
        if device.type != "cuda" and not self.interpret:
            raise RuntimeError("backend='triton' on CPU tensors runs Triton's interpreter, which must be on "
                               "before Triton is imported: set TRITON_INTERPRET=1 (or import flexsn_dsl first)")
        self.module = compiled.triton_module()
        self.info = self.module.INFO
        self.name = compiled.model.name
        # the variants with a time-parallel kernel (a step affine in its states: flexsn_dsl.scan_templates)
        self.scans = tuple(v for v in VARIANTS if hasattr(self.module, kernel_name(self.name, scan_variant(v))))
        # the rows of a chunk's map in the chunked scan: the entries of A, then b
        self.map_rows = len(compiled.parallel.pattern) + self.info.num_states if self.scans else 0
        self._plans: dict[tuple, Plan] = {}
        # the built-in time tile's bound, forward and backward: TILE, or less for a step of more code, and for a
        # kernel of more reads (each read holds two tiles in registers: TILE_VALUES); a power of two, 1: no tiles
        code = max(len(inspect.getsource(getattr(self.module, core_name(self.name, d)).fn)) for d in CORES)
        reads = {"forward": self.info.num_inputs,
                 "backward": self.info.num_outputs + len(set(self.info.c2k_return_mapping))}
        self.largest_tiles = {d: min(TILE, _power_of_two(TILE_CODE // code), _power_of_two(TILE_VALUES // (2 * r)))
                              for d, r in reads.items()}

    def config(self, n: int, T: int, settings: LaunchSettings, direction: str = "forward", wide: bool = False) -> dict:
        """Launch meta-parameters for n neurons over T steps: the block of neurons a program walks
        through time (it does not depend on T), its warps, the time loop's pipelining depth and
        time tile (``_TC``: steps whose loads are issued together; ``direction``: of the forward or the
        backward kernels; ``wide``: of values of two registers, float64, half as many steps); each one a
        setting gives (:class:`LaunchSettings`), the heuristic's otherwise."""
        if self.interpret:  # (small: a CPU runs each program in turn)
            block, tile = min(CPU_BLOCK, max(16, 1 << (max(n, 1) - 1).bit_length())), _time_tile(T, CPU_TILE, 2)
            return {"_BLOCK": settings.block or block, "_STAGES": 1, "_TC": settings.time_tile or tile}
        sms = _sm_count()
        if n >= LONG_NEURONS:
            # Measured on an H200 (BENCHMARKS.md): 1024-wide blocks of 4 warps are within a few percent
            # of the best config when there are enough neurons; down to 65,536 neurons, smaller blocks
            # of one warp and a 4-stage pipelined time loop keep the most loads in flight.
            block = 1024
            while block > 64 and _cdiv(n, block) < 4 * sms:
                block //= 2
            warps = 4 if block >= 512 else (2 if block >= 256 else 1)
            stages, tile = (2 if block >= 512 else 4), 1
        else:
            # Fewer neurons (usually over many steps) leave the memory idle while each program waits
            # on its next step's loads: blocks down to 32 neurons for more programs than SMs (16 where
            # even those are fewer than half the SMs), and time tiles, so that a program has a tile's
            # loads in flight while the tile before runs (about T / 16 steps: measured on an H200,
            # BENCHMARKS.md; without tiles, a loop pipelined 4 steps deep as before). A thread holds one
            # neuron's tiles (a warp a 32 neurons): the tile bound counts one neuron's values, and one-warp
            # blocks of 64 or 128 neurons spilled them (benchmarks/register_check.py).
            block = 128
            while block > 32 and _cdiv(n, block) < 2 * sms:
                block //= 2
            if _cdiv(n, block) < sms // 2:
                block = 16
            tile = _time_tile(T, self.largest(direction, wide), 16)
            warps, stages = (max((settings.block or block) // 32, 1), 2) if tile > 1 else (1, 4)
        return {"_BLOCK": settings.block or block, "num_warps": settings.warps or warps,
                "_STAGES": settings.stages or stages, "_TC": settings.time_tile or tile}

    def scan_config(self, n: int, T: int, settings: LaunchSettings, wide: bool = False) -> tuple[dict, int, int]:
        """Launch meta-parameters of the time-parallel kernels over n neurons and T steps, the steps of each
        chunk of a call and the backward's time tile (the meta-parameters hold the forward's). Chunks: a
        setting's; else all of T (and the sequential kernels' meta-parameters) in the interpreter and from
        LONG_NEURONS neurons, where the sequential kernels keep the memory busy; else blocks of 32 to 128
        neurons (a warp a 32) over chunks of at least SCAN_STEPS steps, enough for SCAN_PROGRAMS programs an SM."""
        chunk, block = max(T, 1), 128
        if not self.interpret:
            sms = _sm_count()
            while block > 32 and _cdiv(n, block) < 2 * sms:
                block //= 2
            block = settings.block or block
            if n < LONG_NEURONS:
                chunk = _cdiv(T, max(min(_cdiv(SCAN_PROGRAMS * sms, _cdiv(n, block)), T // SCAN_STEPS), 1)) or 1
        if not settings.scan_chunk and chunk >= T:  # one chunk: the sequential kernels' choice
            meta, backward_tile = self.sequential_config(n, T, settings, wide)
            return meta, chunk, backward_tile
        chunk = max(settings.scan_chunk or chunk, _cdiv(T, MAX_GRID_Y))  # (the chunks: the grid's second axis)
        tile = self.scan_tile(min(chunk, T), "forward", settings, wide)
        backward_tile = min(self.scan_tile(min(chunk, T), "backward", settings, wide), tile)  # (powers of two: it divides)
        if not settings.scan_chunk:  # whole tiles a chunk
            chunk = _cdiv(chunk, tile) * tile
        meta = self.config(n, T, settings, wide=wide) if self.interpret else \
            {"_BLOCK": block, "num_warps": settings.warps or max(block // 32, 1), "_STAGES": settings.stages or 2}
        return {**meta, "_TC": tile}, chunk, backward_tile

    def sequential_config(self, n: int, T: int, settings: LaunchSettings, wide: bool = False) -> tuple[dict, int]:
        """The sequential kernels' meta-parameters over n neurons and T steps (the forward's tile) and the
        backward's time tile."""
        return self.config(n, T, settings, wide=wide), self.config(n, T, settings, "backward", wide)["_TC"]

    def scan_tile(self, chunk: int, direction: str, settings: LaunchSettings, wide: bool = False) -> int:
        """The time tile of the time-parallel kernels of ``direction`` over chunks of ``chunk`` steps: a setting's,
        else a power of two, about a quarter of the chunk (half in the interpreter) and at most the
        direction's largest tile."""
        if settings.time_tile:
            return settings.time_tile
        return _time_tile(chunk, CPU_TILE, 2) if self.interpret else _time_tile(chunk, self.largest(direction, wide), 4)

    def largest(self, direction: str, wide: bool) -> int:
        """The largest built-in time tile of ``direction``, halved for values of two registers (float64)."""
        return max(self.largest_tiles[direction] // (2 if wide else 1), 1)

    def plan(self, shape: torch.Size, dtype: torch.dtype, settings: LaunchSettings) -> Plan:
        """The launch plan of calls over inputs of ``shape`` and ``dtype`` (built once, then cached)."""
        key = (shape, dtype, settings)
        plan = self._plans.get(key)
        if plan is None:
            if len(self._plans) >= MAX_PLANS:  # shapes that keep changing: start over rather than grow
                self._plans.clear()
            plan = self._plans[key] = Plan(self, shape, dtype, settings)
        return plan

    def launch_tiled(self, tiling: "Tiling", T: int, args: list, traced: bool, wide: bool, **constexprs) -> None:
        """Launch the tiled backward (a spec with learnable shaped parameters) over its tiles and T
        steps. Its tile is the block of a launch over the same neurons (not autotuned), its time tile the
        backward's (``wide``: float64). ``traced``: see :meth:`Plan.launch`."""
        config = self.config(tiling.rows * tiling.period, T, launch_settings(), "backward", wide)
        del config["_BLOCK"]
        kernel = getattr(self.module, kernel_name(self.name, "backward"))
        (wrap_triton(kernel) if traced else kernel)[tiling.grid](*args, _ROWS=tiling.tile_rows,
                                                                 _COLS=tiling.tile_cols, **config, **constexprs,
                                                                 **COMPILE_OPTIONS)

    def blocks(self, n: int) -> int:
        """An upper bound on the programs a launch over n neurons uses (partial parameter gradients)."""
        autotuned = launch_settings().autotune and not self.interpret
        block = 64 if autotuned else self.config(n, 1, launch_settings())["_BLOCK"]  # autotuning: the smallest
        return _cdiv(n, block)

    def tiling(self, n: int, period: int) -> "Tiling":
        """The tiles of the tiled backward over n neurons seen as rows of ``period``: as many rows per tile
        as fit (a power of two), at least MIN_COLS columns, rows times columns the block of a launch over n."""
        block = self.config(n, 1, launch_settings())["_BLOCK"]
        rows = n // period
        tile_rows = min(1 << (rows - 1).bit_length(), max(block // MIN_COLS, 1))
        return Tiling(period, rows, tile_rows, block // tile_rows)


class Tiling(NamedTuple):
    """The tiled backward's geometry: ``rows`` rows of ``period`` neurons, tiles of ``tile_rows`` by ``tile_cols``."""

    period: int
    rows: int
    tile_rows: int
    tile_cols: int

    @property
    def grid(self) -> tuple[int, int]:
        return triton.cdiv(self.period, self.tile_cols), triton.cdiv(self.rows, self.tile_rows)

    @property
    def programs(self) -> int:
        return math.prod(self.grid)

    def split(self, inner: int) -> int:
        """The most column tiles that the ``inner`` columns sharing one value of a shaped parameter span."""
        cols = self.tile_cols
        if cols % inner == 0 or inner % cols == 0:  # segments aligned with the tiles
            return max(inner // cols, 1)
        return (inner - 1 + cols - 1) // cols + 1

    def partial_shape(self, inner: int) -> tuple[int, int, int]:
        """The partial sums of a learnable shaped parameter: [row tiles, segments, split]."""
        return self.grid[1], self.period // inner, self.split(inner)


class Plan:
    """What every call over one input shape, dtype and launch setting launches with, computed once:
    the sizes, the kernels bound to their grid, and the keyword arguments of each launch."""

    def __init__(self, kernels: Kernels, shape: torch.Size, dtype: torch.dtype, settings: LaunchSettings):
        info = kernels.info
        self.info = info
        self.source = kernels  # (its tiled launch: the backward of a spec with learnable shaped parameters)
        self.shape = shape                       # [T, *step]
        self.T, self.step = shape[0], shape[1:]
        self.step_sizes = tuple(self.step)  # (new_empty parses a tuple faster than a torch.Size)
        # what a call reads from INFO, once: counts, and whether each shaped parameter is learnable
        self.n_out, self.n_st, self.n_saved = info.num_outputs, info.num_states, len(info.saved_names)
        self.learnable = tuple(name in info.param_names for name in info.shaped_names)
        self.kept_inputs = kept_inputs(info)
        self.tiled = bool(info.learnable_shaped)
        self.n = math.prod(self.step)
        scans = kernels.scans if settings.time_parallel else ()
        self.wide = wide = dtype == torch.float64  # (values of two registers: half the time tile)
        self.autotuned = settings.autotune and not kernels.interpret and not scans
        self.kernels = {v: getattr(kernels.module, kernel_name(kernels.name, scan_variant(v) if v in scans else v))
                        for v in VARIANTS}
        if self.autotuned:
            self.kernels = {v: _tuned(k) for v, k in self.kernels.items()}
            self.block = 64  # a lower bound on the block size autotuning picks
            sequential, backward_tile = kernels.sequential_config(self.n, self.T, settings, wide)
            meta: dict = {"_STAGES": settings.stages or 2, "_TC": sequential["_TC"]}
            chunk = 0
            self.grid = lambda meta: (_cdiv(self.n, meta["_BLOCK"]),)  # noqa: E731
        else:
            if scans:
                meta, chunk, backward_tile = kernels.scan_config(self.n, self.T, settings, wide)
            else:
                (meta, backward_tile), chunk = kernels.sequential_config(self.n, self.T, settings, wide), 0
            self.block = meta["_BLOCK"]
            self.grid = (_cdiv(self.n, self.block),)
        # a time-parallel call: chunks of ``chunk`` steps, a program for each block of neurons and chunk
        self.chunk = chunk
        self.chunks = _cdiv(self.T, self.chunk) if scans else 1
        self.map_rows = kernels.map_rows
        blocks = _cdiv(self.n, self.block)
        if scans:
            self.grid = (blocks, max(self.chunks, 1))
        direct = kernels.device_type == "cuda" and not self.autotuned and not kernels.interpret
        launcher = lambda k, grid: DirectLaunch(k, grid) if direct else _jit_launch(k[grid])  # noqa: E731
        self.launchers = {v: launcher(k, self.grid) for v, k in self.kernels.items()}
        # the kernels that work out the states (state gradients) at the chunks' boundaries, with their grids
        # (the summaries of all chunks but one: the forward never reads the last chunk's map, the backward the first's)
        summaries = (blocks, self.chunks - 1)
        chunked = [(v, grid) for v, grid in (("scan_summary", summaries), ("scan_carry", (blocks,)),
                                             ("scan_adjoint_summary", summaries), ("scan_adjoint_carry", (blocks,)))
                   if self.chunks > 1 and hasattr(kernels.module, kernel_name(kernels.name, v))]
        self.chunk_kernels = {v: (getattr(kernels.module, kernel_name(kernels.name, v)), grid) for v, grid in chunked}
        self.chunk_launchers = {v: launcher(k, grid) for v, (k, grid) in self.chunk_kernels.items()}
        self.programs = blocks * (self.chunks if scans else 1)  # a launch's programs (a bound when autotuning)
        # the keyword arguments of each launch: meta-parameters and constexpr flags
        base = {**meta, **COMPILE_OPTIONS, "_DTYPE": _compute_dtype(dtype)}
        has_init_flag = bool(info.initial_values)  # a spec with constant initial states may skip reading them
        # the carry kernels' keywords: one program a block of neurons, the chunks' maps in groups of _CP (4 warps
        # on a GPU: a group's maps are [_CP, _BLOCK] tiles), no tiles of steps
        carry_base = {k: v for k, v in base.items() if k in ("_BLOCK", "_DTYPE", *COMPILE_OPTIONS)}
        carry_base.update({"_CP": min(SCAN_GROUP, _power_of_two_above(self.chunks - 1)),
                           **({"num_warps": 4} if "num_warps" in base else {})})
        self.summary_flags = base
        self.carry_flags = {const: {**carry_base, "_CONST_INIT": const} if has_init_flag else carry_base
                            for const in (False, True)}
        # the sequential backward's time tile, and the time-parallel one's: of its own reads (more of them than
        # the forward's, as a rule)
        backward = {**base, "_TC": backward_tile}
        self.adjoint_summary_flags = {seqs: {**backward, "_HAS_STATE_GRADS": seqs} for seqs in (False, True)}
        self.adjoint_carry_flags = {final: {**carry_base, "_HAS_FINAL_GRADS": final} for final in (False, True)}
        self.const_init = {**base, "_CONST_INIT": True} if has_init_flag else base
        self.read_init = {**base, "_CONST_INIT": False} if has_init_flag else base
        # a sequential backward with learnable parameters can carry its running sums across launches (recompute)
        self.carries = bool(info.param_names) and "backward" not in scans
        sums = {"_CARRY_SUMS": False} if self.carries else {}
        self.backward_flags = {
            flags: {**backward, "_HAS_STATE_GRADS": flags[0], "_HAS_FINAL_GRADS": flags[1],
                    "_WRITE_INIT_GRADS": flags[2], **sums}
            for flags in itertools.product((False, True), repeat=3)}
        # the same, carrying the running parameter-gradient sums across launches (recompute)
        self.carrying_flags = {flags: {**keywords, "_CARRY_SUMS": True} for flags, keywords in self.backward_flags.items()}
        # each forward launch by (training, store_seqs, constant initial states): its variant and keywords
        self.forwards = {
            (training, seqs, const): (("forward" if training else "inference") + ("" if seqs else "_final_state"),
                                      self.const_init if const else self.read_init)
            for training, seqs, const in itertools.product((False, True), repeat=3)}

    def launch(self, variant: str, args: list, keywords: dict, traced: bool = False) -> int:
        """Launch ``variant`` over the plan's neurons (``keywords``: one of the plan's own dictionaries);
        returns the number of programs it ran. ``traced``: through ``wrap_triton``, for torch.compile to
        trace (inductor then issues the launch from the compiled step itself)."""
        args = [*args, self.T, self.n]
        if traced:
            wrap_triton(self.kernels[variant])[self.grid](*args, **keywords)
        else:
            self.launchers[variant](args, keywords)
        return _cdiv(self.n, self.kernels[variant].best_config.kwargs["_BLOCK"]) if self.autotuned else self.programs

    def launch_chunks(self, variant: str, args: list, keywords: dict, traced: bool = False) -> None:
        """Launch the chunk kernel ``variant`` (of :data:`flexsn_dsl.names.CHUNK_VARIANTS`) with all its
        arguments; ``traced``: see :meth:`launch`."""
        if traced:
            kernel, grid = self.chunk_kernels[variant]
            wrap_triton(kernel)[grid](*args, **keywords)
        else:
            self.chunk_launchers[variant](args, keywords)


def _jit_launch(launcher) -> Callable[[list, dict], object]:
    """A bound ``kernel[grid]`` called as a :class:`DirectLaunch` is: (args, keywords)."""
    return lambda args, keywords: launcher(*args, **keywords)


class DirectLaunch:
    """``kernel[grid](*args, **keywords)`` for the calls of one plan on a GPU. The first call of each
    specialization goes through Triton's JIT, which compiles the kernel or finds it in its cache; later
    calls hand the arguments to that compiled kernel's launcher directly, skipping the JIT's argument
    binding, option parsing and cache lookup (most of a launch's host time). Keyed as Triton specializes
    a kernel: each tensor's dtype and whether its address is 16-byte aligned, each integer's value, the
    constexpr keywords (by identity: the plan's dictionaries, which the cache keeps alive) and the device."""

    def __init__(self, kernel, grid: tuple[int, ...]):
        self.jit = kernel[grid]
        self.grid = (*grid, 1, 1)[:3]
        self.names = kernel.arg_names
        self.compiled: dict[tuple, tuple] = {}

    def __call__(self, args: list, keywords: dict) -> None:
        hooks = triton.knobs.runtime
        if _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            self.jit(*args, **keywords)  # (a profiler's hooks: Triton's own launch gives them its metadata)
            return
        device = torch.cuda.current_device()
        key = (id(keywords), device,
               *[(a.dtype, a.data_ptr() % 16 == 0) if isinstance(a, torch.Tensor) else a for a in args])
        entry = self.compiled.get(key)
        if entry is None:
            if len(self.compiled) >= MAX_PLANS:
                self.compiled.clear()
            kernel = self.jit(*args, **keywords)
            self.compiled[key] = (kernel, [keywords[name] for name in self.names[len(args):]], keywords)
            return
        kernel, constexprs, _ = entry  # (the keywords are kept so that their id stays theirs)
        kernel.run(*self.grid, _current_stream(device), kernel.function, kernel.packed_metadata, None, None, None,
                   *args, *constexprs)


def _hooked(hook) -> bool:
    """Whether a Triton launch hook is set: a function (Triton 3.6), or a chain with calls (later versions)."""
    return hook is not None and bool(getattr(hook, "calls", True))


def _current_stream(device: int) -> int:
    """The current CUDA stream of ``device``, as Triton's own launch gets it."""
    return _stream_getter()(device)


@functools.lru_cache(maxsize=None)
def _stream_getter() -> Callable[[int], int]:
    return triton.runtime.driver.active.get_current_stream


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _power_of_two(n: int) -> int:
    """The largest power of two at most n (1 for n below 2)."""
    return 1 << max(n.bit_length() - 1, 0)


def _power_of_two_above(n: int) -> int:
    """The smallest power of two at least ``n`` (1 for n <= 1)."""
    return 1 << max(n - 1, 0).bit_length()


def _time_tile(T: int, largest: int, tiles: int) -> int:
    """The built-in time tile over T steps: a power of two, at most ``largest`` and T / ``tiles`` (that many
    whole tiles at least; 1, no tiles, below 2 * ``tiles`` steps)."""
    return min(largest, _power_of_two(T // tiles))


@functools.lru_cache(maxsize=None)
def _sm_count() -> int:
    return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter in this process."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


@functools.lru_cache(maxsize=None)
def _tuned(kernel):
    configs = [triton.Config({"_BLOCK": b}, num_warps=w) for b, w in
               ((64, 2), (128, 2), (256, 2), (512, 4), (1024, 4), (2048, 8))]
    return triton.autotune(configs=configs, key=["_N", "_DTYPE"])(kernel)


@functools.lru_cache(maxsize=None)
def _kernels(compiled: Compiled, device_type: str) -> Kernels:
    return Kernels(compiled, torch.device(device_type))


def shaped_view(value: torch.Tensor, step_shape: Sequence[int]) -> tuple[torch.Tensor, int, int]:
    """A shaped parameter (that broadcasts to ``step_shape``) as the values the kernels read:
    its elements over the dimensions from the first to the last it varies over, contiguous
    (a view where its shape allows; never the full step), and (inner, size): each value is
    shared by ``inner`` consecutive neurons, and the ``size`` values repeat in that order."""
    nd = len(step_shape)
    aligned = (1,) * (nd - value.dim()) + tuple(value.shape)
    varying = [d for d in range(nd) if aligned[d] != 1] or [0]
    first, last = varying[0], varying[-1] if aligned[varying[-1]] != 1 else -1
    dims = tuple(step_shape[first:last + 1])
    values = value.reshape(aligned[first:last + 1]).expand(dims).reshape(-1).contiguous()
    return values, max(math.prod(step_shape[last + 1:]), 1), math.prod(dims)


def shaped_period(layout: Sequence[int]) -> int:
    """The neurons after which every shaped parameter repeats: the largest inner * size (each is the
    product of the step's trailing dimensions from the first its parameter varies over, so the
    largest is a multiple of the others)."""
    return max(inner * size for inner, size in zip(layout[0::2], layout[1::2]))


def _shaped_gradient(partial: torch.Tensor, size: int) -> torch.Tensor:
    """A learnable shaped parameter's gradient from its partial sums [row tiles, segments, split]
    (segment j holds value j % size): the partial sums themselves where each value has one, else
    their sum over row tiles, repeats and column tiles (a fixed order: the same bits every run)."""
    if partial.numel() == size:
        return partial.view(size)
    return partial.view(partial.shape[0], -1, size, partial.shape[2]).sum((0, 1, 3))


def on_device(like: torch.Tensor) -> contextlib.AbstractContextManager:
    """Make ``like``'s GPU the current one for the launches inside (Triton launches on the current
    device, whatever device the tensors are on): a CUDA device guard when it is not current, else
    nothing (CPU tensors, the usual one-GPU-per-process case). Called where kernels launch, never
    while torch.compile traces."""
    if like.is_cuda:
        index = like.get_device()
        if index != torch.cuda.current_device():
            return torch.cuda.device(index)
    return contextlib.nullcontext()


def _contiguous(x: torch.Tensor) -> torch.Tensor:
    return x if x.is_contiguous() else x.contiguous()


def new_seed(like: torch.Tensor) -> torch.Tensor:
    """The ``_seed`` of a call of a spec with draws: int64 [seed, first step], the seed drawn from torch's
    default generator of ``like``'s device (so ``torch.manual_seed`` makes the call reproducible)."""
    seed = torch.randint(0, 1 << 62, (1,), device=like.device, dtype=torch.int64)
    return torch.cat([seed, seed.new_zeros(1)])


def _forward(plan: Plan, xs, inits, params, shaped, layout, training: bool, store_seqs: bool, traced: bool = False,
             seed: torch.Tensor | None = None):
    """Run the forward kernels; returns (outputs, saved values, state sequences, final states, the
    inputs as the kernels read them). Empty ``inits`` (for a spec whose initial states are all
    constants) starts from those constants without reading any initial-state tensor. ``traced``:
    see :meth:`Plan.launch`; ``seed``: :func:`new_seed`'s, for a spec with draws."""
    n_st = plan.n_st
    const_init = not inits and n_st > 0
    if const_init and not plan.info.initial_values:
        raise ValueError(f"{plan.info.neuron}: no initial states given, and not all of them are constants")
    xs = [_contiguous(x) for x in xs]
    like = xs[0]  # contiguous: empty_like gives the same layout, and costs less than new_empty
    outs = [torch.empty_like(like) for _ in range(plan.n_out)]
    saved = [torch.empty_like(like) for _ in range(plan.n_saved)] if training else []
    seqs = [torch.empty_like(like) for _ in range(n_st)] if store_seqs else []
    finals = [like.new_empty(plan.step_sizes) for _ in range(n_st)]
    if plan.T == 0:
        finals = [f.fill_(v) for f, v in zip(finals, plan.info.initial_values)] if const_init else \
            [s.clone() for s in inits]
    elif plan.n > 0:
        _launch_forward(plan, xs, [_contiguous(s) for s in inits], outs, saved, seqs, finals, params, shaped, layout,
                        training, store_seqs, traced, seed)
    return outs, saved, seqs, finals, xs


def _seed_arg(seed: torch.Tensor | None) -> list:
    return [] if seed is None else [seed]


def _launch_forward(plan: Plan, xs, inits, outs, saved, seqs, finals, params, shaped, layout, training: bool,
                    store_seqs: bool, traced: bool = False, seed: torch.Tensor | None = None) -> None:
    """Launch the forward kernel of ``plan`` (T >= 1) writing into the tensors given (contiguous); empty
    ``inits``: the spec's constant initial states; ``seed``: the draws' (:func:`new_seed`)."""
    const_init = not inits and plan.n_st > 0
    inits = [xs[0]] * plan.n_st if const_init else inits  # (any pointer: unread when constant)
    variant, flags = plan.forwards[training, store_seqs, const_init]
    tail = [*_param_args(params, shaped, layout), *_seed_arg(seed)]
    chunks = _forward_chunks(plan, xs, inits, const_init, tail, traced)
    plan.launch(variant, [*xs, *inits, *outs, *saved, *seqs, *finals, *chunks, *tail], flags, traced)


def _forward_chunks(plan: Plan, xs, inits, const_init: bool, tail: list, traced: bool) -> list:
    """A time-parallel launch's chunk arguments: the states before each chunk and its steps, worked out
    first where there are several chunks (each chunk's map, then the maps applied in turn); ``tail``: the
    parameter and seed arguments. None for the sequential kernels."""
    if not plan.chunk:
        return []
    like = xs[0]
    if plan.chunks == 1:
        return [like, plan.chunk]  # (unread)
    compute = _torch_compute_dtype(like.dtype)
    maps = like.new_empty((plan.chunks, plan.map_rows, plan.n), dtype=compute)
    starts = like.new_empty((plan.chunks, plan.n_st, plan.n), dtype=compute)
    plan.launch_chunks("scan_summary", [*xs, maps, plan.chunk, *tail, plan.T, plan.n], plan.summary_flags, traced)
    plan.launch_chunks("scan_carry", [*inits, maps, starts, plan.chunks, plan.n], plan.carry_flags[const_init], traced)
    return [starts, plan.chunk]


def _param_args(params, shaped, layout) -> list:
    """Kernel arguments of the runtime parameters: the scalar vector (if any), then (tensor, inner, size) per
    shaped one."""
    args = [params] if params is not None else []
    for k, values in enumerate(shaped):
        args += [values, layout[2 * k], layout[2 * k + 1]]
    return args


def _present(grads: Sequence[torch.Tensor | None], shape: Sequence[int],
             like: torch.Tensor) -> list[torch.Tensor] | None:
    """Upstream gradients (of ``shape``) as the kernels read them: None when none was given, zeros for a missing one."""
    for g in grads:
        if g is not None:
            return [like.new_zeros(shape) if g is None else _contiguous(g) for g in grads]
    return None


def _own(read: list[torch.Tensor], given: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
    """The upstream gradients among ``read`` (as :func:`_present` made them from ``given``) that this call made
    itself: zeros for a missing one, a contiguous copy of a broadcast or strided one. Nothing else holds them."""
    return [g for g, original in zip(read, given) if g is not original]


def _input_grads(xs: list[torch.Tensor], spare: list[torch.Tensor]) -> list[torch.Tensor]:
    """Tensors for the inputs' gradients: a ``spare`` upstream gradient of the same shape and dtype where there is
    one, each used once (every backward kernel's step reads an output's upstream gradient before it writes an
    input's gradient at the same place, in the same program, and nothing reads it after), else new ones. A
    loss such as ``out.sum()`` gives a broadcast gradient, which the kernels read as a contiguous copy: the
    input's gradient then takes that copy's memory instead of a [T, ...] tensor more."""
    spare = list(spare)
    grads = []
    for x in xs:
        k = next((k for k, g in enumerate(spare) if g.shape == x.shape and g.dtype == x.dtype), None)
        grads.append(torch.empty_like(x) if k is None else spare.pop(k))
    return grads


def kept_inputs(info) -> tuple[bool, ...]:
    """Whether the backward kernel reads each input: the others are not kept for the backward."""
    return tuple(("input", i) in info.c2k_return_mapping for i in range(len(info.input_names)))


def _backward(plan: Plan, store_seqs: bool, grads, saved, xs, outs, params, shaped, layout, init_grads: bool,
              traced: bool = False, into: tuple[list, list] | None = None, sums: torch.Tensor | None = None,
              seed: torch.Tensor | None = None):
    """Gradients of the inputs, initial states (when ``init_grads``, else []), scalar parameters
    and learnable shaped parameters (in ``shaped``'s order, None for the fixed ones) from the
    upstream gradients (None where there are none) of the outputs, state sequences (when stored)
    and final states; ``xs`` and ``outs`` as :func:`_forward` returned them, None for the inputs
    the kernel does not read (:func:`kept_inputs`). ``traced``: see :meth:`Plan.launch`. ``into``:
    the (contiguous) tensors to write the gradients of the inputs and initial states into (T >= 1);
    ``sums``: each learnable parameter's running gradient sums per neuron [P, N] in the compute dtype,
    which the kernel starts from and updates (``_CARRY_SUMS``)."""
    T, n, shape, step = plan.T, plan.n, plan.shape, plan.step_sizes
    n_out, n_st = plan.n_out, plan.n_st
    like = outs[0]  # (a spec has outputs) of the inputs' shape, dtype and device, contiguous
    xs = [like if x is None else x for x in xs]  # (any pointer for an input the kernel does not read)
    grad_outs = _present(grads[:n_out], shape, like) or [like.new_zeros(shape) for _ in range(n_out)]
    grad_seqs = _present(grads[n_out:n_out + n_st], shape, like) if store_seqs else None
    grad_finals = _present(grads[len(grads) - n_st:], step, like) if n_st else None
    grad_params = None
    learnable = plan.learnable
    if T == 0 or n == 0:
        grad_x = [torch.zeros_like(x) for x in xs]
        grad_init = ([g.clone() for g in grad_finals] if grad_finals else [like.new_zeros(step) for _ in range(n_st)]) \
            if init_grads else []
        grad_params = params.new_zeros(params.shape) if params is not None else None
        grad_shaped = [torch.zeros_like(v) if grad else None for v, grad in zip(shaped, learnable)]
    else:
        grad_x, grad_init = into or (_input_grads(xs, [] if traced else _own(grad_outs, grads[:n_out])),
                                     [like.new_empty(step) for _ in range(n_st)] if init_grads else [])
        unused = like  # a valid pointer for arguments a flag leaves unread (one the kernel does not write)
        args = [*grad_outs, *(grad_seqs or [unused] * n_st), *(grad_finals or [unused] * n_st), *saved, *xs,
                *outs, *grad_x, *(grad_init or [unused] * n_st)]
        param_args = _param_args(params, shaped, layout) if params is not None or shaped else []
        if plan.tiled:
            args += param_args
            tiling = plan.source.tiling(n, shaped_period(layout))
            partial = params.new_zeros((tiling.programs, params.shape[0])) if params is not None else None
            partials = {}  # learnable shaped parameter k -> partial sums [row tiles, segments, split]
            for k, (values, grad) in enumerate(zip(shaped, learnable)):
                if grad:
                    partials[k] = values.new_zeros(tiling.partial_shape(layout[2 * k]))
            args += [partial] if partial is not None else []
            args += [a for p in partials.values() for a in (p, p.shape[2])]
            args += ([like if sums is None else sums] if plan.carries else []) + _seed_arg(seed)
            plan.source.launch_tiled(tiling, T, args + [T, n, tiling.period], traced, plan.wide,
                                     _DTYPE=_compute_dtype(like.dtype), _HAS_STATE_GRADS=grad_seqs is not None,
                                     _HAS_FINAL_GRADS=grad_finals is not None, _WRITE_INIT_GRADS=init_grads,
                                     **({"_CARRY_SUMS": sums is not None} if plan.carries else {}))
            programs = tiling.programs
            grad_shaped = [_shaped_gradient(partials[k], v.numel()) if k in partials else None
                           for k, v in enumerate(shaped)]
        else:
            args += _backward_chunks(plan, grad_outs, grad_seqs, grad_finals, saved, xs, outs, param_args, seed,
                                     traced) + param_args
            partial = params.new_zeros((plan.programs, params.shape[0])) if params is not None else None
            flags = plan.carrying_flags if sums is not None else plan.backward_flags
            carried = [like if sums is None else sums] if plan.carries else []
            programs = plan.launch("backward", args + ([partial, *carried] if partial is not None else []) +
                                   _seed_arg(seed),
                                   flags[grad_seqs is not None, grad_finals is not None, init_grads], traced)
            grad_shaped = [None] * len(shaped)
        if partial is not None:  # only the rows this launch wrote (autotuning tries other block sizes)
            grad_params = partial[:programs].sum(0)
    return grad_x, grad_init, grad_params, grad_shaped


def _backward_chunks(plan: Plan, grad_outs, grad_seqs, grad_finals, saved, xs, outs, param_args: list, seed,
                     traced: bool) -> list:
    """:func:`_forward_chunks` for the backward: the state gradients after each chunk (each chunk's adjoint
    map, then the maps applied in turn from the last chunk)."""
    if not plan.chunk:
        return []
    like, n_st = outs[0], plan.n_st
    if plan.chunks == 1:
        return [like, plan.chunk]  # (unread)
    compute = _torch_compute_dtype(like.dtype)
    maps = like.new_empty((plan.chunks, plan.map_rows, plan.n), dtype=compute)
    starts = like.new_empty((plan.chunks, n_st, plan.n), dtype=compute)
    plan.launch_chunks("scan_adjoint_summary", [*grad_outs, *(grad_seqs or [like] * n_st), *saved, *xs, *outs, maps,
                                                plan.chunk, *param_args, *_seed_arg(seed), plan.T, plan.n],
                       plan.adjoint_summary_flags[grad_seqs is not None], traced)
    plan.launch_chunks("scan_adjoint_carry", [*(grad_finals or [like] * n_st), maps, starts, plan.chunks, plan.n],
                       plan.adjoint_carry_flags[grad_finals is not None], traced)
    return [starts, plan.chunk]


class _TritonSteps(torch.autograd.Function):
    """Fused multi-step forward and backward (eager). ``call``: (plan, store_seqs, number of inputs,
    layout, number of shaped parameters, number of scalar parameters); tensor arguments: the seed (a spec
    with draws: :func:`new_seed`, kept for the backward, which regenerates the draws), each learnable
    scalar parameter (0-dim; stacked here, so that the graph has no node of its own for that), the
    shaped parameters' values (:func:`shaped_view`), the inputs, the initial states."""

    @staticmethod
    def forward(ctx, call: tuple, *tensors):
        plan, store_seqs, n_inputs, layout, n_shaped, n_params = call
        seed, tensors = (tensors[0], tensors[1:]) if plan.info.draws else (None, tensors)
        n_x = n_params + n_shaped + n_inputs
        params = _stack(list(tensors[:n_params]))
        shaped, xs, inits = tensors[n_params:n_params + n_shaped], tensors[n_params + n_shaped:n_x], tensors[n_x:]
        outs, saved, seqs, finals, xs = _forward(plan, xs, inits, params, shaped, layout, True, store_seqs, seed=seed)
        ctx.call, ctx.n_saved, ctx.n_inits = call, len(saved), len(inits)
        ctx.save_for_backward(seed, params, *shaped, *saved,
                              *[x if keep else None for x, keep in zip(xs, plan.kept_inputs)], *outs)
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        plan, store_seqs, n_in, layout, n_shaped, n_params = ctx.call
        seed, params, *tensors = ctx.saved_tensors
        k = n_shaped + ctx.n_saved
        shaped, saved, xs, outs = tensors[:n_shaped], tensors[n_shaped:k], tensors[k:k + n_in], tensors[k + n_in:]
        n_seed = 0 if seed is None else 1
        init_grads = ctx.n_inits > 0 and any(ctx.needs_input_grad[1 + n_seed + n_params + n_shaped + n_in:])
        grad_x, grad_init, grad_params, grad_shaped = _backward(plan, store_seqs, grads, saved, xs, outs, params,
                                                                shaped, layout, init_grads, seed=seed)
        return (None, *[None] * n_seed, *(grad_params.unbind(0) if grad_params is not None else ()), *grad_shaped,
                *grad_x, *(grad_init or [None] * ctx.n_inits))


def _chunk_plans(plan: Plan, chunk: int, dtype: torch.dtype) -> list[tuple[int, Plan]]:
    """The plan of each chunk of ``chunk`` steps of a call of ``plan`` (the last one shorter where
    ``chunk`` does not divide T), with its first step. Never autotuned: autotuning runs a kernel several
    times, which would add the running sums that the backward carries (``_CARRY_SUMS``) more than once."""
    settings = launch_settings()._replace(autotune=False, time_parallel=False)  # (the kernels that carry sums)
    return [(t0, plan.source.plan(torch.Size((min(chunk, plan.T - t0), *plan.step)), dtype, settings))
            for t0 in range(0, plan.T, chunk)]


def _seed_from(seed: torch.Tensor | None, t0: int) -> torch.Tensor | None:
    """The seed of a launch over the steps from ``t0`` on: the draws of those steps of the whole call."""
    return None if seed is None else seed + seed.new_tensor([0, t0])


def _checkpointed_forward(plan: Plan, chunk: int, xs, inits, params, shaped, layout, store_seqs: bool, seed=None):
    """The inference kernel over one chunk of steps at a time, each from the states the last one ended
    with (the first from ``inits``, contiguous, or the constant initial states where there are none):
    (outputs, state sequences (if stored), final states, checkpoints: the states before each
    chunk after the first, kept in the compute dtype so that a chunk restarts from the very values
    a single launch carries from step to step)."""
    like = xs[0]
    step, n_st = plan.step_sizes, plan.n_st
    compute = _torch_compute_dtype(like.dtype)
    outs = [torch.empty_like(like) for _ in range(plan.n_out)]
    seqs = [torch.empty_like(like) for _ in range(n_st)] if store_seqs else []
    finals = [like.new_empty(step) for _ in range(n_st)]
    checkpoints: list[torch.Tensor] = []
    starts = inits
    for t0, sub in _chunk_plans(plan, chunk, like.dtype):
        t1 = t0 + sub.T
        ends = finals if t1 == plan.T else [like.new_empty(step, dtype=compute) for _ in range(n_st)]
        _launch_forward(sub, [x[t0:t1] for x in xs], starts, [o[t0:t1] for o in outs], [], [s[t0:t1] for s in seqs],
                        ends, params, shaped, layout, False, store_seqs, seed=_seed_from(seed, t0))
        if t1 < plan.T:
            checkpoints += ends
            starts = ends
    return outs, seqs, finals, checkpoints


def _checkpointed_backward(plan: Plan, chunk: int, store_seqs: bool, grads, xs, outs, inits, checkpoints, params,
                           shaped, layout, init_grads: bool, seed=None):
    """:func:`_backward` from :func:`_checkpointed_forward`'s checkpoints: for each chunk, last to first,
    the training forward kernel again from the chunk's first states (its saved values into buffers of one
    chunk), then the backward kernel over the chunk from the state gradients and running parameter-gradient
    sums the later chunk left (kept in the compute dtype): every gradient is that of one launch over all
    steps, bit for bit (the same terms added in the same order; the last chunk's launch reduces the sums)."""
    like = outs[0]
    step, n_out, n_st = plan.step_sizes, plan.n_out, plan.n_st
    compute = _torch_compute_dtype(like.dtype)
    chunks = _chunk_plans(plan, chunk, like.dtype)
    longest = (chunks[0][1].T, *step)
    saved = [like.new_empty(longest) for _ in range(plan.n_saved)]
    scratch = [like.new_empty(longest) for _ in range(n_out)]  # the outputs computed again (equal to ``outs``)
    ends = [like.new_empty(step, dtype=compute) for _ in range(n_st)]  # the final states computed again: unread
    grad_x = [torch.empty_like(x) for x in xs]
    carry = list(grads[len(grads) - n_st:])  # the gradients of the states after the chunk
    kept = [x if keep else None for x, keep in zip(xs, plan.kept_inputs)]
    names = plan.info.param_names
    sums = like.new_zeros((len(names), plan.n), dtype=compute) if names else None
    for k in reversed(range(len(chunks))):
        t0, sub = chunks[k]
        t1, length = t0 + sub.T, sub.T
        starts = list(inits) if k == 0 else checkpoints[(k - 1) * n_st:k * n_st]
        chunk_saved = [s[:length] for s in saved]
        at = _seed_from(seed, t0)
        _launch_forward(sub, [x[t0:t1] for x in xs], starts, [o[:length] for o in scratch], chunk_saved, [], ends,
                        params, shaped, layout, True, False, seed=at)
        begin = ([like.new_empty(step) for _ in range(n_st)] if init_grads else []) if k == 0 else \
            [like.new_empty(step, dtype=compute) for _ in range(n_st)]
        window = [None if g is None else g[t0:t1] for g in grads[:n_out + (n_st if store_seqs else 0)]] + carry
        _, _, grad_params, grad_shaped = _backward(
            sub, store_seqs, window, chunk_saved, [None if x is None else x[t0:t1] for x in kept],
            [o[t0:t1] for o in outs], params, shaped, layout, bool(begin), into=([g[t0:t1] for g in grad_x], begin),
            sums=sums, seed=at)
        carry = begin
    return grad_x, carry, grad_params, grad_shaped


class _RecomputedSteps(torch.autograd.Function):
    """:class:`_TritonSteps` keeping for the backward only the inputs, outputs, parameters and the states
    at the start of every chunk of steps (:func:`_checkpointed_forward`); the backward computes the saved
    values again, one chunk at a time (:func:`_checkpointed_backward`). ``call``: _TritonSteps' call and
    the steps of a chunk."""

    @staticmethod
    def forward(ctx, call: tuple, *tensors):
        plan, store_seqs, n_inputs, layout, n_shaped, n_params, chunk = call
        seed, tensors = (tensors[0], tensors[1:]) if plan.info.draws else (None, tensors)
        n_x = n_params + n_shaped + n_inputs
        params = _stack(list(tensors[:n_params]))
        shaped, xs, inits = tensors[n_params:n_params + n_shaped], tensors[n_params + n_shaped:n_x], tensors[n_x:]
        xs, inits = [_contiguous(x) for x in xs], [_contiguous(s) for s in inits]
        outs, seqs, finals, checkpoints = _checkpointed_forward(plan, chunk, xs, inits, params, shaped, layout,
                                                                store_seqs, seed)
        ctx.call, ctx.n_inits = call, len(inits)
        ctx.save_for_backward(seed, params, *shaped, *xs, *outs, *inits, *checkpoints)
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*outs, *seqs, *finals)

    @staticmethod
    def backward(ctx, *grads):
        plan, store_seqs, n_in, layout, n_shaped, n_params, chunk = ctx.call
        seed, params, *tensors = ctx.saved_tensors
        a, b, c = n_shaped + n_in, n_shaped + n_in + plan.n_out, n_shaped + n_in + plan.n_out + ctx.n_inits
        shaped, xs, outs, inits, checkpoints = tensors[:n_shaped], tensors[n_shaped:a], tensors[a:b], tensors[b:c], \
            tensors[c:]
        n_seed = 0 if seed is None else 1
        init_grads = ctx.n_inits > 0 and any(ctx.needs_input_grad[1 + n_seed + n_params + n_shaped + n_in:])
        grad_x, grad_init, grad_params, grad_shaped = _checkpointed_backward(
            plan, chunk, store_seqs, grads, xs, outs, inits, checkpoints, params, shaped, layout, init_grads, seed)
        return (None, *[None] * n_seed, *(grad_params.unbind(0) if grad_params is not None else ()), *grad_shaped,
                *grad_x, *(grad_init or [None] * ctx.n_inits))


# -- the same under torch.compile(fullgraph=True), as operators it treats as opaque --
# ``fused_forward`` and ``fused_backward`` are plain operators (no autograd of their own): the dispatcher
# calls them with fewer Python steps than a torch.library.custom_op (measured on the CPU: 13.5 against 30 us a
# forward call). ``fused_steps`` (what a compiled model calls) gives them autograd: torch.compile decomposes
# it into them with the formula of _CompiledSteps, so that a compiled graph calls the plain ones only.
_REGISTRY: dict[str, Compiled] = {}
_LIBRARY = torch.library.Library("flexsn_dsl", "FRAGMENT")
_LIBRARY.define("fused_steps(str key, bool store_seqs, Tensor[] xs, Tensor[] inits, Tensor[] params, Tensor[] shaped, "
                "SymInt[] layout, Tensor? seed) -> Tensor[]")
_LIBRARY.define("fused_forward(str key, bool store_seqs, Tensor[] xs, Tensor[] inits, Tensor? params, "
                "Tensor[] shaped, SymInt[] layout, bool training, Tensor? seed) -> Tensor[]")
_LIBRARY.define("fused_backward(str key, bool store_seqs, Tensor?[] grads, Tensor[] saved, Tensor?[] xs, "
                "Tensor[] outs, Tensor? params, Tensor[] shaped, SymInt[] layout, bool init_grads, Tensor? seed) "
                "-> Tensor[]")


def _kernels_for(key: str, like: torch.Tensor) -> Kernels:
    return _kernels(_REGISTRY[key], like.device.type)


def _plan_for(key: str, like: torch.Tensor) -> Plan:
    return _kernels_for(key, like).plan(like.shape, like.dtype, launch_settings())


def _fused_forward(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                   params: torch.Tensor | None, shaped: list[torch.Tensor], layout: list[int],
                   training: bool, seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Outputs, saved values (when ``training``), state sequences (if stored), final states. ``inits``
    is empty when the states start from the spec's constant initial values; ``params`` is the
    learnable scalar parameters' vector (None when none); ``shaped`` and ``layout`` are the shaped
    parameters' values and (inner, size) pairs (:func:`shaped_view`); ``seed``: :func:`new_seed`'s
    for a spec with draws, else None."""
    with on_device(xs[0]):
        return _forward_results(_plan_for(key, xs[0]), False, store_seqs, xs, inits, params, shaped, layout, training,
                                seed)


def _forward_results(plan: Plan, traced: bool, store_seqs: bool, xs, inits, params, shaped, layout,
                     training: bool, seed) -> list[torch.Tensor]:
    """:func:`_forward`'s results as the forward operators return them (see :func:`_fused_forward`)."""
    outs, saved, seqs, finals, _ = _forward(plan, xs, inits, params, shaped, layout, training, store_seqs, traced,
                                            seed)
    return [*outs, *saved, *seqs, *finals]


def _fused_forward_fake(key, store_seqs, xs, inits, params, shaped, layout, training, seed):
    info = _REGISTRY[key].info
    x = xs[0]
    return ([x.new_empty(x.shape) for _ in info.output_names] +
            ([x.new_empty(x.shape) for _ in info.saved_names] if training else []) +
            ([x.new_empty(x.shape) for _ in info.state_names] if store_seqs else []) +
            [x.new_empty(x.shape[1:]) for _ in info.state_names])


def _stack(params: list[torch.Tensor]) -> torch.Tensor | None:
    return torch.stack(params) if params else None


def _fused_backward(key: str, store_seqs: bool, grads: list[torch.Tensor | None], saved: list[torch.Tensor],
                    xs: list[torch.Tensor | None], outs: list[torch.Tensor], params: torch.Tensor | None,
                    shaped: list[torch.Tensor], layout: list[int], init_grads: bool,
                    seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Gradients of inputs, initial states (when ``init_grads``), the scalar parameters (when ``params``
    is given), then each learnable shaped parameter, from the upstream gradients (None where there
    are none); ``seed``: the forward's."""
    with on_device(outs[0]):
        return _backward_results(_plan_for(key, outs[0]), False, store_seqs, grads, saved, xs, outs, params, shaped,
                                 layout, init_grads, seed)


def _backward_results(plan: Plan, traced: bool, store_seqs: bool, grads, saved, xs, outs, params, shaped, layout,
                      init_grads: bool, seed) -> list[torch.Tensor]:
    """:func:`_backward`'s results as the backward operators return them (see :func:`_fused_backward`)."""
    grad_x, grad_init, grad_params, grad_shaped = _backward(
        plan, store_seqs, grads, saved, [None if x is None else _contiguous(x) for x in xs], outs, params, shaped,
        layout, init_grads, traced, seed=seed)
    return [*grad_x, *grad_init, *([grad_params] if params is not None else []),
            *[g for g in grad_shaped if g is not None]]


def _fused_backward_fake(key, store_seqs, grads, saved, xs, outs, params, shaped, layout, init_grads, seed):
    info = _REGISTRY[key].info
    x = outs[0]
    return ([x.new_empty(x.shape) for _ in xs] +
            ([x.new_empty(x.shape[1:]) for _ in info.state_names] if init_grads else []) +
            ([params.new_empty(params.shape)] if params is not None else []) +
            [v.new_empty(v.shape) for v, name in zip(shaped, info.shaped_names) if name in info.param_names])


for _name, _impl, _fake in (("fused_forward", _fused_forward, _fused_forward_fake),
                            ("fused_backward", _fused_backward, _fused_backward_fake)):
    for _device in ("CPU", "CUDA"):
        _LIBRARY.impl(_name, _impl, _device)
    torch.library.register_fake(f"flexsn_dsl::{_name}", _fake, lib=_LIBRARY)
fused_forward = torch.ops.flexsn_dsl.fused_forward.default
fused_backward = torch.ops.flexsn_dsl.fused_backward.default


# On a GPU, torch.compile gets the same two operators as ``torch.library.triton_op``s instead: it traces
# into them (the allocations and ``wrap_triton`` launches), and inductor issues the kernels from the
# compiled step with its own launcher, with no Python call of ours per launch. The interpreter on the CPU
# cannot be traced that way (its kernels are not JIT functions), nor can autotuning (its block size is
# chosen at the first launch); both keep the opaque operators, as do specs with learnable parameters
# under dynamic shapes (their partial sums made a compiled step recompile for each size on the H200; the
# tiled backward's tiles depend on the sizes). The launch settings are read when the step is compiled.
def _traced_plan(key: str, like: torch.Tensor) -> Plan:
    """The plan a traced operator launches with: for dynamic shapes, the plan of the sizes torch.compile
    traced with (block size, flags), its sizes, grid and number of programs made symbolic."""
    shape = like.shape
    if all(type(d) is int for d in shape):
        return _plan_for(key, like)
    plan = copy.copy(_kernels_for(key, like).plan(torch.Size(map(_size_hint, shape)), like.dtype, launch_settings()))
    plan.shape, plan.T, plan.step = shape, shape[0], shape[1:]
    plan.step_sizes, plan.n = tuple(plan.step), math.prod(plan.step)
    plan.programs = _cdiv(plan.n, plan.block)
    plan.grid = (plan.programs,)
    if plan.chunk:  # a time-parallel plan: one chunk of all the steps (the chunk kernels' sizes are not symbolic)
        plan.chunk, plan.chunks, plan.grid = plan.T, 1, (plan.programs, 1)
    return plan


def _size_hint(size) -> int:
    """The value a size had when torch.compile traced it (a symbolic one's hint; no guard)."""
    return size if type(size) is int else size.node.hint


def _traced_forward(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                    params: Optional[torch.Tensor], shaped: list[torch.Tensor], layout: list[int],
                    training: bool, seed: Optional[torch.Tensor]) -> list[torch.Tensor]:
    return _forward_results(_traced_plan(key, xs[0]), True, store_seqs, xs, inits, params, shaped, layout, training,
                            seed)


def _traced_backward(key: str, store_seqs: bool, grads: list[Optional[torch.Tensor]], saved: list[torch.Tensor],
                     xs: list[Optional[torch.Tensor]], outs: list[torch.Tensor], params: Optional[torch.Tensor],
                     shaped: list[torch.Tensor], layout: list[int], init_grads: bool,
                     seed: Optional[torch.Tensor]) -> list[torch.Tensor]:
    return _backward_results(_traced_plan(key, outs[0]), True, store_seqs, grads, saved, xs, outs, params, shaped,
                             layout, init_grads, seed)


torch.library.triton_op("flexsn_dsl::traced_forward", _traced_forward, mutates_args=())
torch.library.triton_op("flexsn_dsl::traced_backward", _traced_backward, mutates_args=())
traced_forward = torch.ops.flexsn_dsl.traced_forward.default
traced_backward = torch.ops.flexsn_dsl.traced_backward.default


def _operators(key: str, like: torch.Tensor) -> tuple:
    """The (forward, backward) operators a compiled step of spec ``key`` calls on inputs like ``like``."""
    if (like.is_cuda and not interpreting() and not launch_settings().autotune
            and (not _REGISTRY[key].info.param_names or all(type(d) is int for d in like.shape))):
        return traced_forward, traced_backward
    return fused_forward, fused_backward


class _CompiledSteps(torch.autograd.Function):
    """The autograd of ``fused_steps`` (traced by torch.compile, not run at each call). ``call``: (key,
    store_seqs, number of inputs, of initial states, of scalar parameters, layout); tensor arguments: the
    seed (or None), inputs, initial states, scalar parameters (0-dim each) and shaped parameters' values."""

    @staticmethod
    def forward(ctx, call: tuple, seed, *tensors):
        key, store_seqs, n_x, n_init, n_params, layout = call
        info = _REGISTRY[key].info
        a, b, c = n_x, n_x + n_init, n_x + n_init + n_params
        xs, inits, params, shaped = list(tensors[:a]), list(tensors[a:b]), tensors[b:c], list(tensors[c:])
        param_vec = _stack(list(params))
        forward, backward = _operators(key, xs[0])
        results = forward(key, store_seqs, xs, inits, param_vec, shaped, list(layout), True, seed)
        n_out, n_saved = info.num_outputs, len(info.saved_names)
        ctx.call, ctx.backward_op = call, backward
        ctx.save_for_backward(seed, param_vec, *shaped, *results[n_out:n_out + n_saved],
                              *[x if keep else None for x, keep in zip(xs, kept_inputs(info))], *results[:n_out])
        ctx.set_materialize_grads(False)  # no zero tensors for final states the loss does not use
        return (*results[:n_out], *results[n_out + n_saved:])

    @staticmethod
    def backward(ctx, *grads):
        key, store_seqs, n_x, n_init, n_params, layout = ctx.call
        info = _REGISTRY[key].info
        seed, param_vec, *tensors = ctx.saved_tensors
        n_shaped = len(layout) // 2  # ((inner, size) per shaped parameter)
        k = n_shaped + len(info.saved_names)
        shaped, saved, xs, outs = tensors[:n_shaped], tensors[n_shaped:k], tensors[k:k + n_x], tensors[k + n_x:]
        result = ctx.backward_op(key, store_seqs, list(grads), saved, xs, outs, param_vec, shaped, list(layout),
                                 n_init > 0, seed)
        grad_x, grad_init = result[:n_x], result[n_x:n_x + n_init]
        grad_params = result[n_x + n_init].unbind(0) if n_params else ()
        rest = iter(result[n_x + n_init + (1 if n_params else 0):])  # the learnable shaped parameters' gradients
        grad_shaped = [next(rest) if name in info.param_names else None for name in info.shaped_names]
        return (None, None, *grad_x, *grad_init, *grad_params, *grad_shaped)


def _fused_steps(key: str, store_seqs: bool, xs: list[torch.Tensor], inits: list[torch.Tensor],
                 params: list[torch.Tensor], shaped: list[torch.Tensor], layout: list[int],
                 seed: torch.Tensor | None) -> list[torch.Tensor]:
    """Outputs, state sequences (if stored), final states; ``params`` holds each learnable scalar parameter
    as a 0-dim tensor (one each, so that each gets its own gradient); see :func:`_fused_forward`. Where no
    gradient is needed, the inference kernels (nothing saved)."""
    compiled = _REGISTRY[key]
    xs, params, shaped = _without_zero_grads(compiled, compiled.info, xs, params, shaped)
    if not _needs_grad(xs, inits, params, shaped):
        return _operators(key, xs[0])[0](key, store_seqs, xs, inits, _stack(params), shaped, layout, False, seed)
    call = (key, store_seqs, len(xs), len(inits), len(params), tuple(layout))
    return list(_CompiledSteps.apply(call, seed, *xs, *inits, *params, *shaped))


_LIBRARY.impl("fused_steps", _fused_steps, "CompositeImplicitAutograd")
fused_steps = torch.ops.flexsn_dsl.fused_steps.default


def register(compiled: Compiled) -> str:
    """Make a spec's kernels reachable by name from the operators (``fused_steps`` and those it calls, for
    torch.compile; the recurrent ones)."""
    _REGISTRY[compiled.module_name] = compiled
    return compiled.module_name


def kernel_params(compiled: Compiled, params: dict[str, torch.Tensor], like: torch.Tensor):
    """The runtime parameters as the kernels take them, in the compute dtype of ``like`` (the
    inputs [T, ...]): each learnable scalar as a 0-dim tensor (INFO.scalar_params' order), and the
    shaped ones' values with their (inner, size) pairs (:func:`shaped_view`)."""
    model = compiled.model  # (not INFO, which imports the kernels: nothing to trace under torch.compile)
    dtype, device = _torch_compute_dtype(like.dtype), like.device
    cast = lambda p: p if p.dtype == dtype and p.device == device else p.to(device=device, dtype=dtype)  # noqa: E731
    scalars = [_scalar(cast(params[n])) for n in model.learnable if not model.parameters[n].shaped]
    shaped, layout = [], []
    for name in model.shaped:
        values, inner, size = shaped_view(cast(params[name]), like.shape[1:])
        shaped.append(values)
        layout += [inner, size]
    return scalars, shaped, layout


def _scalar(p: torch.Tensor) -> torch.Tensor:
    """A one-element parameter as a 0-dim tensor (itself when it is one: no view in the graph)."""
    return p if p.dim() == 0 else p.reshape(())


def _without_zero_grads(compiled: Compiled, info, inputs, scalars, shaped) -> tuple:
    """The inputs, learnable scalars and shaped parameters' values (:func:`kernel_params`), those that
    have no gradient (``info.zero_grads``) detached: not in the graph, so no gradient (None), as on
    the torch backend."""
    zero = info.zero_grads
    if not zero:
        return inputs, scalars, shaped
    model = compiled.model
    names = [n for n in model.learnable if not model.parameters[n].shaped]
    detach = lambda names, values: [v.detach() if n in zero else v for n, v in zip(names, values)]  # noqa: E731
    return detach(model.inputs, inputs), detach(names, scalars), detach(model.shaped, shaped)


def _needs_grad(*groups: Sequence[torch.Tensor]) -> bool:
    """Whether a call on these tensors builds a graph: grad mode on and one of them requires a gradient."""
    return torch.is_grad_enabled() and any(t.requires_grad for group in groups for t in group)


def direct_call(compiled: Compiled, like: torch.Tensor) -> Callable[[torch.Tensor], tuple | None] | None:
    """The call :func:`run_triton` makes for a spec with one input, no runtime parameters and constant
    initial states, from those constants, with less host work per call: ``call(x)`` gives (outputs,
    final states), or None where ``x`` needs the general path: not the shape, dtype or device of
    ``like`` (the inputs [T, ...] it was built for), not contiguous, another mode (``like`` decides:
    training when it needs a gradient, as :func:`run_triton` decides), another current device or other
    launch settings (the caller never calls it under torch.compile). A training call is the general
    path's autograd Function with the arguments worked out once; an inference call allocates and
    launches. None where the spec has more than that, or ``like`` no steps or neurons or another
    layout, or (training) the input's gradient is known to be zero (the general path detaches it)."""
    model = compiled.model
    if len(model.inputs) != 1 or model.runtime_params or model.recurrent or model.draws or not like.is_contiguous():
        return None
    settings = launch_settings()
    plan = _kernels(compiled, like.device.type).plan(like.shape, like.dtype, settings)
    training = _needs_grad([like])
    if not plan.info.initial_values or plan.T == 0 or plan.n == 0 or (training and plan.info.zero_grads):
        return None
    shape, dtype, device, index = like.shape, like.dtype, like.device, like.get_device()
    variant, flags = plan.forwards[False, False, True]
    n_out, n_st, step = plan.n_out, plan.n_st, plan.step_sizes
    steps = (plan, False, 1, (), 0, 0)  # _TritonSteps' call: no state sequences, one input, no parameters
    current = torch.cuda.current_device if like.is_cuda else (lambda: index)

    def call(x: torch.Tensor) -> tuple | None:
        if (x.shape != shape or x.dtype != dtype or x.device != device or not x.is_contiguous()
                or (x.requires_grad and torch.is_grad_enabled()) is not training
                or launch_settings() is not settings or current() != index):
            return None
        if training:
            results = _TritonSteps.apply(steps, x)
            return results[:n_out], results[n_out:]
        outs = [torch.empty_like(x) for _ in range(n_out)]
        finals = [x.new_empty(step) for _ in range(n_st)]
        chunks = _forward_chunks(plan, [x], [x] * n_st, True, [], False)
        plan.launch(variant, [x, *[x] * n_st, *outs, *finals, *chunks], flags)  # (x for the initial states: unread)
        return outs, finals
    return call


def run_triton(compiled: Compiled, inputs: Sequence[torch.Tensor], states: list[torch.Tensor],
               params: dict[str, torch.Tensor], store_seqs: bool, chunk: int = 0):
    """Run T steps with the generated kernels; returns (outputs, final states, state sequences).
    Empty ``states``: start from the spec's constant initial values. ``params`` holds every runtime
    parameter (learnable scalars, and shaped ones that broadcast to a step). ``chunk`` > 0: a training
    call keeps the states every ``chunk`` steps instead of the saved values of every step
    (:class:`_RecomputedSteps`)."""
    model = compiled.model
    like = inputs[0]
    param_list, shaped, layout = kernel_params(compiled, params, like) if params else ([], [], [])
    n_out, n_st = len(model.outputs), len(model.states)
    seed = new_seed(like) if model.draws else None
    if torch.compiler.is_compiling():  # an opaque operator; registered by FlexSN.__init__
        if chunk:
            raise RuntimeError(f"{model.name}: recompute does not run under torch.compile on the Triton backend: "
                               "compile a module loaded without recompute, or run this one eagerly")
        results = fused_steps(compiled.module_name, store_seqs, list(inputs), list(states), param_list, shaped,
                              layout, seed)
        seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
        return list(results[:n_out]), list(results[len(results) - n_st:]), seqs
    # (a bad launch setting is an error even for calls that launch nothing: T=0)
    plan = _kernels(compiled, "cuda" if like.is_cuda else like.device.type).plan(like.shape, like.dtype,
                                                                                  launch_settings())
    inputs, param_list, shaped = _without_zero_grads(compiled, plan.info, inputs, param_list, shaped)
    if not _needs_grad(inputs, states, shaped, param_list):
        with on_device(like):
            outs, _, seqs, finals, _ = _forward(plan, inputs, states, _stack(param_list), shaped, layout, False,
                                                store_seqs, seed=seed)
        return outs, finals, seqs
    call = (plan, store_seqs, len(inputs), tuple(layout), len(shaped), len(param_list))
    with on_device(like):  # (the backward runs on the autograd engine's thread for that device)
        if chunk > 0 and plan.T > 0 and plan.n > 0:
            results = _RecomputedSteps.apply((*call, chunk), *_seed_arg(seed), *param_list, *shaped, *inputs, *states)
        else:
            results = _TritonSteps.apply(call, *_seed_arg(seed), *param_list, *shaped, *inputs, *states)
    outs = list(results[:n_out])
    seqs = list(results[n_out:n_out + n_st]) if store_seqs else []
    return outs, list(results[len(results) - n_st:]), seqs
