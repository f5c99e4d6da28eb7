// Split-KV sparse MLA decode: stage 1 (glm5_sparse_mla_split) and stage 2 (glm5_sparse_mla_combine), the
// tiles of sparse_mla_decode.cuh. T, H, K, the strides and num_splits are kernel arguments, so one cubin
// serves every shape. One compile-time knob: GLM5_SPARSE_MLA_STAGES, the split tile's gather ring depth
// (default 2: 93696 B, 2 CTAs per SM; 5: 206 KB, 1 CTA per SM; see the .cuh header).
//
// Stage 1 launch: grid (T, num_splits, H / 16), block (128, 1, 1), dynamic shared memory
// SplitTile::kSmemBytes (needs the > 48 KB opt-in). Split s covers the slot blocks
// [s * bps, min((s + 1) * bps, ceil(K / 32))), bps = ceil(ceil(K / 32) / num_splits) (an empty split writes
// zeros and lse = -inf). Requires 1 <= num_splits <= 64 (the combine's shared lse array) and K <= 2048.
// Stage 2 launch: grid (T, H, 2), block (256, 1, 1), no dynamic shared memory.
//
// PDL: both kernels let their dependents launch at entry. Stage 1 reads nothing (q, indices, kv: the
// current token's KV row may just have been written by the producer) before griddepcontrol.wait; stage 2
// reads the workspace only after its own wait (stage 1 complete and visible).
#include "sparse_mla_decode.cuh"

#include "../common/pdl.cuh"

#ifndef GLM5_SPARSE_MLA_STAGES
#define GLM5_SPARSE_MLA_STAGES 2
#endif

