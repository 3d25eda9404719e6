"""Train a spiking VGG-style network on several processes with torch's DDP or FSDP.

Launch with torchrun (NCCL on GPUs, gloo on CPUs)::

    torchrun --standalone --nproc_per_node 2 examples/ddp.py --engine ddp --check
    torchrun --standalone --nproc_per_node 2 examples/ddp.py --engine fsdp --neuron neurons/plif_channel.yaml
    torchrun --standalone --nproc_per_node 2 examples/ddp.py --engine ddp --compile --steps 50

The data are synthetic CIFAR-shaped tensors ([T=4, B, 3, 32, 32], 10 classes): this shows how
our modules behave under torch's distributed engines, not an accuracy.

- Each rank holds its neurons' carried states itself and calls ``reset()`` after every step:
  states are plain tensors, neither parameters nor buffers, so DDP never broadcasts them.
- ``--check`` runs one step and compares every gradient (ours included) with one process
  computing the same global batch on rank 0. On GPUs BatchNorm is converted to
  ``SyncBatchNorm``, so that reference is the plain global batch; on CPUs (gloo has no
  SyncBatchNorm) the reference averages the per-rank losses, each rank's BatchNorm using its
  own statistics, which is what DDP computes.
- FSDP (``fully_shard``) shards parameters along their first dimension: 0-dim parameters
  (a scalar learnable time constant) cannot be sharded, so they are left out of sharding
  (``ignored_params``) and their gradients are all-reduced here by hand. A per-channel
  parameter (``shape: [C, 1, 1]``) is sharded like any other.
- ``--compile`` compiles the network (DDP splits its graph at its buckets); ``--compile-backend aot_eager``
  traces and splits it the same way without inductor's code generation (seconds instead of a minute on a CPU).
- Throughput: ``--steps N`` times N steps after warm-up and prints images per second over all
  ranks, and with ``--profile`` the share of the step spent in NCCL kernels.
"""
from __future__ import annotations

import argparse
import copy
import gc
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

import flexsn_dsl
from flexsn_dsl import PerStep

ROOT = Path(__file__).resolve().parent.parent


def vgg(spec: Path, widths: tuple[int, ...], backend: str) -> nn.Sequential:
    layers, c = [], 3
    for i, w in enumerate(widths):
        conv = PerStep(nn.Conv2d(c, w, 3, padding=1, bias=False), nn.BatchNorm2d(w))
        layers += [conv, flexsn_dsl.load(spec, backend=backend, sizes={"C": w})]  # C: per-channel parameters
        if i % 2 == 1:
            layers.append(PerStep(nn.MaxPool2d(2)))
        c = w
    layers.append(PerStep(nn.Flatten(), nn.Linear(c * 8 * 8, 10)))
    return nn.Sequential(*layers)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(model(x).mean(0), y)


