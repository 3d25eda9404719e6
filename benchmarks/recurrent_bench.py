"""The SHD-shaped recurrent SNN (700 -> N recurrent LIF -> 20, T=100, B=256): one training step,
and the recurrent layer alone against its FLOP and memory floors, at N = 128, 256 and 512.

Variants of the recurrent layer (the rest of the network is the same torch code):
``loop`` a hand-written torch loop (``r = s @ W.T`` each step, the sigmoid surrogate of
``neurons/rlif.yaml``), ``ours-torch`` the module on the torch backend (the same loop, generated),
``ours`` the module on the Triton backend (the fused kernel: ``tl.dot`` inside the time loop).

One training step = forward, cross-entropy on the time-averaged readout, backward, SGD step,
``zero_grad``. The layer alone = forward and backward of the recurrent layer on a given input
[T, B, N] (gradients of the input and W). Floors: FLOPs 6·T·B·N² (forward W·s, backward Wᵀ·g and
the weight gradient), bytes the [T, B, N] tensors the kernels read and write (9 for rlif); the floor
is max(FLOPs / --peak-tflops, bytes / --peak-tbps) (defaults: an H200, float32 FMA / bf16 tensor
cores, HBM3e).

Usage: ``python benchmarks/recurrent_bench.py [--n 128 256 512] [--bf16] [--json FILE]`` on a GPU;
``--quick`` runs tiny shapes on the CPU (Triton's interpreter: a smoke test, no meaningful times).
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl

ROOT = Path(__file__).resolve().parent.parent
PEAK_TFLOPS = {torch.float32: 67.0, torch.bfloat16: 989.0}  # H200 SXM: fp32 FMA, bf16 dense tensor cores
PEAK_TBPS = 4.8


class SigmoidSpike(torch.autograd.Function):
    """Heaviside forward, sigmoid surrogate (alpha=4) backward: rlif.yaml's default surrogate."""

    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return (x >= 0).to(x.dtype)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        sg = torch.sigmoid(4.0 * x)
        return grad * 4.0 * sg * (1 - sg)


