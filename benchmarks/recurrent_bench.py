"""The SHD-shaped recurrent SNN (700 -> N recurrent LIF -> 20, T=100, B=256): one training step,
and the recurrent layer alone against its FLOP and memory floors, at N = 128, 256 and 512.

Variants of the recurrent layer (the rest of the network is the same torch code):
``loop``       a hand-written torch loop (``r = s @ W.T`` each step, ``neurons/rlif.yaml``'s sigmoid surrogate);
``ours-step``  flexsn-dsl ``neurons/lif.yaml`` with ``step_mode="s"`` in a Python loop, the recurrence
               by hand (``nn.Linear`` without bias): how a recurrent net was written before ``recurrent:``;
``ours-torch`` ``neurons/rlif.yaml`` on the torch backend (the same loop, generated);
``ours``       ``neurons/rlif.yaml`` on the Triton backend (one fused kernel: ``tl.dot`` inside the time loop);
``snntorch``   snnTorch ``RLeaky`` (all-to-all, hard reset, sigmoid surrogate slope 4) stepped in a loop;
``sj``         SpikingJelly ``LinearRecurrentContainer(LIFNode)`` (multi-step; its recurrence is
               ``Linear(2N -> N)`` over [x, s_prev]).
Peers that are not installed are skipped with the reason printed.

One training step = forward, cross-entropy on the time-averaged readout, backward, SGD step,
``zero_grad``. The layer alone = forward and backward of the recurrent layer on a given input
[T, B, N] (gradients of the input and W). Floors: FLOPs 6·T·B·N² (forward W·s, backward Wᵀ·g and
the weight gradient), bytes the [T, B, N] tensors the fused kernels read and write (from the
kernels' FlexSNInfo); the floor is max(FLOPs / peak FLOP/s, bytes / peak bandwidth), with the peak
of the precision the fused kernel's product runs at (defaults, an H200 SXM, dense, TFLOP/s: float32
with ``$FLEXSN_DSL_RECURRENT_PRECISION`` tf32x3 (the default) 494.7 / 3 (3xTF32: three TF32
tensor-core products), tf32 494.7, ieee 67 (FMA); bfloat16 989; HBM3e 4.8 TB/s). The precision
is printed in the header and stored in each row. ``grad err`` compares ``ours`` with ``ours-torch``
on the same weights and input: max |dW - dW_ref| / max |dW_ref| (float32: ~5e-7 with tf32x3 or
ieee, ~5e-3 with tf32).

Usage (GPU, ~2-3 minutes on an H200): ``python benchmarks/recurrent_bench.py [--json FILE]``;
``--quick`` runs tiny shapes on the CPU (Triton's interpreter: a smoke test, no meaningful times).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch import nn

import flexsn_dsl
from flexsn_dsl.bench import _timer
from flexsn_dsl.triton_settings import launch_settings
from torch_cpu import SigmoidSpike  # rlif.yaml's surrogate (benchmarks/ is on sys.path when run)

ROOT = Path(__file__).resolve().parent.parent
TF32_TFLOPS = 494.7  # H200 SXM, dense TF32 tensor cores
PEAK_TFLOPS = {"tf32x3": TF32_TFLOPS / 3, "tf32": TF32_TFLOPS, "ieee": 67.0, "bf16": 989.0}  # ieee: fp32 FMA
PEAK_TBPS = 4.8
VARIANTS = ("loop", "ours-step", "ours-torch", "ours", "snntorch", "sj")
FLOOR_VARIANTS = ("loop", "ours-torch", "ours")  # the layer alone against the floors


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


class StepLoopRLIF(nn.Module):
    """A flexsn-dsl LIF in single-step mode, the recurrence written around it in Python."""

    def __init__(self, n: int, backend: str):
        super().__init__()
        self.lif = flexsn_dsl.load(ROOT / "neurons" / "lif.yaml", step_mode="s", backend=backend)
        self.rec = nn.Linear(n, n, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = x.new_zeros(x.shape[1:])
        out = []
        for t in range(x.shape[0]):
            s = self.lif(x[t] + self.rec(s))
            out.append(s)
        return torch.stack(out)

    def reset(self) -> None:
        self.lif.reset()


class SnnTorchRLIF(nn.Module):
    """snnTorch RLeaky (beta = 0.5 as tau = 2, hard reset to zero), stepped over T."""

    def __init__(self, n: int):
        super().__init__()
        import snntorch
        from snntorch import surrogate
        self.cell = snntorch.RLeaky(beta=0.5, linear_features=n, spike_grad=surrogate.sigmoid(slope=4),
                                    reset_mechanism="zero", all_to_all=True)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        spk, mem = x.new_zeros(x.shape[1:]), x.new_zeros(x.shape[1:])
        out = []
        for t in range(x.shape[0]):
            spk, mem = self.cell(x[t], spk, mem)
            out.append(spk)
        return torch.stack(out)

    def reset(self) -> None:
        pass


class SpikingJellyRLIF(nn.Module):
    """SpikingJelly LinearRecurrentContainer around a single-step LIFNode, run multi-step."""

    def __init__(self, n: int):
        super().__init__()
        from spikingjelly.activation_based import layer, neuron, surrogate
        lif = neuron.LIFNode(tau=2.0, surrogate_function=surrogate.Sigmoid(alpha=4.0), detach_reset=False,
                             step_mode="s")
        self.body = layer.LinearRecurrentContainer(lif, n, n, bias=False, step_mode="m")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.body(x)

    def reset(self) -> None:
        from spikingjelly.activation_based import functional
        functional.reset_net(self.body)


def unavailable(variant: str) -> str | None:
    """Why ``variant`` cannot run here, or None."""
    peers = {"snntorch": "snntorch", "sj": "spikingjelly.activation_based"}
    if variant in peers:
        try:
            __import__(peers[variant])
        except ImportError as exc:
            return f"not installed ({exc})"
    return None


def recurrent_layer(variant: str, n: int, device: str) -> nn.Module:
    """The recurrent LIF layer of ``variant`` with ``n`` neurons, on ``device``."""
    fused = "triton" if device == "cuda" else "torch"
    if variant == "loop":
        layer = LoopRLIF(n)
    elif variant == "ours-step":
        layer = StepLoopRLIF(n, fused)
    elif variant in ("ours", "ours-torch"):
        backend = "torch" if variant == "ours-torch" else "triton"
        layer = flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", sizes={"N": n}, backend=backend)
    elif variant == "snntorch":
        layer = SnnTorchRLIF(n)
    elif variant == "sj":
        layer = SpikingJellyRLIF(n)
    else:
        raise ValueError(variant)
    return layer.to(device)


class Net(nn.Module):
    def __init__(self, rec: nn.Module, channels: int, n: int, classes: int = 20):
        super().__init__()
        self.fc_in, self.rec, self.fc_out = nn.Linear(channels, n), rec, nn.Linear(n, classes)

    def forward(self, x):
        self.rec.reset()
        return self.fc_out(self.rec(self.fc_in(x)).mean(0))


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


def product_precision(dtype: torch.dtype) -> str:
    """How the fused kernel multiplies: float32 at ``$FLEXSN_DSL_RECURRENT_PRECISION``, bfloat16 in bf16."""
    return launch_settings().recurrent_precision if dtype == torch.float32 else "bf16"


def floors(T: int, B: int, n: int, dtype: torch.dtype, sequences: int, peak_tflops: float, peak_tbps: float) -> dict:
    """FLOPs, bytes and the floor (ms) of the recurrent layer's forward and backward."""
    flops = 6 * T * B * n * n
    nbytes = sequences * T * B * n * torch.finfo(dtype).bits // 8
    return {"gflop": flops / 1e9, "mbytes": nbytes / 1e6, "peak_tflops": peak_tflops,
            "floor_ms": max(flops / (peak_tflops * 1e12), nbytes / (peak_tbps * 1e12)) * 1e3}


