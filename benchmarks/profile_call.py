"""Where one training call of the Triton backend spends its time (CPU and GPU), LIF T=8, 4M neurons."""
import torch
from torch.profiler import ProfilerActivity, profile

import flexsn_dsl

m = flexsn_dsl.load("neurons/lif.yaml", backend="triton").cuda()
x = torch.rand(8, 4 << 20, device="cuda", requires_grad=True)
g = torch.randn_like(x)


def call():
    m.reset()
    y = m(x)
    return torch.autograd.grad(y, [x], g)


for _ in range(5):
    call()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
    for _ in range(20):
        call()
    torch.cuda.synchronize()
print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25))
print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=10))
