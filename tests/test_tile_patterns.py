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
