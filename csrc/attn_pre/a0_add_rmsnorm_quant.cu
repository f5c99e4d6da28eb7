// Standalone A0 kernel: one CTA of GLM5_A0_THREADS threads per row, calling the tile function
// of a0_add_rmsnorm_quant.cuh. Compile-time configuration (the JIT cache key includes it):
//   GLM5_A0_HIDDEN   row width H (multiple of 256; 6144 for GLM-5, 512 for the small preset)
//   GLM5_A0_THREADS  threads per CTA (H/8 must be a multiple of it; chosen by the Python launcher)
// Launch: grid (M, 1, 1), block (GLM5_A0_THREADS, 1, 1), no dynamic shared memory; PDL-ready.
#include "a0_add_rmsnorm_quant.cuh"

#ifndef GLM5_A0_HIDDEN
#define GLM5_A0_HIDDEN 6144
#endif
#ifndef GLM5_A0_THREADS
#define GLM5_A0_THREADS 256
#endif

using A0Tile = glm5::attn_pre::A0AddRmsNormQuantTile<GLM5_A0_HIDDEN, GLM5_A0_THREADS>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/
// add_rmsnorm_quant.py, _KERNEL_ARGS); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(GLM5_A0_THREADS)
glm5_a0_add_rmsnorm_quant(const uint16_t* __restrict__ hidden,  // [M, H] bf16
                          const uint16_t* residual,              // [M, H] bf16 (may alias residual_out)
                          const uint16_t* __restrict__ weight,   // [H] bf16
                          uint16_t* __restrict__ x_out,          // [M, H] bf16
                          uint16_t* residual_out,                // [M, H] bf16
                          uint8_t* __restrict__ x_fp8,           // [M, H] e4m3
                          float* __restrict__ x_scale,           // [M, H/128] fp32, strided
                          int64_t scale_stride_row, int64_t scale_stride_group, int32_t num_rows, float eps) {
    __shared__ float scratch[A0Tile::kScratchFloats];
    const int tid = threadIdx.x;

    // Prologue that does not depend on the previous kernel: gamma into registers.
    typename A0Tile::Gamma gamma;
    A0Tile::load_gamma(gamma, weight, tid);

    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();
    // hidden / residual are written by the previous kernel: nothing of them is read before this.
    glm5::ptx::griddep_wait();

    const int64_t row = blockIdx.x;
    if (row >= num_rows) return;  // whole CTA leaves together: no barrier is skipped by a part
    const int64_t off = row * GLM5_A0_HIDDEN;
    const glm5::attn_pre::A0RowPtrs p{hidden + off,      residual + off, x_out + off, residual_out + off,
                                      x_fp8 + off,       x_scale + row * scale_stride_row,
                                      scale_stride_group};
    A0Tile::run(gamma, p, eps, scratch, tid);
}
