"""Where the host time of one eager training call goes (LIF, T=8, 4M neurons unless given, CUDA).

Each piece is timed on the host only (perf_counter around the call, no waiting for the GPU
except every 20 calls; medians of 200 calls after warm-up): what Python, autograd and the
launchers cost while the GPU runs behind. ``--profile``: instead, ``torch.profiler``'s table of 10 training
calls (where their CPU time goes, and the kernels' GPU time).

Usage: python benchmarks/host_overhead.py [spec [T n]] [--profile]
"""
from __future__ import annotations

import argparse
import gc

import torch

import flexsn_dsl
from flexsn_dsl.triton_autograd import _backward
from flexsn_dsl.bench import _runner, host_ms, minimal_runner
from flexsn_dsl.triton_plan import _kernels
from flexsn_dsl.triton_settings import launch_settings


def host_us(fn) -> float:
    return host_ms(torch.device("cuda"), fn, calls=200, warmup=20) * 1e3


class Identity(torch.autograd.Function):
    @staticmethod
    def forward(ctx, a):
        return a.view_as(a)

    @staticmethod
    def backward(ctx, grad):
        return grad


parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("spec", nargs="?", default="neurons/lif.yaml")
parser.add_argument("T", nargs="?", type=int, default=8)
parser.add_argument("n", nargs="?", type=int, default=4 << 20)
parser.add_argument("--profile", action="store_true", help="print torch.profiler's table of training calls instead")
args = parser.parse_args()
m = flexsn_dsl.load(args.spec, backend="triton").cuda()
T, n = args.T, args.n
x = torch.rand(T, n, device="cuda", requires_grad=True)
g = torch.randn_like(x)
k = _kernels(m._compiled, "cuda")
info = k.info
assert info.num_inputs == 1 and info.num_outputs == 1 and not info.param_names, "a LIF-like spec"
xd = x.detach()
plan = k.plan(x.shape, x.dtype, launch_settings())
outs = [torch.empty_like(x) for _ in info.output_names]
saved = [torch.empty_like(x) for _ in info.saved_names]
finals = [torch.empty(n, device="cuda") for _ in info.state_names]
gx = torch.empty_like(x)
st = info.num_states
fwd_args = [xd, *finals, *outs, *saved, *finals]
bwd_args = [g, *[gx] * st, *[gx] * st, *saved, xd, *outs, gx, *[gx] * st]


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


if args.profile:
    from network import profile_step  # (benchmarks/ is on sys.path when run)
    profile_step(training, "cuda")
    raise SystemExit(0)
rows = {
    "launch forward kernel": lambda: plan.launch("forward_final_state", fwd_args, plan.const_init),
    "launch backward kernel": lambda: plan.launch("backward", bwd_args, plan.backward_flags[False, False, False]),
    "torch.empty_like x4": lambda: [torch.empty_like(x) for _ in range(4)],
    "autograd.grad of an identity Function": lambda: torch.autograd.grad(Identity.apply(x), [x], g),
    "module inference call": inference,
    "module forward (grad enabled)": forward,
    "module training call (forward + autograd.grad)": training,
    "minimal Function inference call (host floor)": minimal_runner(m, [x], "inference"),
    "minimal Function training call (host floor)": minimal_runner(m, [x], "training"),
    "bench's flexsn-dsl training call": _runner(m, [x], "training"),
}
for name, fn in rows.items():
    print(f"{name:50s} {host_us(fn):8.1f} us", flush=True)
m.reset()
y = m(x)
rows = {
    "autograd.grad of a kept module graph": lambda: torch.autograd.grad(y, [x], g, retain_graph=True),
    "_backward called directly": lambda: _backward(plan, False, [g, None], saved, [xd], outs, None, [], [], False),
    "training call, graph kept (retain_graph)": training_kept,
    "training call with .backward()": training_backward_call,
}
for name, fn in rows.items():
    print(f"{name:50s} {host_us(fn):8.1f} us", flush=True)
gc.disable()
print(f"{'training call, gc disabled':50s} {host_us(training):8.1f} us", flush=True)
print(f"{'module forward, gc disabled':50s} {host_us(forward):8.1f} us", flush=True)
gc.enable()
