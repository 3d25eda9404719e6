"""Why a bf16 autocast training call of one LIF layer takes longer on the host than a float32 one."""
import statistics, time, warnings
import torch
import flexsn_dsl
from torch.profiler import profile, ProfilerActivity

def us(f, n=600, every=20):
    for _ in range(30): f()
    torch.cuda.synchronize(); ts = []
    for k in range(n):
        t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e6)
        if k % every == every - 1: torch.cuda.synchronize()
    torch.cuda.synchronize(); return statistics.median(ts)

def gpu_only(f, n=40):
    ts = []
    for _ in range(n):
        torch.cuda._sleep(2_000_000)
        s = torch.cuda.Event(enable_timing=True); e = torch.cuda.Event(enable_timing=True)
        s.record(); f(); e.record(); torch.cuda.synchronize(); ts.append(s.elapsed_time(e) * 1e3)
    return statistics.median(ts)

lif = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
for dtype, ac in ((torch.float32, False), (torch.bfloat16, True), (torch.bfloat16, False)):
    xx = torch.randn(100, 256, 256, device="cuda", dtype=dtype, requires_grad=True); g = torch.randn_like(xx)
    def fwd():
        lif.reset()
        with torch.autocast("cuda", torch.bfloat16, enabled=ac):
            return lif(xx)
    def both():
        fwd().backward(g)
    tag = f"{dtype} autocast={ac}"
    print(f"{tag}: fwd+bwd host us every20 {us(both):.1f} every1 {us(both, every=1):.1f} fwd-only {us(fwd):.1f}; "
          f"GPU-only us fwd+bwd {gpu_only(both):.1f} fwd {gpu_only(fwd):.1f}")
    torch.cuda.set_sync_debug_mode(1)
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        both(); torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode(0)
    print(f"   syncs reported: {[str(x.message)[:120] for x in w][:4]}")
    for _ in range(10): both()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for _ in range(20): both()
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=14, max_name_column_width=50))
    print(prof.key_averages().table(sort_by="self_cuda_time_total", row_limit=8, max_name_column_width=50))
