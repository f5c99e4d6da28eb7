// Standalone per-token 1x128 FP8 activation-quant kernel (bf16 [M, H] -> e4m3 [M, H] + fp32 [M, H/128]),
// calling the group tile of act_quant.cuh. No compile-time configuration: H, M and the input row stride
// are kernel arguments, so one cubin serves every shape.
// Launch: grid (ceil(M * H/128 / (T / 16)), 1, 1), block (T, 1, 1) with T a multiple of 32, at most
// 256 (the Python launcher picks T in {32, 64, 128, 256}); no shared memory. Flat group index
// gi = blockIdx.x * T/16 + threadIdx.x / 16 (one aligned half-warp per group, row-major over (row, group));
// the caller keeps M * H/128 < 2^31. PDL-ready: lets the next kernel launch at once, and reads x
// only after griddepcontrol.wait (there is nothing to prefetch).
#include "act_quant.cuh"

#include "../common/pdl.cuh"

using ActQuantTile = glm5::moe::ActQuantGroupTile;

#define GLM5_ACT_QUANT_MAX_THREADS 256

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/act_quant.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(GLM5_ACT_QUANT_MAX_THREADS)
glm5_act_quant_fp8(const uint16_t* __restrict__ x,  // [M, H] bf16, rows x_row_stride elements apart
                   uint8_t* __restrict__ x8,         // [M, H] e4m3, contiguous
                   float* __restrict__ scales,       // [M, H/128] fp32, contiguous (row-major)
                   int64_t x_row_stride,             // elements; a multiple of 8 (16-byte aligned rows)
                   int32_t num_rows, int32_t groups_per_row, float eps) {
    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();

    const uint32_t groups_per_cta = blockDim.x / ActQuantTile::kLanesPerGroup;
    const uint32_t gi = blockIdx.x * groups_per_cta + threadIdx.x / ActQuantTile::kLanesPerGroup;
    const uint32_t total = static_cast<uint32_t>(num_rows) * static_cast<uint32_t>(groups_per_row);
    const bool valid = gi < total;
    const uint32_t row = valid ? gi / static_cast<uint32_t>(groups_per_row) : 0u;
    const uint32_t g = valid ? gi - row * static_cast<uint32_t>(groups_per_row) : 0u;
    const int sub = static_cast<int>(threadIdx.x) & (ActQuantTile::kLanesPerGroup - 1);

    // x is written by the previous kernel (and the outputs may still be read by it): nothing of either
    // is touched before this.
    glm5::ptx::griddep_wait();
    // A warp past the last group leaves as a whole (both halves idle): the shuffles need whole warps.
    if ((gi & ~1u) >= total) return;

    const uint16_t* src = x + static_cast<int64_t>(row) * x_row_stride + static_cast<int64_t>(g) * ActQuantTile::kGroup;
    uint8_t* dst = x8 + static_cast<int64_t>(gi) * ActQuantTile::kGroup;
    ActQuantTile::run(src, dst, scales + gi, sub, valid, eps);
}
