"""The Hopper primitives (csrc/common/sm90_{mbarrier,tma,wgmma}.cuh + glm5_fastpath/jit/tma.py) in
isolation: one CTA loads A [64, K] and B [N, K] (e4m3, K-major) by TMA with 128-byte swizzle into
shared memory, one warpgroup runs wgmma m64nNk32 over K, and every thread writes its accumulator
fragment to D [64, N] (fp32) at the (row, column) the documented fragment layout gives.

Operands are small exactly representable values (|x| <= 2, multiples of 1/2), so every product
and partial sum is exact in fp32 and the result must equal torch's bit for bit: any mistake in the
descriptor (start address, SBO, swizzle bits), the K-slice advance, the TMA box / swizzle, the
fragment layout or the barrier phases shows as a mismatch, with the first wrong (row, col)
reported. Variants: every N the skinny GEMM uses (8..128) plus 256, one and several 128-wide K
steps (scale_d = 0 then 1, barrier phase flips), rows / tokens past the tensor end (TMA zero fill).

CPU part: the test kernel compiles for sm_90a (nvcc, no GPU) without spills. tensor_map_2d's own
CPU tests are in tests/jit/test_tma.py.
"""
from __future__ import annotations

import ctypes

import pytest
import torch

FP8 = torch.float8_e4m3fn

KERNEL = r"""
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_tma.cuh"
#include "common/sm90_wgmma.cuh"

using namespace glm5::sm90;

// One warpgroup (128 threads). smem: A stage 64 x 128 B (8 KB) at a 1024-aligned base, B stage
// N x 128 B after it, one mbarrier. K loop: TMA A and B boxes of K step kb, wait, 4 wgmma (k32
// slices), wait for the MMA, CTA barrier (the stage is reused), next step.
template <int N>
__device__ void tile(const CUtensorMap* ma, const CUtensorMap* mb, float* out, int K) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t raw = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t sa = (raw + 1023u) & ~1023u;
    const uint32_t sb = sa + 64 * 128;
    const uint32_t bar = sb + ((N * 128 + 1023) / 1024) * 1024;
    const int tid = threadIdx.x;
    if (tid == 0) {
        tma_prefetch_desc(ma);
        tma_prefetch_desc(mb);
        mbar_init(bar, 1);
        fence_barrier_init();
    }
    __syncthreads();
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = -1.0f;  // scale_d = 0 on the first MMA must ignore this
    for (int kb = 0; kb < K / 128; ++kb) {
        if (tid == 0) {
            mbar_arrive_expect_tx(bar, 64 * 128 + N * 128);
            tma_load_2d(ma, sa, bar, kb * 128, 0);
            tma_load_2d(mb, sb, bar, kb * 128, 0);
        }
        mbar_wait(bar, kb & 1);
        fence_operands(d);
        wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < 4; ++kk)
            wgmma_m64k32_e4m3<N>(d, smem_desc_k128sw(sa + 32 * kk), smem_desc_k128sw(sb + 32 * kk), (kb > 0 || kk > 0) ? 1 : 0);
        wgmma_commit();
        wgmma_wait<0>();
        fence_operands(d);
        __syncthreads();  // every warp's MMA has read the stage before the next TMA overwrites it
    }
    const int lane = tid & 31, w = tid >> 5, g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
            const int row = 16 * w + g + 8 * (e >> 1), col = 8 * j + 2 * t + (e & 1);
            out[row * N + col] = d[4 * j + e];
        }
}

#define GLM5_TEST_TILE(N)                                                                                       \
    extern "C" __global__ void __launch_bounds__(128, 1) sm90_prim_tile_n##N(                                 \
        const __grid_constant__ CUtensorMap ma, const __grid_constant__ CUtensorMap mb, float* out, int K) { \
        tile<N>(&ma, &mb, out, K);                                                                            \
    }
GLM5_TEST_TILE(8)
GLM5_TEST_TILE(16)
GLM5_TEST_TILE(32)
GLM5_TEST_TILE(64)
GLM5_TEST_TILE(128)
GLM5_TEST_TILE(256)
"""
NS = (8, 16, 32, 64, 128, 256)


def _spec():
    from glm5_fastpath.jit import KernelSpec
    return KernelSpec("sm90_primitives_test", code=KERNEL, functions=tuple(f"sm90_prim_tile_n{n}" for n in NS))


# ---- CPU ------------------------------------------------------------------------------------------