using SplitTile = glm5::attn_core::SparseMlaSplitTileT<GLM5_SPARSE_MLA_STAGES>;
using CombineTile = glm5::attn_core::SparseMlaCombineTile;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/sparse_mla.py,
// _split_args / _combine_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(SplitTile::kThreads, SplitTile::kMinBlocksPerSm)
glm5_sparse_mla_split(const uint16_t* __restrict__ q,      // [T, H, 576] bf16
                      const uint16_t* __restrict__ kv,     // [S, 576] bf16 rows, kv_stride elements apart
                      const int32_t* __restrict__ indices, // [T, K] int32, idx_stride elements apart
                      float* __restrict__ o_part,          // [T, num_splits, H, 512] fp32
                      float* __restrict__ lse_part,        // [T, num_splits, H] fp32
                      int64_t q_stride_t, int64_t q_stride_h, int64_t kv_stride, int64_t idx_stride,
                      int64_t num_slots, int32_t topk, int32_t num_splits, int32_t num_heads, float scale_log2) {
    glm5::ptx::griddep_launch_dependents();
    extern __shared__ __align__(128) uint8_t smem[];
    const glm5::attn_core::SparseMlaParams p{q, kv, indices, o_part, lse_part, q_stride_t, q_stride_h, kv_stride,
                                             idx_stride, num_slots, topk, num_splits, num_heads, scale_log2};
    glm5::ptx::griddep_wait();
    SplitTile::run(smem, p, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
}

// The 64-head wgmma split tile (SparseMlaSplitWgmmaTile, sm_90a): the parameters of glm5_sparse_mla_split + o / lse /
// cluster. Launch: grid (T, num_splits, H / 64), block (256, 1, 1), dynamic shared memory SplitWgmmaTile::kSmemBytes
// (> 48 KB opt-in), 1 CTA per SM; cluster = 1: partials as glm5_sparse_mla_split; cluster = C > 1 (C | num_splits,
// launched with cluster dims (1, C, 1)): the splits merged per cluster (the tile's cluster_epilogue).
using SplitWgmmaTile = glm5::attn_core::SparseMlaSplitWgmmaTile;

extern "C" __global__ void __launch_bounds__(SplitWgmmaTile::kThreads, 1)
glm5_sparse_mla_split_wgmma(const uint16_t* __restrict__ q, const uint16_t* __restrict__ kv,
                            const int32_t* __restrict__ indices, float* __restrict__ o_part,
                            float* __restrict__ lse_part, int64_t q_stride_t, int64_t q_stride_h, int64_t kv_stride,
                            int64_t idx_stride, int64_t num_slots, int32_t topk, int32_t num_splits, int32_t num_heads,
                            float scale_log2,
                            uint16_t* __restrict__ o,   // [T, H, 512] bf16: the final rows when cluster == num_splits
                            float* __restrict__ lse,    // [T, H] fp32 or null, idem
                            int32_t cluster) {          // CTAs per cluster along the splits (launch attribute); 1 = none
    glm5::ptx::griddep_launch_dependents();
    extern __shared__ __align__(1024) uint8_t smem_w[];
    const glm5::attn_core::SparseMlaParams p{q, kv, indices, o_part, lse_part, q_stride_t, q_stride_h, kv_stride,
                                             idx_stride, num_slots, topk, num_splits, num_heads, scale_log2, o, lse,
                                             cluster};
    glm5::ptx::griddep_wait();
    SplitWgmmaTile::run(smem_w, p, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
}

extern "C" __global__ void __launch_bounds__(CombineTile::kThreads)
glm5_sparse_mla_combine(const float* __restrict__ o_part,    // [T, num_splits, H, 512] fp32
                        const float* lse_part,  // [T, num_splits, H] fp32; no __restrict__: with PDL stage 1 may
                                                // still run when this grid starts, so no ld.global.nc
                        uint16_t* __restrict__ o,            // [T, H, 512] bf16, contiguous
                        float* __restrict__ lse,             // [T, H] fp32 or null
                        int32_t num_splits, int32_t num_heads) {
    glm5::ptx::griddep_launch_dependents();
    glm5::ptx::griddep_wait();
    CombineTile::run(o_part, lse_part, o, lse, num_splits, num_heads, blockIdx.x, blockIdx.y, blockIdx.z, threadIdx.x);
}

// Combine, one warp per (token, head, 128-column slice) (SparseMlaCombineWarpTile): same parameters as
// glm5_sparse_mla_combine. Launch: grid (T, H * 4 / 8, 1), block (256, 1, 1); H a multiple of 2.
using CombineWarpTile = glm5::attn_core::SparseMlaCombineWarpTile;

extern "C" __global__ void __launch_bounds__(CombineWarpTile::kThreads)
glm5_sparse_mla_combine_warp(const float* __restrict__ o_part, const float* lse_part, uint16_t* __restrict__ o,
                             float* __restrict__ lse, int32_t num_splits, int32_t num_heads) {
    glm5::ptx::griddep_launch_dependents();
    glm5::ptx::griddep_wait();
    CombineWarpTile::run(o_part, lse_part, o, lse, num_splits, num_heads, blockIdx.x,
                         blockIdx.y * CombineWarpTile::kWarps + threadIdx.x / 32, threadIdx.x % 32);
}

// The 64-head ping-pong split tile (SparseMlaSplitPingPongTile, sm_90a, opt-in): glm5_sparse_mla_split's parameters as
// one SparseMlaParams struct (ops/sparse_mla.py _PpParams mirrors its layout, 120 bytes), the same partial contract. Launch: grid (T, num_splits, H / 64), block (384, 1, 1), dynamic shared memory
// SplitPingPongTile::kSmemBytes (> 48 KB opt-in), 1 CTA per SM.
using SplitPingPongTile = glm5::attn_core::SparseMlaSplitPingPongTile;

extern "C" __global__ void __launch_bounds__(SplitPingPongTile::kThreads, 1)
glm5_sparse_mla_split_pp(const __grid_constant__ glm5::attn_core::SparseMlaParams p) {  // o / lse_out / cluster unused
    // The parameters stay in parameter space (__grid_constant__): loaded into registers at entry, they lived across
    // the setmaxnreg reallocation and spilled.
    glm5::ptx::griddep_launch_dependents();
    extern __shared__ __align__(1024) uint8_t smem_p[];
    glm5::ptx::griddep_wait();
    SplitPingPongTile::run(smem_p, p, threadIdx.x);
}