def grad_error(n: int, args, dtype: torch.dtype) -> float:
    """max |dW(ours) - dW(ours-torch)| / max |dW(ours-torch)| on the same weights and input."""
    gen = torch.Generator().manual_seed(1)
    x = (torch.randn(args.T, args.B, n, generator=gen) + 0.6).to(args.device, dtype)
    grads = []
    ref = recurrent_layer("ours-torch", n, args.device)
    for layer in (ref, recurrent_layer("ours", n, args.device)):
        layer.load_state_dict(ref.state_dict())
        layer(x).float().sum().backward()
        grads.append(layer.r_weight.grad.float())
    return float((grads[0] - grads[1]).abs().max() / grads[0].abs().max())


def run(args) -> list[dict]:
    rows = []
    timer = _timer(torch.device(args.device), repeats=args.repeat, warmup_ms=25, rep_ms=100)
    for dtype_name in args.dtypes:
        dtype = getattr(torch, dtype_name)
        for n in args.n:
            gen = torch.Generator().manual_seed(0)
            x = (torch.rand(args.T, args.B, args.channels, generator=gen) < 0.05).float().to(args.device)
            y = torch.randint(0, 20, (args.B,), generator=gen).to(args.device)
            current = (torch.randn(args.T, args.B, n, generator=gen) + 0.6).to(args.device, dtype)
            info = flexsn_dsl.load(ROOT / "neurons" / "rlif.yaml", sizes={"N": n}).info
            precision = product_precision(dtype)
            floor = floors(args.T, args.B, n, dtype, sequences_moved(info), args.peak_tflops or PEAK_TFLOPS[precision],
                           args.peak_tbps)
            variants = args.variants if dtype == torch.float32 else [v for v in args.variants if v in FLOOR_VARIANTS]
            for variant in variants:
                head = f"{dtype_name:8s} N={n:4d} {variant:10s}"
                why = unavailable(variant)
                if why:
                    print(f"{head} skipped: {why}", flush=True)
                    rows.append({"N": n, "variant": variant, "dtype": dtype_name, "precision": precision,
                                 "skipped": why})
                    continue
                torch.manual_seed(0)
                net = Net(recurrent_layer(variant, n, args.device), args.channels, n).to(args.device)
                opt = torch.optim.SGD(net.parameters(), lr=1e-3)

                def train_step():
                    with torch.autocast(args.device, dtype=dtype, enabled=dtype != torch.float32):
                        loss = nn.functional.cross_entropy(net(x).float(), y)
                    loss.backward()
                    opt.step()
                    opt.zero_grad(set_to_none=True)

                rec = net.rec
                inp = current.clone().requires_grad_(True)

                def layer_step():
                    rec.reset()
                    rec(inp).float().sum().backward()

                row = {"N": n, "variant": variant, "dtype": dtype_name, "precision": precision,
                       "step_ms": timer(train_step), "layer_ms": timer(layer_step), **floor}
                row["layer_vs_floor"] = row["layer_ms"] / row["floor_ms"]
                if variant == "ours":
                    row["grad_err"] = grad_error(n, args, dtype)
                rows.append(row)
                extra = f"   grad err {row['grad_err']:.1e}" if "grad_err" in row else ""
                print(f"{head} step {row['step_ms']:9.2f} ms   layer {row['layer_ms']:9.2f} ms   floor "
                      f"{row['floor_ms']:.3f} ms ({row['gflop']:.2f} GFLOP at {row['peak_tflops']:.1f} TFLOP/s, "
                      f"{row['mbytes']:.1f} MB)   "
                      f"x{row['layer_vs_floor']:.1f}{extra}", flush=True)
    return rows


