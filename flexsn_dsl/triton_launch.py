"""How a planned kernel is launched: Triton's JIT (``kernel[grid](...)``), or on a GPU the direct launch of
the kernel it compiled (:class:`DirectLaunch`). Each kernel of a :class:`~flexsn_dsl.triton_plan.Plan` is
bound to one of these, which :meth:`~flexsn_dsl.triton_plan.Plan.launch` calls with (args, keywords)."""
from __future__ import annotations

import functools
from typing import Callable

import torch

from .triton_settings import MAX_PLANS, triton  # (Triton imported after the interpreter's switch)


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