# Every primitive instantiated once (ptxas only sees the PTX of functions that are used), incl. the
# wgmma N the tile test below does not run and the wrappers the GEMM does not use (setmaxnreg,
# expect_tx, inval, cache hints, cp.async arrive).
EVERY_PRIMITIVE = r"""
#include "common/sm90_mbarrier.cuh"
#include "common/sm90_tma.cuh"
#include "common/sm90_wgmma.cuh"
using namespace glm5::sm90;

template <int N>
__device__ void mma_n(float* out, uint32_t a, uint32_t b) {
    float d[N / 2];
#pragma unroll
    for (int i = 0; i < N / 2; ++i) d[i] = 0.0f;
    fence_operands(d);
    wgmma_fence();
    wgmma_m64k32_e4m3<N>(d, smem_desc_k128sw(a), smem_desc_k128sw(b), 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_operands(d);
    float s = 0.0f;
#pragma unroll
    for (int i = 0; i < N / 2; ++i) s += d[i];
    out[threadIdx.x] += s;
}

extern "C" __global__ void __launch_bounds__(384, 1) sm90_every_primitive(const __grid_constant__ CUtensorMap map,
                                                                          float* out, const uint4* src) {
    extern __shared__ __align__(1024) uint8_t smem[];
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem));
    const uint32_t bar = base + 65536, bar2 = bar + 8;
    if (threadIdx.x >= 256) {
        setmaxnreg_dec<40>();
        if (threadIdx.x == 256) {
            mbar_init(bar, 1);
            mbar_init(bar2, 32);
            fence_barrier_init();
            tma_prefetch_desc(&map);
            mbar_expect_tx(bar, 8192);
            mbar_arrive(bar);
            tma_load_2d(&map, base, bar, 0, 0);
            tma_load_2d_hint(&map, base + 4096, bar, 128, 0, l2_policy_evict_first());
            tma_load_2d_hint(&map, base + 4096, bar, 128, 0, l2_policy_evict_last());
            mbar_wait(bar, 0);
            (void)mbar_try_wait(bar, 1);
            mbar_arrive_expect_tx(bar, 0);
        }
        if (threadIdx.x < 288) {
            asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(base + 16 * threadIdx.x), "l"(src + threadIdx.x));
            cp_async_16_mbar_arrive(bar2);
            mbar_wait(bar2, 0);
            fence_proxy_async_smem();
            if (threadIdx.x == 256) mbar_inval(bar2);
        }
        return;
    }
    setmaxnreg_inc<232>();
    mma_n<8>(out, base, base + 8192);
    mma_n<16>(out, base, base + 8192);
    mma_n<24>(out, base, base + 8192);
    mma_n<32>(out, base, base + 8192);
    mma_n<48>(out, base, base + 8192);
    mma_n<64>(out, base, base + 8192);
    mma_n<96>(out, base, base + 8192);
    mma_n<128>(out, base, base + 8192);
    mma_n<192>(out, base, base + 8192);  // 256: in the tile test (here it would exceed the 168-register cap)
}
"""


def test_every_primitive_assembles(nvcc_jit):
    """ptxas accepts every wrapper's PTX for sm_90a (compile only: not a meaningful kernel)."""
    from glm5_fastpath.jit import KernelSpec
    spec = KernelSpec("sm90_every_primitive", code=EVERY_PRIMITIVE, functions=("sm90_every_primitive",))
    ck = nvcc_jit(spec)
    r = ck.resources()["sm90_every_primitive"]
    assert r.spill_store_bytes == 0, r


def test_primitive_kernel_compiles_for_sm90a(nvcc_jit):
    ck = nvcc_jit(_spec())
    res = ck.resources()
    assert set(res) == {f"sm90_prim_tile_n{n}" for n in NS}, res
    for fn, r in res.items():
        assert r.spill_store_bytes == 0 and r.spill_load_bytes == 0 and r.stack_bytes == 0, (fn, r)


# ---- GPU ------------------------------------------------------------------------------------------

def _exact_fp8(shape, gen):
    vals = torch.tensor([-2.0, -1.5, -1.0, -0.5, 0.0, 0.5, 1.0, 1.5, 2.0])
    return vals[torch.randint(0, len(vals), shape, generator=gen)].to(FP8)


def _run_tile(n, k, rows_a=64, rows_b=None, seed=0):
    from glm5_fastpath.jit import get_kernel
    from glm5_fastpath.jit.tma import tensor_map_2d
    rows_b = n if rows_b is None else rows_b
    g = torch.Generator().manual_seed(seed + 1000 * n + k)
    a = _exact_fp8((rows_a, k), g).cuda()
    b = _exact_fp8((rows_b, k), g).cuda()
    out = torch.full((64, n), float("nan"), device="cuda")
    ma = tensor_map_2d(a, 128, 64, name="a")
    mb = tensor_map_2d(b, 128, n, name="b")
    kern = get_kernel(_spec(), f"sm90_prim_tile_n{n}")
    smem = 1024 + 64 * 128 + -(-n * 128 // 1024) * 1024 + 16
    kern.launch((1, 1, 1), (128, 1, 1), [ma, mb, out, ctypes.c_int32(k)], smem=smem)
    torch.cuda.synchronize()
    want = torch.zeros(64, n, device="cuda")
    want[:rows_a, :rows_b] = a.float() @ b.float().t()
    return out, want


def _first_mismatch(out, want):
    bad = (out != want).nonzero()
    if len(bad) == 0:
        return None
    r, c = bad[0].tolist()
    return f"{len(bad)} wrong; first at (row {r}, col {c}): got {out[r, c].item()} want {want[r, c].item()}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", NS)
@pytest.mark.parametrize("k", [128, 512])
def test_tma_wgmma_tile_exact(n, k):
    out, want = _run_tile(n, k)
    msg = _first_mismatch(out, want)
    assert msg is None, f"m64n{n}k32 x {k // 32} over K={k}: {msg}"


@pytest.mark.gpu
@pytest.mark.parametrize("n", [8, 32, 128])
def test_tma_zero_fills_rows_past_the_end(n):
    out, want = _run_tile(n, 256, rows_a=40, rows_b=max(1, n // 2 - 3))
    msg = _first_mismatch(out, want)
    assert msg is None, f"OOB rows n={n}: {msg}"
