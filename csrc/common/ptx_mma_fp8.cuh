// Warp-level FP8 tensor-core MMA (mma.sync, sm_89+): D[16x8] f32 += A[16x32] e4m3 * B[32x8] e4m3.
//
// Fragment layout (PTX ISA, m16n8k32 with 8-bit A/B), g = lane / 4, t = lane % 4:
//   a0: A[g   ][4t .. 4t+3]    a1: A[g+8][4t .. 4t+3]
//   a2: A[g   ][16+4t .. +3]   a3: A[g+8][16+4t .. +3]          (4 e4m3 per register, low byte first)
//   b0: B[4t .. 4t+3][g]       b1: B[16+4t .. +3][g]
//   c0, c1: D[g][2t], D[g][2t+1]      c2, c3: D[g+8][2t], D[g+8][2t+1]
// A dot product does not care in which order its k terms come, so a caller may feed ANY
// permutation of the 32 k indices as long as A and B use the same one (the skinny GEMM gives
// thread t the 8 contiguous bytes 8t..8t+7 of a 32-wide k chunk: one 8-byte half of a 16-byte load).
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

GLM5_DEVICE void mma_m16n8k32_e4m3(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                   uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k32.row.col.f32.e4m3.e4m3.f32 "
        "{%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

}  // namespace ptx
}  // namespace glm5
