"""GPU conformance: every spec in neurons/ on the Triton backend against the torch backend, on CUDA.

Prints one line per (spec, dtype, T): the fraction of spikes that differ, and the
relative error (‖a − b‖ / ‖b‖) of final states and of the gradients of the inputs,
initial states and learnable parameters. Also checks torch.compile(fullgraph=True).
Usage: python benchmarks/gpu_check.py [--neurons N] [--steps T ...]
"""
from __future__ import annotations

import argparse
import glob
import sys
import time

import torch

import flexsn_dsl
from flexsn_dsl.compiler import compile_spec


def rel(a: torch.Tensor | None, b: torch.Tensor | None) -> float:
    if a is None or b is None:  # no gradient reached it (torch: None; the fused backward: zeros)
        if a is None and b is None:
            return 0.0
        a, b = (torch.zeros_like(b) if a is None else a), (torch.zeros_like(a) if b is None else b)
        return (a - b).abs().max().item()
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def sizes_for(path: str, n: int) -> dict[str, int] | None:
    """Sizes that let a spec run on inputs [T, n] (a per-neuron shape [N] gets N = n), or None when it
    cannot (per-channel shapes and recurrent specs: tests/test_shaped.py and test_recurrent.py cover them)."""
    model = compile_spec(path).model
    shapes = [model.parameters[p].shape for p in model.shaped]
    if model.recurrent or any(len(shape) != 1 for shape in shapes):
        return None
    return {shape[0]: n for shape in shapes if isinstance(shape[0], str)}


def run(path: str, backend: str, dtype, T: int, n: int, seed: int, compute=None, states_in_loss: bool = True):
    """Outputs, final states and gradients of a loss on the outputs (and final states); inputs drawn
    in ``dtype``, computed in ``compute`` (default dtype)."""
    m = flexsn_dsl.load(path, backend=backend, sizes=sizes_for(path, n)).cuda().to(compute or torch.float32)
    gen = torch.Generator(device="cuda").manual_seed(seed)
    xs = [(torch.rand(T, n, device="cuda", generator=gen) * 2.0).to(dtype).to(compute or dtype).requires_grad_()
          for _ in m.spec.inputs]
    ys = m(*xs)
    ys = ys if isinstance(ys, tuple) else (ys,)
    gen = torch.Generator(device="cuda").manual_seed(seed + 1)
    loss = sum((y.float() * torch.randn(y.shape, device="cuda", generator=gen)).sum() for y in ys)
    if states_in_loss:
        loss = loss + sum((s.float() * torch.randn(s.shape, device="cuda", generator=gen)).sum()
                          for s in m.states.values())
    if loss.requires_grad:  # at T=1 a loss on the outputs alone may not depend on anything learnable
        loss.backward()
    return ([y.detach() for y in ys], [s.detach() for s in m.states.values()], [x.grad for x in xs],
            [p.grad for p in m.parameters()], m)


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--neurons", type=int, default=100_003)
    parser.add_argument("--steps", type=int, nargs="+", default=[1, 8, 64])
    args = parser.parse_args()
    worst = 0.0
    for path in sorted(glob.glob("neurons/*.yaml")):
        if sizes_for(path, args.neurons) is None:
            print(f"{path:28s} skipped: it does not run on [T, n] inputs (per-channel or recurrent; see its GPU tests)")
            continue
        for dtype in (torch.float32, torch.bfloat16):
            for T in args.steps:
                start = time.perf_counter()
                ours = run(path, "triton", dtype, T, args.neurons, 0)
                first = time.perf_counter() - start
                ref = run(path, "torch", dtype, T, args.neurons, 0)
                spikes = max(((a != b).float().mean().item() for a, b in zip(ours[0], ref[0])), default=0.0)
                state = max((rel(a, b) for a, b in zip(ours[1], ref[1])), default=0.0)
                grads = max((rel(a, b) for a, b in zip(ours[2] + ours[3], ref[2] + ref[3])), default=0.0)
                extra = ""
                if dtype == torch.float32:  # also a loss on the outputs alone (no final-state gradients)
                    a = run(path, "triton", dtype, T, args.neurons, 0, states_in_loss=False)
                    b = run(path, "torch", dtype, T, args.neurons, 0, states_in_loss=False)
                    outputs_only = max((rel(u, v) for u, v in zip(a[2] + a[3], b[2] + b[3])), default=0.0)
                    worst = max(worst, grads, outputs_only)
                    extra = f"  grad rel (loss on outputs only) {outputs_only:.2e}"
                if dtype == torch.bfloat16:  # both against float64 on the same (bf16-rounded) inputs
                    exact = run(path, "torch", dtype, T, args.neurons, 0, compute=torch.float64)
                    ours_err = max((rel(a, b) for a, b in zip(ours[2] + ours[3], exact[2] + exact[3])), default=0.0)
                    ref_err = max((rel(a, b) for a, b in zip(ref[2] + ref[3], exact[2] + exact[3])), default=0.0)
                    extra = f"  grad rel to float64: triton {ours_err:.2e}, torch-bf16 {ref_err:.2e}"
                print(f"{path:28s} {str(dtype):15s} T={T:<3d} outputs differ {spikes:.2e}  state rel {state:.2e}  "
                      f"grad rel {grads:.2e}  first call {first:.2f} s{extra}", flush=True)
    # torch.compile(fullgraph=True) around the Triton backend, forward and backward
    m = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
    x = torch.rand(8, 4096, device="cuda", requires_grad=True)
    try:
        compiled = torch.compile(m, fullgraph=True)
        y = compiled(x)
        y.sum().backward()
        g = x.grad.clone()
        x.grad = None
        m.reset()
        y2 = m(x)
        y2.sum().backward()
        print(f"torch.compile(fullgraph=True): outputs equal {torch.equal(y, y2)}, grad rel {rel(g, x.grad):.2e}")
    except Exception as exc:
        print(f"torch.compile(fullgraph=True) FAILED: {type(exc).__name__}: {str(exc)[:400]}")
    print(f"worst float32 gradient relative error: {worst:.2e}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
