"""Where the host time of one call goes on the GPU host: cProfile of many calls."""
import cProfile, io, pstats, statistics, sys, time, timeit
import torch
import flexsn_dsl
from flexsn_dsl import bench, triton_runtime as tr

def prof(f, n, tag, rows=22):
    for _ in range(50): f()
    torch.cuda.synchronize()
    pr = cProfile.Profile(); pr.enable()
    for k in range(n):
        f()
        if k % 20 == 19: torch.cuda.synchronize()
    pr.disable(); torch.cuda.synchronize()
    s = io.StringIO(); pstats.Stats(pr, stream=s).sort_stats("tottime").print_stats(rows)
    print(f"--- {tag} ({n} calls)"); print("\n".join(l[:170] for l in s.getvalue().splitlines()[4:rows + 12]))

def us(f, n=2000):
    for _ in range(50): f()
    torch.cuda.synchronize(); ts = []
    for k in range(n):
        t0 = time.perf_counter(); f(); ts.append((time.perf_counter() - t0) * 1e6)
        if k % 20 == 19: torch.cuda.synchronize()
    torch.cuda.synchronize(); return statistics.median(ts)

mod = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
x = torch.randn(4, 65536, device="cuda")
ours = bench._runner(mod, [x], "inference"); mini = bench.minimal_runner(mod, [x], "inference")
print(f"inference host us: ours {us(ours):.1f} minimal {us(mini):.1f}")
prof(ours, 3000, "ours inference"); prof(mini, 3000, "minimal inference")
# pieces
plan = tr._kernels(mod._compiled, "cuda").plan(x.shape, x.dtype, tr.launch_settings())
outs = [torch.empty_like(x)]; fin = [x.new_empty(x.shape[1:])]
args = [x, x, *outs, *fin, 4, 65536]
launch = plan.launchers["inference_final_state"]; kw = plan.forwards[False, False, True][1]
launch(args, kw); launch(args, kw)
print(f"DirectLaunch call us {us(lambda: launch(args, kw)):.2f}")
kern, consts, _ = next(iter(launch.compiled.values()))
st = tr._current_stream(0)
print(f"kernel.run us {us(lambda: kern.run(*launch.grid, st, kern.function, kern.packed_metadata, None, None, None, *args, *consts)):.2f}")
print(f"empty_like us {us(lambda: torch.empty_like(x)):.2f}; new_empty step {us(lambda: x.new_empty((65536,))):.2f}")
print(f"launch_settings us {us(tr.launch_settings):.2f}; current_device {us(torch.cuda.current_device):.2f}")
jit = plan.kernels["inference_final_state"][plan.grid]
print(f"JIT launch us {us(lambda: jit(*args, **kw)):.2f}")

lif = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
for dtype, ac in ((torch.float32, False), (torch.bfloat16, True)):
    xx = torch.randn(100, 256, 256, device="cuda", dtype=dtype, requires_grad=True); g = torch.randn_like(xx)
    ctx = torch.autocast("cuda", torch.bfloat16, enabled=ac)
    def both():
        lif.reset()
        with ctx:
            y = lif(xx)
        y.backward(g)
    def relu():
        with ctx:
            y = torch.relu(xx)
        y.backward(g)
    print(f"{dtype} autocast={ac}: ours fwd+bwd {us(both, 1000):.1f} us, relu {us(relu, 1000):.1f} us")
    prof(both, 1000, f"ours training {dtype} autocast={ac}", rows=26)
