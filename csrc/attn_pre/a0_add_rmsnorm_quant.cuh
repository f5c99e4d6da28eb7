// A0 tile: residual add + RMSNorm + per-token 1x128 FP8 (e4m3) quantization of ONE row.
//
// Framework-free (raw pointers, bf16 as uint16_t bit patterns, e4m3 as bytes) so the same tile
// runs from the standalone launcher (a0_add_rmsnorm_quant.cu, one CTA per row) and, later,
// from a persistent megakernel that hands a group of kThreads threads one row at a time.
//
// Math, bit-for-bit the order of glm5_fastpath.ref.prefix.a0_add_rmsnorm_quant:
//   r         = f32(hidden) + f32(residual)                      (exact fp32 add)
//   res_out   = bf16_rn(r)
//   rstd      = 1 / sqrt(sum(r*r) / H + eps)                     (fp32; IEEE sqrt and divide;
//                                                                 the sum order is ours)
//   x         = bf16_rn((r * rstd) * f32(weight))               (the fp32 r, not res_out)
//   per 128-column group g of the bf16 x:
//     s_g     = max(amax_g |x|, 1e-10) / 448                     (IEEE divide)
//     x8      = e4m3_rn_satfinite(f32(x) / s_g)                  (IEEE divide, not * 1/s)
//
// Thread layout. A row is H/8 16-byte vectors of 8 bf16. Thread t of the tile owns vectors
// v = i*kThreads + t for i < kIters, so each load instruction of a warp reads 512 contiguous
// bytes. A 128-column group is 16 vectors = one aligned half-warp, so the group amax needs only
// a 4-step shuffle inside the half-warp, and lane 0 of each half-warp writes the group's scale.
// The sum of squares crosses warps through kWarps floats of shared scratch and one named
// barrier; every thread then adds the kWarps partials in the same order, so all threads hold
// the identical rstd.
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/pdl.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// Pointers of one row. bf16 rows are contiguous and 16-byte aligned; residual_out may equal
// residual (in place: each element is read and then written by the same thread).
struct A0RowPtrs {
    const uint16_t* hidden;        // [H] bf16
    const uint16_t* residual;      // [H] bf16
    uint16_t* x;                   // [H] bf16, the normalized row
    uint16_t* residual_out;        // [H] bf16, r rounded to bf16
    uint8_t* x_fp8;                // [H] e4m3
    float* x_scale;                // scale of group g at x_scale[g * scale_stride_group]
    int64_t scale_stride_group;    // 1 for row-major [M, H/128]; the padded M for column-major
};

template <int kHidden, int kThreads, int kBarrierId = 0>
struct A0AddRmsNormQuantTile {
    static constexpr int kVec = 8;                    // bf16 per 16-byte vector
    static constexpr int kGroup = 128;                // FP8 activation group (1x128)
    static constexpr int kLanesPerGroup = kGroup / kVec;  // 16: half a warp
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kVecsPerRow = kHidden / kVec;
    static constexpr int kIters = kVecsPerRow / kThreads;
    // Shared scratch the caller provides (floats). Reusing it for the next row needs a barrier
    // in between (or alternate two scratch buffers): a slow warp may still be reading it.
    static constexpr int kScratchFloats = kWarps;

    static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, at most 1024 threads");
    static_assert(kHidden % kGroup == 0, "H must be a multiple of the 128-column quant group");
    static_assert(kVecsPerRow % kThreads == 0, "H/8 must be a multiple of the thread count");
    static_assert(kIters >= 1 && kIters <= 8, "row is held in registers: 1..8 vectors per thread");

    // This thread's slice of gamma, loaded before griddep_wait() (gamma is never written by
    // the preceding kernel).
    struct Gamma {
        ptx::u32x4 v[kIters];
    };

    static GLM5_DEVICE void load_gamma(Gamma& g, const uint16_t* __restrict__ weight, int tid) {
#pragma unroll
        for (int i = 0; i < kIters; ++i) g.v[i] = ptx::ld_global_nc_v4(weight + (i * kThreads + tid) * kVec);
    }

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
    }

    // All kThreads threads of the tile call this with the same row; tid in [0, kThreads).
    static GLM5_DEVICE void run(const Gamma& gamma, const A0RowPtrs& p, float eps, float* scratch, int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;

        // 1. Issue every load of the row before the first use (2*kIters 16-byte loads in flight).
        ptx::u32x4 h[kIters], res[kIters];
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            const int v = i * kThreads + tid;
            h[i] = ptx::ld_global_v4(p.hidden + v * kVec);
            res[i] = ptx::ld_global_v4(p.residual + v * kVec);
        }

        // 2. r = hidden + residual in fp32; residual_out = bf16(r); partial sum of squares.
        float r[kIters][kVec];
        float ss = 0.0f;
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            ptx::u32x4 ro;
            uint32_t* rw = &ro.x;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t hw = word(h[i], w), qw = word(res[i], w);
                const float a = ptx::bf16lo_to_f32(hw) + ptx::bf16lo_to_f32(qw);
                const float b = ptx::bf16hi_to_f32(hw) + ptx::bf16hi_to_f32(qw);
                r[i][2 * w] = a;
                r[i][2 * w + 1] = b;
                ss = fmaf(a, a, ss);
                ss = fmaf(b, b, ss);
                rw[w] = ptx::f32x2_to_bf16x2_rn(a, b);
            }
            ptx::st_global_v4(p.residual_out + (i * kThreads + tid) * kVec, ro);
        }

        // 3. Row sum of squares: warp butterfly, then kWarps partials through shared memory.
        ss = warp_sum(ss);
        if (lane == 0) scratch[warp] = ss;
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        float total = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) total += scratch[w];
        const float rstd = 1.0f / sqrtf(total / static_cast<float>(kHidden) + eps);

        // 4. x = bf16((r * rstd) * gamma); group amax over the bf16 x; FP8 quant with the scale.
#pragma unroll
        for (int i = 0; i < kIters; ++i) {
            const int v = i * kThreads + tid;
            ptx::u32x4 xo;
            uint32_t* xw = &xo.x;
            float xf[kVec];
            float amax = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t gw = word(gamma.v[i], w);
                const float ya = (r[i][2 * w] * rstd) * ptx::bf16lo_to_f32(gw);
                const float yb = (r[i][2 * w + 1] * rstd) * ptx::bf16hi_to_f32(gw);
                xw[w] = ptx::f32x2_to_bf16x2_rn(ya, yb);
                xf[2 * w] = ptx::bf16lo_to_f32(xw[w]);
                xf[2 * w + 1] = ptx::bf16hi_to_f32(xw[w]);
                amax = fmaxf(amax, fmaxf(fabsf(xf[2 * w]), fabsf(xf[2 * w + 1])));
            }
            ptx::st_global_v4(p.x + v * kVec, xo);

            amax = warp_group_max<kLanesPerGroup>(amax);
            const float s = fmaxf(amax, 1e-10f) / 448.0f;
            uint32_t q[2];
#pragma unroll
            for (int w = 0; w < 2; ++w) {
                const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(xf[4 * w] / s, xf[4 * w + 1] / s);
                const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(xf[4 * w + 2] / s, xf[4 * w + 3] / s);
                q[w] = lo | (hi << 16);
            }
            ptx::st_global_v2(p.x_fp8 + v * kVec, q[0], q[1]);
            if ((lane & (kLanesPerGroup - 1)) == 0)
                ptx::st_global_f32(p.x_scale + static_cast<int64_t>(v / kLanesPerGroup) * p.scale_stride_group, s);
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
