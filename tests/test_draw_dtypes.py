"""The Triton kernels' draws in each compute dtype (issue 38: a float64 kernel computes every value in
float64). Float32 kernels take ``tl.rand4x``/``tl.randn4x``'s numbers, bit for bit; float64 kernels draw
53-bit uniforms, ``(hi * 2**21 + (lo >> 11)) * 2**-53`` with ``hi`` the word of ``tl.randint4x``'s Philox
call (counter ``(offset, 0, 0)``) and ``lo`` that of a second call at ``(offset, 1, 0)``, and normals by
Box-Muller in float64 on pairs of those. Element e of step t takes number e % 4 of the call at offset
``(t * K + k) * ceil(N / 4) + e // 4`` (K draws, k this one's occurrence; see flexsn_dsl/templates.py).

References: the Philox words and float32 numbers recomputed here by Triton's own functions, the
uniform and normal distributions (moments, a Kolmogorov-Smirnov distance), and torch.randn."""
import math

import pytest
import torch
import triton
import triton.language as tl

import flexsn_dsl
from test_noise import DRAWS  # (the spec with two uniform draws and a normal one)

OCCURRENCES = {"a": 0, "b": 1, "n": 2}


def _draws(T: int, N: int, dtype: torch.dtype, seed: int):
    """The spec's draws of one call after ``torch.manual_seed(seed)``, and the call's Philox seed."""
    m = flexsn_dsl.loads(DRAWS, backend="triton")
    torch.manual_seed(seed)
    a, b, n = m(torch.zeros(T, N, dtype=dtype))
    torch.manual_seed(seed)  # (the runtime's first draw: the call's seed; its first step is 0)
    philox_seed = torch.randint(0, 1 << 62, (1,), device=a.device, dtype=torch.int64)
    return {"a": a, "b": b, "n": n}, philox_seed


@triton.jit
def _lane(lane, d0, d1, d2, d3):
    return tl.where(lane == 0, d0, tl.where(lane == 1, d1, tl.where(lane == 2, d2, d3)))


@triton.jit
def _philox_reference(seed_ptr, hi_ptr, lo_ptr, u_ptr, n_ptr, K, k, N, BLOCK: tl.constexpr):
    """Step program_id(0)'s numbers of occurrence k for N elements, all four of each call (4 * calls a row):
    the two Philox words (int64) and tl.rand4x's and tl.randn4x's float32 numbers."""
    t = tl.program_id(0)
    e = tl.arange(0, BLOCK)
    seed = tl.load(seed_ptr)
    calls = (N + 3) // 4
    offset = (t.to(tl.int64) * K + k) * calls + e // 4
    lane, mask, at = e % 4, e < 4 * calls, t * 4 * calls + e
    h0, h1, h2, h3 = tl.randint4x(seed, offset)
    zero = offset.to(tl.uint32) * 0
    l0, l1, l2, l3 = tl.philox(seed, offset.to(tl.uint32), (offset >> 32).to(tl.uint32), zero + 1, zero)
    u0, u1, u2, u3 = tl.rand4x(seed, offset)
    n0, n1, n2, n3 = tl.randn4x(seed, offset)
    tl.store(hi_ptr + at, _lane(lane, h0, h1, h2, h3).to(tl.int64), mask=mask)
    tl.store(lo_ptr + at, _lane(lane, l0, l1, l2, l3).to(tl.int64), mask=mask)
    tl.store(u_ptr + at, _lane(lane, u0, u1, u2, u3), mask=mask)
    tl.store(n_ptr + at, _lane(lane, n0, n1, n2, n3), mask=mask)


def _reference(philox_seed: torch.Tensor, T: int, N: int, k: int):
    device = philox_seed.device
    width = (N + 3) // 4 * 4
    hi, lo = (torch.empty(T, width, dtype=torch.int64, device=device) for _ in range(2))
    u, n = (torch.empty(T, width, dtype=torch.float32, device=device) for _ in range(2))
    _philox_reference[(T,)](philox_seed, hi, lo, u, n, len(OCCURRENCES), k, N, BLOCK=triton.next_power_of_2(width))
    return hi, lo, u, n


