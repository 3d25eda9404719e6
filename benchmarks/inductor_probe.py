"""What torch.compile makes of a LIF training step on a GPU: the inductor code (written to a file; the
lines that launch kernels, allocate or copy are printed) and the step's time, eager against compiled.

Usage: python benchmarks/inductor_probe.py OUT.py   (GPU only)
"""
import re
import sys
import time

import torch
from torch._inductor.utils import run_and_get_code
from triton.testing import do_bench

import flexsn_dsl


def main(out: str) -> None:
    m = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
    conv = torch.nn.Conv2d(16, 16, 3, padding=1).cuda()

    def step(x):
        m.reset()
        y = m(conv(x.flatten(0, 1)).unflatten(0, x.shape[:2]))
        y.sum().backward()
        return y

    x = torch.rand(4, 64, 16, 32, 32, device="cuda")
    compiled = torch.compile(step)
    _, codes = run_and_get_code(compiled, x)
    text = "\n\n#####\n\n".join(codes)
    with open(out, "w") as f:
        f.write(text)
    for line in text.splitlines():
        if re.search(r"clone|copy_|fused_forward|fused_backward|\.run\(|empty_strided", line):
            print("CODE:", line.strip()[:160])
    for name, fn in (("eager", step), ("compiled", compiled)):
        fn(x)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(50):
            fn(x)
        host = (time.perf_counter() - start) / 50 * 1e3
        torch.cuda.synchronize()
        print(f"{name}: do_bench {do_bench(lambda: fn(x)):.3f} ms, host {host:.3f} ms")


if __name__ == "__main__":
    main(sys.argv[1])
