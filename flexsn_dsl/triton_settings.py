"""The launch settings and the numbers every launch is bounded by (the first stage of a Triton call).

A call of the Triton backend goes: these settings, read from the environment at each call
(:func:`launch_settings`); the plan of the call's shape (:mod:`flexsn_dsl.triton_plan`: block sizes,
time tiles, grids, keywords), whose kernels launch through :mod:`flexsn_dsl.triton_launch`; the forward
and backward passes (:mod:`flexsn_dsl.triton_autograd`), or the operators that torch.compile traces
(:mod:`flexsn_dsl.triton_operators`); :mod:`flexsn_dsl.triton_runtime` is the entry. This module also
switches Triton's interpreter on where there is no GPU, before it imports Triton: the other modules get
Triton from here."""
from __future__ import annotations

import functools
import os
from typing import NamedTuple

import torch

from .interpreter import use_interpreter_without_gpu

use_interpreter_without_gpu()  # (no GPU: the generated kernels run in Triton's interpreter)

import triton  # noqa: E402

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


def interpreting() -> bool:
    """Whether Triton runs kernels through its interpreter in this process."""
    knobs = getattr(triton, "knobs", None)
    if knobs is not None:
        return bool(knobs.runtime.interpret)
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def _compute_dtype(dtype: torch.dtype):
    import triton.language as tl
    return tl.float64 if dtype == torch.float64 else tl.float32


def _torch_compute_dtype(dtype: torch.dtype) -> torch.dtype:
    return torch.float64 if dtype == torch.float64 else torch.float32
