// bf16 <-> fp32 and fp32 -> fp8 e4m3 conversions (raw bit patterns, no cuda_bf16/cuda_fp8 types).
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

// The low / high bf16 of a packed pair (low = lower address) as fp32: exact.
GLM5_DEVICE float bf16lo_to_f32(uint32_t pair) { return __uint_as_float(pair << 16); }
GLM5_DEVICE float bf16hi_to_f32(uint32_t pair) { return __uint_as_float(pair & 0xffff0000u); }

// Two fp32 -> packed bf16 pair, round-to-nearest-even; `lo` lands at the lower address.
GLM5_DEVICE uint32_t f32x2_to_bf16x2_rn(float lo, float hi) {
    uint32_t d;
    // cvt.rn.bf16x2.f32 d, a, b puts a in the upper half and b in the lower half.
    asm("cvt.rn.bf16x2.f32 %0, %1, %2;" : "=r"(d) : "f"(hi), "f"(lo));
    return d;
}

// Two fp32 -> packed e4m3 pair, round-to-nearest-even, saturating to +-448 (NaN stays NaN);
// `lo` lands in the low byte (lower address).
GLM5_DEVICE uint16_t f32x2_to_e4m3x2_satfinite(float lo, float hi) {
    uint16_t d;
    // cvt.rn.satfinite.e4m3x2.f32 d, a, b puts a in the upper byte and b in the lower byte.
    asm("cvt.rn.satfinite.e4m3x2.f32 %0, %1, %2;" : "=h"(d) : "f"(hi), "f"(lo));
    return d;
}

}  // namespace ptx
}  // namespace glm5