def test_float32_kernels_draw_exactly_triton_rand4x_and_randn4x():
    """Float32 draws are tl.rand4x's and tl.randn4x's numbers of their counters, bit for bit (what they were
    before float64 kernels drew their own)."""
    T, N = 5, 37
    draws, philox_seed = _draws(T, N, torch.float32, seed=11)
    for name, k in OCCURRENCES.items():
        _, _, u, n = _reference(philox_seed, T, N, k)
        expected = (n if name == "n" else u)[:, :N]
        assert draws[name].dtype == torch.float32
        assert torch.equal(draws[name].view(torch.int32), expected.view(torch.int32)), name


def test_float64_kernels_draw_53_bit_uniforms_and_float64_box_muller_normals():
    """Float64 uniforms take 53 random bits from two Philox calls of their counter; normals are Box-Muller
    in float64 on uniforms 0, 1 (numbers 0 and 1 of a call: r cos, r sin) and 2, 3."""
    T, N = 5, 37
    draws, philox_seed = _draws(T, N, torch.float64, seed=12)
    for name, k in OCCURRENCES.items():
        hi, lo, _, _ = _reference(philox_seed, T, N, k)
        u = (hi * 2 ** 21 + (lo >> 11)).double() * 2.0 ** -53  # (exact: integers below 2**53)
        if name != "n":
            assert torch.equal(draws[name], u[:, :N]), name
            continue
        e = torch.arange(N, device=u.device)
        first = e - e % 2  # (the pair of numbers 0, 1 or 2, 3 of the element's call)
        r = torch.sqrt(-2.0 * torch.log(1.0 - u[:, first]))
        angle = 2 * math.pi * u[:, first + 1]
        expected = torch.where(e % 2 == 0, r * torch.cos(angle), r * torch.sin(angle))
        torch.testing.assert_close(draws["n"], expected, rtol=1e-13, atol=1e-14)


def test_float64_draws_have_53_bits_and_their_distributions():
    """A seeded sample: uniforms are multiples of 2**-53 and, in [0.5, 1), almost never of 2**-24 (a float32
    number there is one); normals are not float32 numbers; moments, and Kolmogorov-Smirnov distances to
    U(0, 1) and to torch.randn's float64 sample, within bounds a correct generator meets."""
    draws, _ = _draws(32, 256, torch.float64, seed=5)
    a, n = draws["a"].flatten().cpu(), draws["n"].flatten().cpu()
    count = a.numel()
    assert a.dtype == n.dtype == torch.float64 and a.min() >= 0 and a.max() < 1
    scaled = a * 2.0 ** 53
    assert torch.equal(scaled, scaled.round())
    upper = a[a >= 0.5] * 2.0 ** 24
    assert (upper != upper.round()).double().mean() > 0.99
    assert (n.float().double() != n).double().mean() > 0.99
    assert abs(a.mean().item() - 0.5) < 4 * math.sqrt(1 / 12 / count)
    assert abs(n.mean().item()) < 4 / math.sqrt(count) and abs(n.var().item() - 1) < 0.05
    grid = torch.arange(1, count + 1, dtype=torch.float64, device="cpu") / count
    assert (a.sort().values - grid).abs().max() < 1.95 / math.sqrt(count)  # KS, p < 0.001
    reference = torch.randn(count, generator=torch.Generator().manual_seed(0), dtype=torch.float64,
                            device="cpu")
    both = torch.cat([n, reference])
    order = torch.argsort(both)
    steps = torch.where(order < count, 1.0, -1.0).double() / count  # empirical CDF difference along the sort
    assert steps.cumsum(0).abs().max() < 1.95 * math.sqrt(2 / count)  # two-sample KS, p < 0.001
