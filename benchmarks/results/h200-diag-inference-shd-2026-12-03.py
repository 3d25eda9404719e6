"""Diagnostics: inference per call (do_bench vs GPU-only vs host), and SHD bf16 host time."""
import json, statistics, sys, time
sys.path.insert(0, "benchmarks")
import torch
import flexsn_dsl
from flexsn_dsl import bench
from triton.testing import do_bench
from torch.profiler import profile, ProfilerActivity

def host(f, calls=200):
    torch.cuda.synchronize(); ts = []
    for k in range(calls):
        t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e6)
        if k % 20 == 19: torch.cuda.synchronize()
    torch.cuda.synchronize(); return statistics.median(ts)

def gpu_only(f, n=60):
    ts = []
    for _ in range(n):
        torch.cuda._sleep(1_000_000)
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)

def throughput(f, n=300):
    torch.cuda.synchronize(); t0 = time.perf_counter()
    for _ in range(n): f()
    torch.cuda.synchronize(); return (time.perf_counter() - t0) / n * 1e6

def trace(f, tag, iters=12):
    cache = torch.empty(256 * 2**20 // 4, dtype=torch.int, device="cuda")
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            cache.zero_(); s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
            s.record(); f(); e.record()
        torch.cuda.synchronize()
    path = f"/tmp/trace_{tag}.json"; prof.export_chrome_trace(path)
    ev = [x for x in json.load(open(path))["traceEvents"] if x.get("cat") in ("kernel", "gpu_memset", "gpu_memcpy")]
    ev.sort(key=lambda x: x["ts"])
    rows = [(x["name"][:40], round(x["ts"], 1), round(x["dur"], 2)) for x in ev[-8:]]
    gaps = []
    for a, b in zip(ev, ev[1:]):
        if "elementwise" in a["name"] or "fill" in a["name"].lower() or "memset" in a["cat"]:
            if "lif" in b["name"]:
                gaps.append(round(b["ts"] - (a["ts"] + a["dur"]), 2))
    print(tag, "last kernels:", rows); print(tag, "gap memset-end -> lif start (us):", gaps)

print("== inference per call (us)")
mod = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
for T, n in ((4, 65536), (4, 262144), (8, 65536), (8, 262144)):
    x = torch.randn(T, n, device="cuda")
    runs = {"ours": bench._runner(mod, [x], "inference"), "minimal": bench.minimal_runner(mod, [x], "inference")}
    for f in runs.values():
        f(); f()
    for name, f in runs.items():
        db = do_bench(f, warmup=50, rep=200, return_mode="median") * 1e3
        print(f"T={T} n={n} {name:8s} do_bench {db:7.2f}  gpu_only {gpu_only(f):7.2f}  host {host(f):7.2f}  "
              f"throughput {throughput(f):7.2f}")
    if (T, n) == (4, 65536):
        for name, f in runs.items():
            trace(f, name)

print("== SHD host per step (ms) and op counts")
from network import make_step
for variant in ("relu", "ours"):
    for column in ("eager", "bf16"):
        step = make_step("shd", variant, column, "cuda", False)
        for _ in range(5): step()
        torch.cuda.synchronize()
        hs = []
        for _ in range(30):
            torch.cuda.synchronize(); t0 = time.perf_counter(); step(); hs.append((time.perf_counter() - t0) * 1e3)
        print(f"shd {variant} {column}: host {statistics.median(hs):.3f} ms  min {min(hs):.3f}")
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(10): step()
            torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=22, max_name_column_width=55))

print("== one LIF layer [100,256,256] training call, host us (fwd / fwd+bwd issue)")
lif = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
for dtype, ac in ((torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)):
    x = torch.randn(100, 256, 256, device="cuda", dtype=dtype, requires_grad=True)
    g = torch.randn_like(x)
    def fwd():
        lif.reset()
        with torch.autocast("cuda", torch.bfloat16, enabled=ac):
            return lif(x)
    def both():
        y = fwd(); y.backward(g)
    for f in (fwd, both):
        f(); f()
    print(f"{dtype} autocast={ac}: fwd {host(fwd, 100):.1f} us, fwd+bwd {host(both, 100):.1f} us")
    relu = lambda: torch.relu(x).backward(g)
    print(f"   relu fwd+bwd {host(relu, 100):.1f} us")

print("== SHD compile vs eager: cProfile of 20 steps (relu)")
import cProfile, pstats, io
import torch._dynamo
for variant in ("relu", "ours"):
    for column in ("eager", "compile"):
        torch._dynamo.reset()
        step = make_step("shd", variant, column, "cuda", False)
        for _ in range(5): step()
        torch.cuda.synchronize()
        torch._dynamo.utils.counters.clear()
        pr = cProfile.Profile(); pr.enable()
        for _ in range(20): step()
        torch.cuda.synchronize(); pr.disable()
        s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(18)
        print(f"--- {variant} {column}; dynamo counters: {dict((k, dict(v)) for k, v in torch._dynamo.utils.counters.items() if v)}")
        print("\n".join(s.getvalue().splitlines()[:45]))
