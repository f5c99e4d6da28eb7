// Hopper (sm_90a) tensor memory accelerator (TMA) loads: one PTX instruction per function.
//
// A CUtensorMap (128 bytes, built on the host by glm5_fastpath/jit/tma.py::tensor_map_2d with
// cuTensorMapEncodeTiled) describes a 2-D global tensor [outer, inner] (inner contiguous), the box
// one load copies (box_inner x box_outer elements) and the shared-memory swizzle. Pass maps to a
// kernel as `const __grid_constant__ CUtensorMap` parameters and hand their address to these
// functions (a generic address of the parameter; the TMA unit reads the map from there).
//
// tma_load_2d copies the box whose first element is (c_inner, c_outer) into shared memory at
// `smem_dst` and completes box_inner*box_outer*elem_size bytes of transactions on the mbarrier
// `bar` (arm it with sm90::mbar_arrive_expect_tx for the full box size). Elements outside the
// tensor (rows past the last row, columns past the end) are written as zeros and still count
// toward the transaction bytes. With SWIZZLE_128B, `smem_dst` must be 1024-byte aligned and
// box_inner*elem_size <= 128: row r of the box lands at smem_dst + 128*r with its 16-byte chunk c
// at chunk position c ^ (r % 8) (the layout wgmma's 128B-swizzle descriptors read).
//
// cp_async_16_mbar_arrive: for data loaded with plain 16-byte cp.async instead of TMA into a stage
// guarded by an mbarrier. NOTES: the arrive happens when ALL of this thread's earlier cp.async have
// completed; .noinc means the arrival counts against the barrier's init count (count each
// participating thread in it). cp.async writes shared memory through the generic proxy: a consumer
// that reads such data with wgmma / TMA store (async proxy) must execute
// fence.proxy.async.shared::cta (sm90::fence_proxy_async_smem) after its mbar_wait.
#pragma once

#include <cuda.h>  // CUtensorMap (the type only; no driver calls in device code)

#include "arch.cuh"
#include "ptx_cp_async.cuh"

namespace glm5 {
namespace sm90 {

// L2 cache policies for the .L2::cache_hint loads (a 64-bit policy made by createpolicy).
GLM5_DEVICE uint64_t l2_policy_evict_first() { return ptx::l2_policy_evict_first(); }

GLM5_DEVICE uint64_t l2_policy_evict_last() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_last.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// Bring a tensor map into the descriptor cache ahead of its first use (any thread, once).
GLM5_DEVICE void tma_prefetch_desc(const CUtensorMap* map) {
    asm volatile("prefetch.tensormap [%0];" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
}

// 2-D tiled load: box at (c_inner, c_outer) -> shared `smem_dst`, completing on mbarrier `bar`.
// c_inner counts elements of the inner (contiguous) dimension, c_outer rows.
GLM5_DEVICE void tma_load_2d(const CUtensorMap* map, uint32_t smem_dst, uint32_t bar, int32_t c_inner, int32_t c_outer) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4}], [%2];" ::"r"(
            smem_dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c_inner), "r"(c_outer)
        : "memory");
}

// The same with an L2 cache policy (l2_policy_evict_first for data read exactly once).
GLM5_DEVICE void tma_load_2d_hint(const CUtensorMap* map, uint32_t smem_dst, uint32_t bar, int32_t c_inner,
                                  int32_t c_outer, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4}], [%2], %5;" ::"r"(smem_dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c_inner), "r"(c_outer), "l"(policy)
        : "memory");
}

// 3-D tiled load: box at (c0, c1, c2) (c0 = the contiguous dimension), same completion as tma_load_2d.
// The skinny GEMM's k-block-major weights (W8 as [K / 128][N][128]: one 128-row x 128-byte box is 16 KB
// of contiguous memory) load through it.
GLM5_DEVICE void tma_load_3d(const CUtensorMap* map, uint32_t smem_dst, uint32_t bar, int32_t c0, int32_t c1,
                             int32_t c2) {
    asm volatile(
        "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%3, %4, %5}], [%2];" ::"r"(
            smem_dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2)
        : "memory");
}

// 5-D tiled load: box at (c0, c1, c2, c3, c4) (c0 = the contiguous dimension), same completion and
// L2 policy as tma_load_2d_hint. Lets one load gather rows from two strided row sets in an
// interleaved order (MegaMoE's gate/up rows: glm5_fastpath/moe/megamoe.py::w13_map_geometry).
GLM5_DEVICE void tma_load_5d(const CUtensorMap* map, uint32_t smem_dst, uint32_t bar, int32_t c0, int32_t c1,
                             int32_t c2, int32_t c3, int32_t c4) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2];" ::"r"(smem_dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4)
        : "memory");
}

GLM5_DEVICE void tma_load_5d_hint(const CUtensorMap* map, uint32_t smem_dst, uint32_t bar, int32_t c0, int32_t c1,
                                  int32_t c2, int32_t c3, int32_t c4, uint64_t policy) {
    asm volatile(
        "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint"
        " [%0], [%1, {%3, %4, %5, %6, %7}], [%2], %8;" ::"r"(smem_dst),
        "l"(reinterpret_cast<uint64_t>(map)), "r"(bar), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "l"(policy)
        : "memory");
}

// Arrive on `bar` once all of this thread's prior cp.async (non-bulk) copies have completed; the
// arrival counts against the init count (.noinc).
GLM5_DEVICE void cp_async_16_mbar_arrive(uint32_t bar) {
    asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// Order this thread's generic-proxy shared-memory accesses (ordinary st.shared, cp.async results
// it has observed) before its subsequent async-proxy accesses (wgmma operand reads, TMA).
GLM5_DEVICE void fence_proxy_async_smem() { asm volatile("fence.proxy.async.shared::cta;" ::: "memory"); }

}  // namespace sm90
}  // namespace glm5
