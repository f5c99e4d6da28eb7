// Standalone A0 kernel: one thread-block cluster of GLM5_A0_CLUSTER CTAs per row, calling the tile
// function of a0_add_rmsnorm_quant.cuh. Compile-time configuration (the JIT cache key includes it):
//   GLM5_A0_HIDDEN   row width H (multiple of 256 * GLM5_A0_CLUSTER; 6144 for GLM-5, 512 for the small preset)
//   GLM5_A0_CLUSTER  CTAs per row, 1..8 (chosen by the Python launcher: 8 for H = 6144, 2 for H = 512)
// Launch: grid (M * CLUSTER, 1, 1) with the cluster-dimension attribute (CLUSTER, 1, 1), block
// (H / CLUSTER / 8, 1, 1), no dynamic shared memory; PDL-ready. Row m is cluster m (CTAs
// m * CLUSTER .. m * CLUSTER + CLUSTER - 1); a launch with another cluster shape traps.
#include "a0_add_rmsnorm_quant.cuh"

#ifndef GLM5_A0_HIDDEN
#define GLM5_A0_HIDDEN 6144
#endif
#ifndef GLM5_A0_CLUSTER
#define GLM5_A0_CLUSTER 8
#endif

using A0Tile = glm5::attn_pre::A0AddRmsNormQuantClusterTile<GLM5_A0_HIDDEN, GLM5_A0_CLUSTER>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/
// add_rmsnorm_quant.py, _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(A0Tile::kThreads)
glm5_a0_add_rmsnorm_quant(const uint16_t* __restrict__ hidden,  // [M, H] bf16
                          const uint16_t* residual,              // [M, H] bf16 (may alias residual_out)
                          const uint16_t* __restrict__ weight,   // [H] bf16
                          uint16_t* __restrict__ x_out,          // [M, H] bf16
                          uint16_t* residual_out,                // [M, H] bf16
                          uint8_t* __restrict__ x_fp8,           // [M, H] e4m3
                          float* __restrict__ x_scale,           // [M, H/128] fp32, strided
                          int64_t scale_stride_row, int64_t scale_stride_group, int32_t num_rows, float eps) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry")
    __shared__ typename A0Tile::Smem smem;
    const int tid = threadIdx.x;
    const int64_t row = blockIdx.x / GLM5_A0_CLUSTER;
    // The grid is exactly M clusters; a stray one leaves as a whole, before any cluster barrier.
    if (row >= num_rows) return;
    glm5::ptx::require_cluster_size<GLM5_A0_CLUSTER>();
    const int rank = static_cast<int>(glm5::ptx::cluster_ctarank());

    // Prologue that does not depend on the previous kernel: gamma into registers, the receive
    // barrier armed, the start-up cluster barrier arrived at. Waiting at point 1 (pdl_wait=
    // "after_prologue"), the barrier init goes first and the wait before the weight load.
    if constexpr (glm5::ptx::kPdlWaitAt == 1) A0Tile::init(smem, tid);
    glm5::ptx::griddep_wait_at<1>();
    const glm5::ptx::u32x4 gamma = A0Tile::load_gamma(weight, rank, tid);
    if constexpr (glm5::ptx::kPdlWaitAt != 1) A0Tile::init(smem, tid);

    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();
    // hidden / residual are written by the previous kernel: nothing of them is read before this.
    glm5::ptx::griddep_wait();

    const int64_t off = row * GLM5_A0_HIDDEN;
    const glm5::attn_pre::A0RowPtrs p{hidden + off,      residual + off, x_out + off, residual_out + off,
                                      x_fp8 + off,       x_scale + row * scale_stride_row,
                                      scale_stride_group};
    A0Tile::run(gamma, p, eps, smem, rank, tid);
}
