"""benchmarks/tile_patterns.py: every way of walking time it compares gives the spikes of the plain
step-at-a-time kernel (a hand-written LIF), in Triton's interpreter on small shapes."""
import importlib.util
from pathlib import Path

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "tile_patterns.py"


def test_every_pattern_gives_the_step_at_a_time_spikes(capsys):
    spec = importlib.util.spec_from_file_location("tile_patterns", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    module.main(["--quick"])
    rows = [line for line in capsys.readouterr().out.splitlines() if "BLOCK=" in line]
    assert len(rows) == 2 * 9  # two shapes: seq, and tile (two stagings), prefetch, split of 4 and 8 steps
    assert all("spikes differing 0.0e+00" in row for row in rows), "\n".join(rows)


def test_the_shorter_chain_gives_the_same_spikes():
    """The ``select`` core (fma, selects) against the generated one's: the same spikes, step-at-a-time and split
    tiles, on values that fire."""
    import torch
    spec = importlib.util.spec_from_file_location("tile_patterns", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    x = torch.rand(37, 40, generator=torch.Generator(torch.get_default_device()).manual_seed(0)) * 3.0
    spikes = []
    for core in ("plain", "select"):
        kernels = module.build([4], core)
        for kernel in (kernels.seq, kernels.split4):
            s = torch.full_like(x, -1.0)
            kernel[(2,)](x, s, 37, 40, BLOCK=32, STAGES=1, num_warps=1)
            spikes.append(s)
    assert 0 < spikes[0].mean() < 1
    assert all(torch.equal(spikes[0], s) for s in spikes[1:])
