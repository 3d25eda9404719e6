"""examples/ddp.py under torchrun with two processes: on CPUs (gloo, the GPUs hidden), and on two
GPUs (NCCL, the Triton backend) where the machine has them. One step's gradients equal one
process's on the same global batch, for DDP and FSDP; training runs eager and compiled."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parent.parent
SMALL = ["--batch", "2", "--widths", "4", "4", "8", "8", "-T", "2"]


PLACES = ["cpus", pytest.param("gpus", marks=pytest.mark.skipif(torch.cuda.device_count() < 2,
                                                                reason="needs two GPUs (NCCL: one process a GPU)"))]


def torchrun(*args: str, tmp_path: Path, place: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FLEXSN_DSL_CACHE=str(tmp_path / "cache"), OMP_NUM_THREADS="1",
               PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if place == "cpus":
        env["CUDA_VISIBLE_DEVICES"] = ""  # ddp.py runs on the GPUs it sees
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
           str(ROOT / "examples" / "ddp.py"), *args, *SMALL]
    return subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=600)


@pytest.mark.slow
@pytest.mark.parametrize("place", PLACES)
@pytest.mark.parametrize("engine, spec", [("ddp", "plif"), ("fsdp", "plif"), ("fsdp", "plif_channel")])
def test_two_processes_give_the_gradients_of_one(engine, spec, place, tmp_path):
    """A scalar learnable parameter (FSDP cannot shard it: all-reduced by hand) and a per-channel one."""
    run = torchrun("--engine", engine, "--neuron", str(ROOT / "neurons" / f"{spec}.yaml"), "--check", "--tol", "1e-5",
                   tmp_path=tmp_path, place=place)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    line = next(ln for ln in run.stdout.splitlines() if ln.startswith("check:"))
    assert "(4 of them ours)" in line  # the learnable w in each of the four blocks was compared


@pytest.mark.slow
@pytest.mark.parametrize("place", PLACES)
def test_compiled_ddp_training_runs(place, tmp_path):
    """DDP over the compiled network: dynamo traces our layers and splits the graph at DDP's buckets; on the CPUs
    without inductor's C++ code generation (a minute there; inductor itself is tested on one process)."""
    backend = "aot_eager" if place == "cpus" else "inductor"
    run = torchrun("--engine", "ddp", "--compile", "--compile-backend", backend, "--steps", "2", "--warmup", "1",
                   tmp_path=tmp_path, place=place)
    assert run.returncode == 0, run.stdout + run.stderr[-3000:]
    assert "images/s" in run.stdout
