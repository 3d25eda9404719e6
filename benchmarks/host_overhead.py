"""Where the host time of one eager training call goes (LIF, T=8, 4M neurons, CUDA).

Each piece is timed on the host only (perf_counter around the call, no waiting for the GPU
except every 20 calls; medians of 200 calls after warm-up): what Python, autograd and the
launchers cost while the GPU runs behind. Usage: python benchmarks/host_overhead.py [spec]
"""
from __future__ import annotations

import gc
import sys

import torch
import triton.language as tl

import flexsn_dsl
from flexsn_dsl import triton_runtime as tr
from flexsn_dsl.bench import host_ms


def host_us(fn) -> float:
    return host_ms(torch.device("cuda"), fn, calls=200, warmup=20) * 1e3


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a.view_as(a)

    @staticmethod
    def backward(ctx, grad):
        return grad


spec = sys.argv[1] if len(sys.argv) > 1 else "neurons/lif.yaml"
m = flexsn_dsl.load(spec, backend="triton").cuda()
T, n = 8, 4 << 20
x = torch.rand(T, n, device="cuda", requires_grad=True)
g = torch.randn_like(x)
k = tr._kernels(m._compiled, "cuda")
info = k.info
assert info.num_inputs == 1 and info.num_outputs == 1 and not info.param_names, "a LIF-like spec"
xd = x.detach()
outs = [torch.empty_like(x) for _ in info.output_names]
saved = [torch.empty_like(x) for _ in info.saved_names]
finals = [torch.empty(n, device="cuda") for _ in info.state_names]
gx = torch.empty_like(x)
st = info.num_states
fwd_args = [xd, *finals, *outs, *saved, *finals, T, n]
bwd_args = [g, *[gx] * st, *[gx] * st, *saved, xd, *outs, gx, *[gx] * st, T, n]
const = {"_CONST_INIT": True} if info.initial_values else {}


def inference():
    m.reset()
    with torch.no_grad():
        return m(x)


def forward():
    m.reset()
    return m(x)


def training():
    m.reset()
    return torch.autograd.grad(m(x), [x], g)


def training_kept():
    m.reset()
    return torch.autograd.grad(m(x), [x], g, retain_graph=True)


def training_backward_call():
    m.reset()
    m(x).backward(g)


rows = {
    "launch forward kernel": lambda: k.launch("forward_final_state", n, fwd_args, _DTYPE=tl.float32, **const),
    "launch backward kernel": lambda: k.launch("backward", n, bwd_args, _DTYPE=tl.float32, _HAS_STATE_GRADS=False,
                                               _HAS_FINAL_GRADS=False, _WRITE_INIT_GRADS=False),
    "torch.empty_like x4": lambda: [torch.empty_like(x) for _ in range(4)],
    "autograd.grad of an identity Function": lambda: torch.autograd.grad(Identity.apply(x), [x], g),
    "module inference call": inference,
    "module forward (grad enabled)": forward,
    "module training call (forward + autograd.grad)": training,
}
for name, fn in rows.items():
    print(f"{name:50s} {host_us(fn):8.1f} us", flush=True)
m.reset()
y = m(x)
rows = {
    "autograd.grad of a kept module graph": lambda: torch.autograd.grad(y, [x], g, retain_graph=True),
    "_backward called directly": lambda: tr._backward(k, False, x.shape, [g, None], saved, [xd], outs, None, False),
    "training call, graph kept (retain_graph)": training_kept,
    "training call with .backward()": training_backward_call,
}
for name, fn in rows.items():
    print(f"{name:50s} {host_us(fn):8.1f} us", flush=True)
gc.disable()
print(f"{'training call, gc disabled':50s} {host_us(training):8.1f} us", flush=True)
print(f"{'module forward, gc disabled':50s} {host_us(forward):8.1f} us", flush=True)
gc.enable()
