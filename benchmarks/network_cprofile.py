"""Where the Python time of a network step goes: cProfile of 30 SHD steps (``benchmarks/network.py``'s
steps), ReLU against ours, compiled and under bf16 autocast; the 22 largest self times of each.

Usage: python benchmarks/network_cprofile.py   (GPU only)
"""
import cProfile
import io
import pstats

import torch

import network  # (benchmarks/ is on sys.path when run)


def main(steps: int = 30) -> None:
    for column in ("compile", "bf16"):
        for variant in ("relu", "ours"):
            step = network.make_step("shd", variant, column, "cuda", False)
            for _ in range(5):
                step()
            torch.cuda.synchronize()
            profiler = cProfile.Profile()
            profiler.enable()
            for _ in range(steps):
                step()
            profiler.disable()
            torch.cuda.synchronize()
            text = io.StringIO()
            stats = pstats.Stats(profiler, stream=text)
            stats.sort_stats("tottime").print_stats(22)
            print(f"===== shd {variant} {column}: total {stats.total_tt / steps * 1e3:.3f} ms/step (profiled)")
            print("\n".join(line for line in text.getvalue().splitlines()
                            if line.strip() and "Ordered" not in line and "List reduced" not in line))


if __name__ == "__main__":
    main()
