// Warp-level tensor-core MMA on f16 operands (mma.sync, sm_80+) and the fp8 -> f16 unpack that
// feeds it: one PTX instruction per function.
//
// NOTES: on sm_90 `mma.sync ... .e4m3` is not a native instruction: ptxas lowers each
// m16n8k32 e4m3 MMA to F2FP unpacks + two HMMA.16816.F32 (checked in SASS). Unpacking the fp8
// operands ourselves lets a kernel convert a loop-invariant operand once instead of per MMA;
// e4m3 -> f16 is exact (every e4m3 value is an f16 value), so the products are exact and only
// the fp32 accumulation rounds.
#pragma once

#include "arch.cuh"
#include "convert.cuh"

namespace glm5 {
namespace ptx {

// Two e4m3 (low byte first) -> packed f16x2 (low byte -> low half). Exact.
GLM5_DEVICE uint32_t e4m3x2_to_f16x2(uint16_t v) {
    uint32_t d;
    asm("cvt.rn.f16x2.e4m3x2 %0, %1;" : "=r"(d) : "h"(v));
    return d;
}

GLM5_DEVICE float f16_to_f32(uint16_t h) {
    float f;
    asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(h));
    return f;
}

// Four e4m3 (one 32-bit word, lowest byte first) -> two packed bf16 pairs (lo: bytes 0-1, hi: bytes 2-3), each
// bf16_rn(fp32(e4m3) * s): SGLang's block_quant_dequant of an FP8 weight, bit for bit (e4m3 -> f16 -> fp32 exact,
// one fp32 multiply, one bf16 rounding). The W8 kernels (D2, the V up-projection) rebuild bf16 weights with it.
GLM5_DEVICE void e4m3x4_to_bf16x4_scaled(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
    const uint32_t a = e4m3x2_to_f16x2(static_cast<uint16_t>(w & 0xffffu));
    const uint32_t b = e4m3x2_to_f16x2(static_cast<uint16_t>(w >> 16));
    lo = f32x2_to_bf16x2_rn(__fmul_rn(f16_to_f32(static_cast<uint16_t>(a & 0xffffu)), s),
                            __fmul_rn(f16_to_f32(static_cast<uint16_t>(a >> 16)), s));
    hi = f32x2_to_bf16x2_rn(__fmul_rn(f16_to_f32(static_cast<uint16_t>(b & 0xffffu)), s),
                            __fmul_rn(f16_to_f32(static_cast<uint16_t>(b >> 16)), s));
}

// D = A * B + D, A 16x16 f16 (row), B 16x8 f16 (col), D 16x8 fp32. Fragments (g = lane / 4,
// t = lane % 4): a[0] = A[g][2t..2t+1], a[1] = A[g+8][2t..], a[2] = A[g][2t+8..], a[3] = A[g+8][2t+8..];
// b0 = B[2t..2t+1][g], b1 = B[2t+8..2t+9][g]; d[0..1] = D[g][2t..2t+1], d[2..3] = D[g+8][2t..2t+1].
GLM5_DEVICE void mma_m16n8k16_f16_f32(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                      uint32_t b1) {
    asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// max(x, 0) that propagates NaN (torch.clamp_min semantics; fmaxf would turn NaN into 0).
GLM5_DEVICE float relu_nan(float x) {
    float d;
    asm("max.NaN.f32 %0, %1, 0f00000000;" : "=f"(d) : "f"(x));
    return d;
}

}  // namespace ptx
}  // namespace glm5