def summary(rows: list[dict]) -> None:
    """The fused training step against the fastest other variant, per dtype and N."""
    for (dtype, n) in dict.fromkeys((r["dtype"], r["N"]) for r in rows):
        timed = {r["variant"]: r["step_ms"] for r in rows if (r["dtype"], r["N"]) == (dtype, n) and "step_ms" in r}
        others = {v: ms for v, ms in timed.items() if v != "ours"}
        if "ours" in timed and others:
            best = min(others, key=others.get)
            print(f"{dtype} N={n}: ours {timed['ours']:.2f} ms per training step, {others[best] / timed['ours']:.1f}x "
                  f"faster than the fastest other ({best}, {others[best]:.2f} ms)")


def parse(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--n", type=int, nargs="+", default=[128, 256, 512])
    p.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    p.add_argument("--dtypes", nargs="+", default=["float32", "bfloat16"], choices=["float32", "bfloat16"],
                   help="bfloat16: autocast network and a bf16 layer input, for " + ", ".join(FLOOR_VARIANTS))
    p.add_argument("--T", type=int, default=100)
    p.add_argument("--B", type=int, default=256)
    p.add_argument("--channels", type=int, default=700)
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=("cuda", "cpu"))
    p.add_argument("--repeat", type=int, default=5, help="CPU timing repeats")
    p.add_argument("--peak-tflops", type=float, default=None,
                   help="default (H200 SXM): the product's precision, tf32x3 164.9, tf32 494.7, ieee 67, bf16 989")
    p.add_argument("--peak-tbps", type=float, default=PEAK_TBPS)
    p.add_argument("--quick", action="store_true", help="tiny shapes on the CPU (a smoke test)")
    p.add_argument("--json", type=Path, help="write the rows here")
    args = p.parse_args(argv)
    if args.quick:
        args.n, args.T, args.B, args.channels, args.repeat = [16, 24], 6, 18, 40, 1
    elif args.device == "cpu" and "ours" in args.variants:
        args.variants = [v for v in args.variants if v != "ours"]
        print("(ours skipped on the CPU: Triton's interpreter is for correctness, not timing; --quick runs it)")
    return args


def main(argv=None) -> int:
    args = parse(argv)
    start = time.perf_counter()
    print(f"recurrent SHD-shaped step: T={args.T}, B={args.B}, {args.channels} -> N -> 20, device={args.device}"
          + (f" ({torch.cuda.get_device_name()})" if args.device == "cuda" else "")
          + f", float32 recurrent product: {product_precision(torch.float32)} (FLEXSN_DSL_RECURRENT_PRECISION)")
    rows = run(args)
    summary(rows)
    print(f"total {time.perf_counter() - start:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
