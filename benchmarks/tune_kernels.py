"""Kernel-level tuning on the GPU: time the generated LIF kernels directly (no module, no autograd)
for block sizes, warps, pipelining stages and time tiles, against the memory-traffic floor.

Usage: python benchmarks/tune_kernels.py [spec]   (prints the best configs per case last)
TUNE_LONG=1: the few-neuron, many-step cases of issue 27 only, with small blocks and time tiles.
"""
from __future__ import annotations

import itertools
import os
import sys

import torch
import triton
import triton.language as tl
from triton.testing import do_bench

import flexsn_dsl
from flexsn_dsl.bench import copy_bandwidth

spec = sys.argv[1] if len(sys.argv) > 1 else "neurons/lif.yaml"
m = flexsn_dsl.load(spec, backend="triton")
mod = m._compiled.triton_module()
info = mod.INFO
assert info.num_inputs == 1 and info.num_states == 1 and info.num_outputs == 1 and not info.param_names
name = info.neuron
inf_k = getattr(mod, f"{name}_inference_final_state_kernel")
fwd_k = getattr(mod, f"{name}_forward_final_state_kernel")
bwd_k = getattr(mod, f"{name}_backward_kernel")
bw = copy_bandwidth(torch.device("cuda"))
print(f"copy bandwidth {bw / 1e12:.3f} TB/s; saved per step: {info.saved_names} mapping {info.c2k_return_mapping}")
if os.environ.get("TUNE_LONG"):  # only the long-sequence, few-neuron cases, with small blocks and time tiles
    cases = [(T, N, torch.float32) for T, N in ((100, 65536), (500, 65536), (500, 8192), (1000, 8192), (4096, 4096),
                                                (1000, 256))]
    # without tiles, the step-at-a-time loop's pipelining depth; with tiles (the next tile prefetched by the
    # kernel itself: stages only pipeline the steps after the tiles), their size; tiles of 64 compile in seconds
    configs = [(b, 1, st, tc) for b in (16, 32, 64)
               for st, tc in ((4, 1), (8, 1), (16, 1), (2, 8), (2, 16), (2, 32), (2, 64))]
else:
    cases = [(8, 4 << 20, torch.float32), (64, 1 << 20, torch.float32), (1024, 1 << 16, torch.float32),
             (64, 1 << 20, torch.bfloat16), (8, 4 << 20, torch.bfloat16)]
    configs = [(b, w, s, 1) for b, w, s in itertools.product((128, 256, 512, 1024, 2048), (1, 2, 4, 8), (1, 2, 3))
               if 32 * w <= b and b // (32 * w) <= 16]
best_rows = []
# as a module call from reset states makes them: constant initial states, no final-state gradients
FWD_FLAGS = dict(_CONST_INIT=True)
BWD_FLAGS = dict(_HAS_STATE_GRADS=False, _HAS_FINAL_GRADS=False, _WRITE_INIT_GRADS=False)
for T, N, dtype in cases:
    e = torch.tensor([], dtype=dtype).element_size()
    x = torch.rand(T, N, device="cuda").to(dtype)
    init = torch.zeros(N, device="cuda", dtype=dtype)
    s = torch.empty_like(x)
    saved = [torch.empty_like(x) for _ in info.saved_names]
    final = torch.empty_like(init)
    gs, gx = torch.randn_like(x), torch.empty_like(x)
    gfinal, ginit = torch.zeros_like(init), torch.empty_like(init)
    floors = {"inference": 2 * T * N * e / bw * 1e3, "forward": (2 + len(saved)) * T * N * e / bw * 1e3,
              "backward": (2 + len(saved)) * T * N * e / bw * 1e3}
    best = {}
    for b, w, st, tc in configs:
        grid = (triton.cdiv(N, b),)
        kw = dict(_BLOCK=b, _DTYPE=tl.float32, _STAGES=st, _TC=tc, num_warps=w)
        runs = {
            "inference": lambda: inf_k[grid](x, init, s, final, T, N, **FWD_FLAGS, **kw),
            "forward": lambda: fwd_k[grid](x, init, s, *saved, final, T, N, **FWD_FLAGS, **kw),
            "backward": lambda: bwd_k[grid](gs, gfinal, gfinal, *saved, x, s, gx, ginit, T, N, **BWD_FLAGS, **kw),
        }
        for kind, fn in runs.items():
            try:
                ms = do_bench(fn, warmup=10, rep=40, return_mode="median")
            except Exception as exc:  # e.g. out of resources
                print(f"  {kind} B={b} w={w} st={st} tc={tc}: {type(exc).__name__}")
                continue
            if kind not in best or ms < best[kind][0]:
                best[kind] = (ms, b, w, st, tc)
    for kind, (ms, b, w, st, tc) in best.items():
        row = (f"T={T:<5d} N={N:<8d} {str(dtype):15s} {kind:9s} best {ms:.4f} ms  floor {floors[kind]:.4f} ms "
               f"({ms / floors[kind]:.2f}x)  BLOCK={b} warps={w} stages={st} tile={tc}")
        print(row, flush=True)
        best_rows.append(row)
    # the heuristic the runtime uses today
    from flexsn_dsl.triton_plan import Kernels
    from flexsn_dsl.triton_settings import launch_settings
    kernels = Kernels(m._compiled, torch.device("cuda"))
    cfg, cfg_b = (kernels.config(N, T, launch_settings(), d) for d in ("forward", "backward"))
    grid = (triton.cdiv(N, cfg["_BLOCK"]),)
    ms_i = do_bench(lambda: inf_k[grid](x, init, s, final, T, N, _DTYPE=tl.float32, **FWD_FLAGS, **cfg),
                    return_mode="median")
    ms_f = do_bench(lambda: fwd_k[grid](x, init, s, *saved, final, T, N, _DTYPE=tl.float32, **FWD_FLAGS, **cfg),
                    return_mode="median")
    ms_b = do_bench(lambda: bwd_k[grid](gs, gfinal, gfinal, *saved, x, s, gx, ginit, T, N, _DTYPE=tl.float32,
                                        **BWD_FLAGS, **cfg_b), return_mode="median")
    row = (f"T={T:<5d} N={N:<8d} {str(dtype):15s} heuristic {cfg} (backward tile {cfg_b['_TC']}): "
           f"inference {ms_i:.4f} forward {ms_f:.4f} backward {ms_b:.4f}")
    print(row, flush=True)
    best_rows.append(row)
print("\n".join(["", "SUMMARY"] + best_rows))