class LoopRLIF(nn.Module):
    """neurons/rlif.yaml by hand: h = v + (x + s_prev @ W.T - v) / 2, s = H(h - 1), v = h (1 - s)."""

    def __init__(self, n: int):
        super().__init__()
        self.r_weight = nn.Parameter(torch.empty(n, n))
        nn.init.kaiming_uniform_(self.r_weight, a=5 ** 0.5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        v = s = x.new_zeros(x.shape[1:])
        w = self.r_weight.to(x.dtype)
        out = []
        for t in range(x.shape[0]):
            h = v + (x[t] + s @ w.T - v) / 2.0
            s = SigmoidSpike.apply(h - 1.0)
            v = h * (1 - s)
            out.append(s)
        return torch.stack(out)

    def reset(self) -> None:
        pass


def layer(variant: str, n: int, device: str) -> nn.Module:
    if variant == "loop":
        return LoopRLIF(n).to(device)
    backend = "torch" if variant == "ours-torch" else "triton"
    return flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", sizes={"N": n}, backend=backend).to(device)


class Net(nn.Module):
    def __init__(self, rec: nn.Module, channels: int, n: int, classes: int = 20):
        super().__init__()
        self.fc_in, self.rec, self.fc_out = nn.Linear(channels, n), rec, nn.Linear(n, classes)

    def forward(self, x):
        self.rec.reset()
        return self.fc_out(self.rec(self.fc_in(x)).mean(0))


def timed_ms(fn, device: str, repeat: int) -> float:
    """Median milliseconds of ``fn`` (CUDA: triton's do_bench; CPU: wall clock over ``repeat`` calls)."""
    fn()
    if device == "cuda":
        import triton.testing
        return triton.testing.do_bench(fn, return_mode="median")
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append((time.perf_counter() - start) * 1e3)
    return statistics.median(times)


def sequences_moved(info) -> int:
    """[T, B, N] tensors the fused kernels and the weight gradient read or write (from the kernels'
    FlexSNInfo): forward reads the inputs and writes outputs, saved values and r (if the backward
    reads it); backward reads the output gradients and the values its core reads, writes the input
    and r gradients; the weight gradient reads the r gradients and the outputs fed back."""
    n_in = len(info.input_names)  # the recurrent input included
    read = {tuple(entry) for entry in info.c2k_return_mapping}
    r_kept = ("input", n_in - 1) in read
    return (n_in - 1 + len(info.output_names) + len(info.saved_names) + r_kept) + \
        (len(info.output_names) + len(read) + n_in) + 2


def floors(T: int, B: int, n: int, dtype: torch.dtype, sequences: int, peak_tflops: float, peak_tbps: float) -> dict:
    """FLOPs, bytes and the floor (ms) of the recurrent layer's forward and backward."""
    flops = 6 * T * B * n * n
    nbytes = sequences * T * B * n * torch.finfo(dtype).bits // 8
    return {"gflop": flops / 1e9, "mbytes": nbytes / 1e6,
            "floor_ms": max(flops / (peak_tflops * 1e12), nbytes / (peak_tbps * 1e12)) * 1e3}


def run(args) -> list[dict]:
    rows = []
    dtype = torch.bfloat16 if args.bf16 else torch.float32
    for n in args.n:
        gen = torch.Generator().manual_seed(0)
        x = (torch.rand(args.T, args.B, args.channels, generator=gen) < 0.05).float().to(args.device)
        y = torch.randint(0, 20, (args.B,), generator=gen).to(args.device)
        current = torch.randn(args.T, args.B, n, generator=gen).to(args.device, dtype) + 0.6
        for variant in args.variants:
            if variant == "ours" and args.device != "cuda" and not args.quick:
                continue  # the interpreter is for correctness, not timing
            torch.manual_seed(0)
            net = Net(layer(variant, n, args.device), args.channels, n).to(args.device)
            opt = torch.optim.SGD(net.parameters(), lr=1e-3)

            def train_step():
                with torch.autocast(args.device, dtype=torch.bfloat16, enabled=args.bf16):
                    loss = nn.functional.cross_entropy(net(x).float(), y)
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=True)

            rec = net.rec
            inp = current.clone().requires_grad_(True)

            def layer_step():
                rec.reset()
                rec(inp).float().sum().backward()

            row = {"N": n, "variant": variant, "dtype": str(dtype).removeprefix("torch."),
                   "step_ms": timed_ms(train_step, args.device, args.repeat),
                   "layer_ms": timed_ms(layer_step, args.device, args.repeat)}
            info = flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", sizes={"N": n}).info
            row.update(floors(args.T, args.B, n, dtype, sequences_moved(info), args.peak_tflops or PEAK_TFLOPS[dtype],
                              args.peak_tbps))
            row["layer_vs_floor"] = row["layer_ms"] / row["floor_ms"]
            rows.append(row)
            print(f"N={n:4d} {variant:10s} step {row['step_ms']:9.2f} ms   layer {row['layer_ms']:9.2f} ms   "
                  f"floor {row['floor_ms']:.3f} ms ({row['gflop']:.2f} GFLOP, {row['mbytes']:.1f} MB)   "
                  f"x{row['layer_vs_floor']:.1f}", flush=True)
    return rows


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--variants", nargs="+", default=["loop", "ours-torch", "ours"],
                   choices=["loop", "ours-torch", "ours"])
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--B", type=int, default=256)
    p.add_argument("--channels", type=int, default=700)
    p.add_argument("--bf16", action="store_true", help="autocast the network and a bf16 layer input")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--repeat", type=int, default=5, help="CPU timing repeats")
    p.add_argument("--peak-tflops", type=float, default=None, help="default: H200 fp32 FMA 67, bf16 989")
    p.add_argument("--peak-tbps", type=float, default=PEAK_TBPS)
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.T, args.B, args.channels, args.repeat = [16, 24], 6, 18, 40, 1
    return args


def main(argv=None) -> int:
    args = parse(argv)
    print(f"recurrent SHD-shaped step: T={args.T}, B={args.B}, {args.channels} -> N -> 20, device={args.device}")
    rows = run(args)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
