// Warp-level reductions (butterfly shuffles: every participating lane ends with the result).
#pragma once

#include "arch.cuh"

namespace glm5 {

// Sum over all 32 lanes. The butterfly order is fixed, so the result is deterministic and the
// same in every lane.
GLM5_DEVICE float warp_sum(float v) {
#pragma unroll
    for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
    return v;
}

// Max over aligned groups of kLanes lanes (kLanes = 16: the two half-warps reduce separately).
template <int kLanes>
GLM5_DEVICE float warp_group_max(float v) {
    static_assert(kLanes >= 1 && kLanes <= 32 && (kLanes & (kLanes - 1)) == 0, "power of two <= 32");
#pragma unroll
    for (int off = kLanes / 2; off > 0; off >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, off));
    return v;
}

}  // namespace glm5
