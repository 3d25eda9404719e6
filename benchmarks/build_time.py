"""Build time (check + generate both backends' source, no GPU, no kernel compile) of
synthetic specs growing in step lines and in states, up to the limits.

    python benchmarks/build_time.py [--max-lines 1000] [--repeat 1]

Families (N = the size on the table's row):
- ``chain``: a dendrite of N lines, ``a{i}: 0.9 * a{i-1} + 0.1 * x`` ending in a spike and the
  reset of the one state (the backward reruns or saves along the whole chain);
- ``states``: N coupled states, ``v{i}: 0.9 * v{i} + 0.1 * v{i-1} + x``, and a spike of the last
  (N states and N + 1 step lines);
- ``compartments``: N / 3 LIF compartments, each ``h, s, v`` (three lines and one state),
  coupled to the previous compartment's spike.

Each row is one fresh build (``compile_spec`` on new text, then ``torch_source`` and
``triton_source``), timed with ``time.perf_counter``; the ``ratio`` column is the time over
the previous row's time, the growth exponent ``log(ratio) / log(size ratio)`` (1 linear, 2
quadratic). A benchmark, not a test: it prints numbers and never fails on them.
"""
from __future__ import annotations

import argparse
import math
import os
import platform
import time

from flexsn_dsl.compiler import compile_spec


def chain(n: int) -> str:
    lines = ["  a0: v + x"] + [f"  a{i}: 0.9 * a{i - 1} + 0.1 * x" for i in range(1, n - 2)]
    lines += [f"  s: spike(a{n - 3} - 1.0)", f"  v: a{n - 3} * (1 - s)"]
    return "neuron: chain\nstates: {v: 0.0}\nstep:\n" + "\n".join(lines) + "\noutputs: [s]\n"


def states(n: int) -> str:
    inits = "".join(f"  v{i}: 0.0\n" for i in range(n))
    lines = [f"  v0: 0.9 * v0 + x"] + [f"  v{i}: 0.9 * v{i} + 0.1 * v{i - 1} + x" for i in range(1, n)]
    lines.append(f"  s: spike(v{n - 1} - 1.0)")
    return f"neuron: states\nstates:\n{inits}step:\n" + "\n".join(lines) + "\noutputs: [s]\n"


def compartments(n: int) -> str:
    k = max(1, n // 3)
    inits = "".join(f"  v{i}: 0.0\n" for i in range(k))
    lines = []
    for i in range(k):
        drive = "x" if i == 0 else f"x + 0.5 * s{i - 1}"
        lines += [f"  h{i}: v{i} + ({drive} - v{i}) / 2.0", f"  s{i}: spike(h{i} - 1.0)", f"  v{i}: h{i} * (1 - s{i})"]
    return f"neuron: comp\nstates:\n{inits}step:\n" + "\n".join(lines) + f"\noutputs: [s{k - 1}]\n"


def build_seconds(text: str) -> float:
    start = time.perf_counter()
    compiled = compile_spec(text=text)
    compiled.torch_source  # noqa: B018 - generate
    compiled.triton_source  # noqa: B018
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--max-lines", type=int, default=1000)
    parser.add_argument("--repeat", type=int, default=1, help="builds per row (the fastest counts)")
    args = parser.parse_args()
    print(f"python {platform.python_version()}, {os.cpu_count()} CPUs, {platform.processor() or platform.machine()}")
    sizes = sorted({n for n in (25, 50, 100, 200, 400, 800) if n < args.max_lines - 1} | {args.max_lines - 1})
    build_seconds(chain(10))  # warm-up: imports, sympy's caches of the common functions
    print(f"{'family':<13}{'size':>6}{'lines':>7}{'states':>7}{'seconds':>10}{'ratio':>8}{'exponent':>10}")
    for name, family in (("chain", chain), ("states", states), ("compartments", compartments)):
        previous = None
        for n in sizes:
            text = family(n)
            if family is states and n + 1 > args.max_lines:
                n -= 1
                text = family(n)
            seconds = min(build_seconds(text) for _ in range(args.repeat))
            model = compile_spec(text=text).model
            ratio = exponent = ""
            if previous is not None:
                r = seconds / previous[1]
                ratio, exponent = f"{r:.2f}", f"{math.log(r) / math.log(n / previous[0]):.2f}"
            print(f"{name:<13}{n:>6}{len(model.steps):>7}{len(model.states):>7}{seconds:>10.3f}{ratio:>8}{exponent:>10}",
                  flush=True)
            previous = (n, seconds)


if __name__ == "__main__":
    main()
