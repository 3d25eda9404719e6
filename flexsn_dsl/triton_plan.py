"""How a call is planned: a spec's kernels for one kind of device (:class:`Kernels`: the built-in choice of
block sizes, warps, pipelining, time tiles and chunks, each of which a launch setting may give instead) and the
launch plan of each input shape, dtype and setting (:class:`Plan`, computed once: sizes, grids, each kernel
bound to its launcher in :mod:`flexsn_dsl.triton_launch`, and the keywords of every launch); the tiles of the
tiled backward (:class:`Tiling`); the compiled specs by the key the operators take (:func:`register`)."""
from __future__ import annotations

import functools
import inspect
import itertools
import math
from typing import NamedTuple

import torch
from torch.library import wrap_triton

from .compiler import Compiled
from .interpreter import switched_after_triton
from .names import CORES, VARIANTS, core_name, kernel_name, scan_variant
from .triton_launch import DirectLaunch, _jit_launch
from .triton_settings import (COMPILE_OPTIONS, CPU_BLOCK, CPU_TILE, LONG_NEURONS, MAX_GRID_Y, MAX_PLANS, MIN_COLS,
                              SCAN_GROUP, SCAN_PROGRAMS, SCAN_STEPS, TILE, TILE_CODE, TILE_VALUES, LaunchSettings,
                              _compute_dtype, interpreting, launch_settings, triton)


class Kernels:
    """The kernels of one compiled spec for one kind of device, and the launch plans of its calls."""

    def __init__(self, compiled: Compiled, device: torch.device):
        self.interpret = interpreting()
        self.device_type = device.type
        if device.type != "cuda" and (not self.interpret or switched_after_triton()):
            raise RuntimeError("backend='triton' on CPU tensors runs Triton's interpreter, which must be on "
                               "before Triton is imported (torch.compile, torch._dynamo and torch.utils.checkpoint "
                               "import it): set TRITON_INTERPRET=1, or import flexsn_dsl before them")
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
        self.kept_outputs = kept_outputs(info)
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


def kept_inputs(info) -> tuple[bool, ...]:
    """Whether the backward kernel reads each input: the others are not kept for the backward."""
    return tuple(("input", i) in info.c2k_return_mapping for i in range(len(info.input_names)))


def kept_outputs(info) -> tuple[bool, ...]:
    """Whether an eager call keeps each output for the backward: those the backward kernel reads, and the first
    where it keeps no saved value, input or output otherwise (the backward takes the shape, dtype and device of
    its [T, ...] tensors from one). A spike output that the saved values give again is not held twice."""
    read = tuple(("output", i) in info.c2k_return_mapping for i in range(info.num_outputs))
    if any(read) or info.saved_names or any(kept_inputs(info)):
        return read
    return (True, *read[1:])


@functools.lru_cache(maxsize=None)
def _tuned(kernel):
    configs = [triton.Config({"_BLOCK": b}, num_warps=w) for b, w in
               ((64, 2), (128, 2), (256, 2), (512, 4), (1024, 4), (2048, 8))]
    return triton.autotune(configs=configs, key=["_N", "_DTYPE"])(kernel)


@functools.lru_cache(maxsize=None)
def _kernels(compiled: Compiled, device_type: str) -> Kernels:
    return Kernels(compiled, torch.device(device_type))


_REGISTRY: dict[str, Compiled] = {}  # the compiled specs by their key (Compiled.module_name)


def register(compiled: Compiled) -> str:
    """Make a spec's kernels reachable by name from the operators (``fused_steps`` and those it calls, for
    torch.compile; the recurrent ones)."""
    _REGISTRY[compiled.module_name] = compiled
    return compiled.module_name


def _kernels_for(key: str, like: torch.Tensor) -> Kernels:
    return _kernels(_REGISTRY[key], like.device.type)


def _plan_for(key: str, like: torch.Tensor) -> Plan:
    return _kernels_for(key, like).plan(like.shape, like.dtype, launch_settings())


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