def batch(step: int, global_batch: int, T: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """The global batch of a step (the same on every rank; each rank takes its slice)."""
    g = torch.Generator().manual_seed(1000 + step)
    x = torch.rand(T, global_batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (global_batch,), generator=g)
    return x.to(device), y.to(device)


def wrap(model: nn.Module, engine: str, device) -> tuple[nn.Module, list[nn.Parameter]]:
    """The distributed model, and the parameters whose gradients this script all-reduces itself."""
    if engine == "ddp":
        return nn.parallel.DistributedDataParallel(model, device_ids=[device] if device.type == "cuda" else None), []
    from torch.distributed.fsdp import fully_shard
    scalars = [p for p in model.parameters() if p.dim() == 0]
    for m in model:
        if any(p.dim() > 0 for p in m.parameters(recurse=True)):
            fully_shard(m, ignored_params=set(scalars))
    fully_shard(model, ignored_params=set(scalars))
    return model, scalars


def full_grad(p: nn.Parameter) -> torch.Tensor:
    g = p.grad
    return g.full_tensor() if hasattr(g, "full_tensor") else g


def check(args, model: nn.Module, reference: nn.Module | None, device, rank: int, world: int) -> int:
    """One step on all ranks against one process on rank 0; returns the exit status."""
    dist_model, manual = wrap(model, args.engine, device)
    x, y = batch(0, args.batch * world, args.T, device)
    shard = slice(rank * args.batch, (rank + 1) * args.batch)
    loss_of(dist_model, x[:, shard], y[shard]).backward()
    for p in manual:
        dist.all_reduce(p.grad)
        p.grad /= world
    grads = {n: full_grad(p).detach().cpu() for n, p in model.named_parameters()}
    status = 0
    if rank == 0:
        if device.type == "cuda":
            loss_of(reference, x, y).backward()
        else:  # per-rank BatchNorm statistics, as DDP computes them on gloo; fresh states per shard
            for r in range(world):
                part = slice(r * args.batch, (r + 1) * args.batch)
                (loss_of(reference, x[:, part], y[part]) / world).backward()
                flexsn_dsl.reset_net(reference)
        worst = 0.0
        for n, p in reference.named_parameters():
            ref = p.grad.detach().cpu()
            err = (grads[n] - ref).abs().max().item() / max(ref.abs().max().item(), 1e-12)
            worst = max(worst, err)
        ours = [n for n, m in reference.named_modules() if isinstance(m, flexsn_dsl.FlexSN)
                for pn, _ in m.named_parameters(prefix=n)]
        print(f"check: {len(grads)} parameter gradients ({len(ours)} of them ours), "
              f"max relative error {worst:.3g} (tolerance {args.tol:g})")
        status = 0 if worst <= args.tol else 1
    flexsn_dsl.reset_net(model)
    return status


def train(args, model: nn.Module, device, rank: int, world: int) -> None:
    if args.compile:  # compile the network itself; DDP's and FSDP's own Python stays eager
        # FSDP's hooks split the network into one graph per block: each block (and each of our
        # layers, one per shape) is a cache entry of the same code object
        torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
        model.compile(dynamic=False, backend=args.compile_backend)
    forward, manual = wrap(model, args.engine, device)
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def step(i: int) -> torch.Tensor:
        x, y = batch(i, args.batch * world, args.T, device)
        shard = slice(rank * args.batch, (rank + 1) * args.batch)
        loss = loss_of(forward, x[:, shard], y[shard])
        loss.backward()
        for p in manual:
            dist.all_reduce(p.grad)
            p.grad /= world
        opt.step()
        opt.zero_grad(set_to_none=True)
        flexsn_dsl.reset_net(model)
        return loss

    for i in range(args.warmup):
        step(i)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    sync()
    dist.barrier()
    t0 = time.perf_counter()
    for i in range(args.steps):
        loss = step(args.warmup + i)
    sync()
    seconds = time.perf_counter() - t0
    if rank == 0:
        rate = args.steps * args.batch * world / seconds
        print(f"{args.engine}{' + compile' if args.compile else ''}: {world} process(es), batch {args.batch} "
              f"per rank, {args.steps} steps in {seconds:.2f} s: {rate:.1f} images/s; last loss {loss.item():.4f}")
    if args.profile and device.type == "cuda":
        from torch.profiler import ProfilerActivity, profile
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for i in range(5):
                step(10_000 + i)
            sync()
        events = [e for e in prof.key_averages() if e.device_time_total]
        total = sum(e.device_time_total for e in events)
        nccl = sum(e.device_time_total for e in events if "nccl" in e.key.lower())
        if rank == 0:
            print(f"profile: GPU kernel time per step {total / 5e3:.2f} ms, NCCL {nccl / 5e3:.2f} ms "
                  f"({100 * nccl / max(total, 1e-9):.1f}%)")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description="Spiking VGG under DDP or FSDP (launch with torchrun).")
    p.add_argument("--engine", choices=("ddp", "fsdp"), default="ddp")
    p.add_argument("--neuron", type=Path, default=ROOT / "neurons" / "plif.yaml")
    p.add_argument("--batch", type=int, default=64, help="batch per rank")
    p.add_argument("-T", type=int, default=4)
    p.add_argument("--widths", type=int, nargs="+", default=[64, 128, 256, 256])
    p.add_argument("--check", action="store_true", help="compare one step's gradients with one process")
    p.add_argument("--tol", type=float, default=1e-4)
    p.add_argument("--compile", action="store_true")
    p.add_argument("--compile-backend", default="inductor",
                   help="torch.compile's backend for --compile (aot_eager: traced and split as inductor's, run eagerly)")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--profile", action="store_true")
    args = p.parse_args(argv)
    if len(args.widths) != 4:
        p.error("--widths takes four channel counts")
    if "RANK" not in os.environ:
        p.error("launch with torchrun, e.g. torchrun --standalone --nproc_per_node 2 examples/ddp.py")
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", 0))) if cuda else torch.device("cpu")
    if cuda:
        torch.cuda.set_device(device)
    torch.manual_seed(0)
    model = vgg(args.neuron, tuple(args.widths), "triton" if cuda else "torch")
    if cuda:
        model = nn.SyncBatchNorm.convert_sync_batchnorm(model)
    model = model.to(device)
    for m in model.modules():  # states are per rank: never parameters or buffers that DDP would broadcast
        if isinstance(m, flexsn_dsl.FlexSN):
            assert not any(b is s for b in m.buffers() for s in m.states.values())
    try:
        if args.check:
            reference = None
            if rank == 0:
                reference = copy.deepcopy(model)
                if cuda:
                    reference = _plain_batchnorm(reference)
            status = check(args, model, reference, device, rank, world)
        else:
            train(args, model, device, rank, world)
            status = 0
        # every rank's outstanding collectives end before any rank tears its group down (a rank that
        # left early was aborted by gloo: "terminate called without an active exception")
        dist.barrier()
        return status
    finally:
        del model
        gc.collect()  # DDP's reducer and its pending gloo work go while the group is alive
        dist.destroy_process_group()


def _plain_batchnorm(model: nn.Module) -> nn.Module:
    """The same model with ``SyncBatchNorm`` turned back into ``BatchNorm2d`` (one process, global batch)."""
    for name, child in model.named_children():
        if isinstance(child, nn.SyncBatchNorm):
            bn = nn.BatchNorm2d(child.num_features, child.eps, child.momentum, child.affine,
                                child.track_running_stats).to(child.weight.device)
            bn.load_state_dict(child.state_dict())
            setattr(model, name, bn)
        else:
            _plain_batchnorm(child)
    return model


if __name__ == "__main__":
    code = main()
    # gloo's worker threads can still hold work whose tensors need the interpreter: tearing them
    # down during interpreter finalization aborts the process (SIGABRT) after it has done its job,
    # so a finished rank leaves without finalization
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
