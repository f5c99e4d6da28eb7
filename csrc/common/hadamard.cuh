// Walsh-Hadamard transform (Sylvester order, H_2n = [[H, H], [H, -H]], H[i][j] = (-1)^popcount(i & j))
// building blocks for a row of n = 2^k fp32 values spread over registers, lanes and warps.
//
// The transform is log2(n) butterfly stages, one per index bit b: the elements i (bit b clear, "lower")
// and i | 2^b ("upper") become (lower + upper, lower - upper). Any assignment of index bits to
// registers / lanes / warps works as long as every stage pairs the right elements; callers run the
// stages in bit order 0, 1, ..., k-1 and multiply by inv_sqrt_pow2(n) last (one fp32 multiply).
// That is the operation order of SGLang's hadamard_transform (Tri Dao's fast-hadamard-transform:
// in-thread strides, then lane strides, `store_output` scales) and of glm5_fastpath.ref.hadamard.fwht,
// so the fp32 results are identical to both given the same input (adds are commutative, each
// stage rounds once, no FMA contraction: explicit _rn intrinsics).
//
//   butterfly(lo, hi)             a stage whose two elements sit in one thread's registers;
//   butterfly_xor(v, mask, upper) a stage whose partner is in lane ^ mask (same register);
//   transform_rows4<n>(v, lane)   the whole normalised transform of rows held 4 contiguous elements per
//                                 lane (n/4 lanes per row): what the B1 / D1 epilogues use
//                                 (fp8_gemm_skinny.cuh, SkinnyFinish::rotated_rows, after a transpose
//                                 through shared memory); MegaRTP tiles can reuse it on the same layout;
//   transform_thread<n>(x)        a row held by one thread.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace wht {

__host__ __device__ constexpr int ilog2(int n) { return n <= 1 ? 0 : 1 + ilog2(n >> 1); }
__host__ __device__ constexpr bool is_pow2(int n) { return n > 0 && (n & (n - 1)) == 0; }

// fp32(n^-0.5) for n = 2^k: 2^-(k/2), times fp32(sqrt(1/2)) for odd k (power-of-two scaling is exact,
// so this is the correctly rounded n^-0.5, the value of SGLang's `scale=n**-0.5` float argument).
__host__ __device__ constexpr float inv_sqrt_pow2(int n) {
    return ((ilog2(n) & 1) ? 0.70710678118654752440f : 1.0f) / static_cast<float>(1 << (ilog2(n) / 2));
}

// (lo, hi) <- (lo + hi, lo - hi).
GLM5_DEVICE void butterfly(float& lo, float& hi) {
    const float a = lo, b = hi;
    lo = __fadd_rn(a, b);
    hi = __fsub_rn(a, b);
}

// One stage across lanes: the partner element is register `v` of lane ^ lane_mask; `upper` says this
// lane holds the element with the stage's index bit set. Every lane of the warp must call it.
GLM5_DEVICE float butterfly_xor(float v, int lane_mask, bool upper) {
    const float o = __shfl_xor_sync(0xffffffffu, v, lane_mask);
    return upper ? __fsub_rn(o, v) : __fadd_rn(v, o);  // upper: lower - upper; lower: lower + upper
}

// Normalised kN-point transform (kN = 16..128) of rows laid out 4 contiguous elements per lane: element
// 4*l + i of a row in v[i] of lane l, one row per kN/4 aligned lanes (several rows per warp when kN < 128).
// Index bits 0-1 in the thread, bits 2.. across lanes (masks 1, 2, ..): all 32 lanes must call it.
template <int kN>
GLM5_DEVICE void transform_rows4(float (&v)[4], int lane) {
    static_assert(is_pow2(kN) && kN >= 16 && kN <= 128, "rows of 16..128 elements (4 per lane, <= 32 lanes)");
    butterfly(v[0], v[1]);  // bit 0
    butterfly(v[2], v[3]);
    butterfly(v[0], v[2]);  // bit 1
    butterfly(v[1], v[3]);
#pragma unroll
    for (int mask = 1; mask < kN / 4; mask <<= 1) {  // bits 2 .. log2(kN) - 1
        const bool upper = (lane & mask) != 0;
#pragma unroll
        for (int i = 0; i < 4; ++i) v[i] = butterfly_xor(v[i], mask, upper);
    }
#pragma unroll
    for (int i = 0; i < 4; ++i) v[i] = __fmul_rn(v[i], inv_sqrt_pow2(kN));
}

// Whole transform of kN values held by one thread (kN = 2^k), normalised: for small rows / tests.
template <int kN>
GLM5_DEVICE void transform_thread(float (&x)[kN]) {
    static_assert(is_pow2(kN), "Walsh-Hadamard size must be a power of two");
#pragma unroll
    for (int h = 1; h < kN; h <<= 1)
#pragma unroll
        for (int i = 0; i < kN; ++i)
            if ((i & h) == 0) butterfly(x[i], x[i | h]);
#pragma unroll
    for (int i = 0; i < kN; ++i) x[i] = __fmul_rn(x[i], inv_sqrt_pow2(kN));
}

}  // namespace wht
}  // namespace glm5
