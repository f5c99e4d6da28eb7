// A0 tile: residual add + RMSNorm + per-token 1x128 FP8 (e4m3) quantization of ONE row, split over
// a thread-block cluster of kCluster CTAs (8 for GLM-5's H = 6144).
//
// Framework-free (raw pointers, bf16 as uint16_t bit patterns, e4m3 as bytes).
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
// Why a cluster. Decode rows are few (M = 1..256) and each is only 12 KB in / 30 KB out, so one CTA
// per row leaves most SMs idle and makes each busy SM stream ~54 KB serially. Here CTA `rank` of the
// row's cluster owns the kCtaCols = H / kCluster contiguous columns [rank * kCtaCols, ...), one
// 16-byte vector (8 bf16) per thread: every load of the CTA is in flight at once and the per-SM
// traffic is 1/kCluster of a row. A 128-column quant group is 16 vectors = one aligned half-warp, so
// the group amax needs only a 4-step shuffle; only the sum of squares crosses CTAs.
//
// Sum of squares across the cluster, one-way and deterministic. Each warp reduces its partial with a
// butterfly; lane j < kCluster of every warp then pushes that float into slot [rank][warp] of CTA j's
// shared `recv` with st.async, which also completes 4 transaction bytes on CTA j's mbarrier. Every
// CTA armed its own mbarrier (one arrival + kCluster * kWarps * 4 expected bytes) before the launch
// waited on the previous kernel, so after the mbarrier phase completes all partials of the row are in
// local shared memory; every thread of every CTA adds them in the same (rank, warp) order and so
// holds the identical rstd. No CTA touches a peer's shared memory after that, and a CTA leaves only
// after its own barrier saw every byte addressed to it, so nobody writes into an exited CTA.
//
// The start-up rule of distributed shared memory (a peer must be running, its mbarrier initialised,
// before anyone writes into it) is a cluster barrier split in two: arrive in the prologue, wait just
// before the first st.async, so its latency hides under griddepcontrol.wait and the row loads.
#pragma once

#include "../common/arch.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/cluster.cuh"
#include "../common/convert.cuh"
#include "../common/pdl.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// Pointers of one row (the row base; the tile adds its own column offset). bf16 rows are contiguous
// and 16-byte aligned; residual_out may equal residual (in place: each element is read and then
// written by the same thread).
struct A0RowPtrs {
    const uint16_t* hidden;        // [H] bf16
    const uint16_t* residual;      // [H] bf16
    uint16_t* x;                   // [H] bf16, the normalized row
    uint16_t* residual_out;        // [H] bf16, r rounded to bf16
    uint8_t* x_fp8;                // [H] e4m3
    float* x_scale;                // scale of group g at x_scale[g * scale_stride_group]
    int64_t scale_stride_group;    // 1 for row-major [M, H/128]; the padded M for column-major
};

// Step 4 of both A0 tiles for one 8-column vector at `col`: x = bf16((r * rstd) * gamma), the amax of the
// vector's 128-column group over the half warp that holds it, the group scale and the e4m3 codes; stores x,
// x_fp8 and (the group's first lane) the scale. All 16 lanes of the half warp must call it together.
GLM5_DEVICE void a0_norm_quant_vector(const float (&r)[8], float rstd, const ptx::u32x4& gamma, const A0RowPtrs& p,
                                      int col, int lane) {
    constexpr int kGroup = 128, kLanesPerGroup = kGroup / 8;
    const uint32_t gw4[4] = {gamma.x, gamma.y, gamma.z, gamma.w};
    ptx::u32x4 xo;
    uint32_t* xw = &xo.x;
    float xf[8];
    float amax = 0.0f;
#pragma unroll
    for (int w = 0; w < 4; ++w) {
        const float ya = (r[2 * w] * rstd) * ptx::bf16lo_to_f32(gw4[w]);
        const float yb = (r[2 * w + 1] * rstd) * ptx::bf16hi_to_f32(gw4[w]);
        xw[w] = ptx::f32x2_to_bf16x2_rn(ya, yb);
        xf[2 * w] = ptx::bf16lo_to_f32(xw[w]);
        xf[2 * w + 1] = ptx::bf16hi_to_f32(xw[w]);
        amax = fmaxf(amax, fmaxf(fabsf(xf[2 * w]), fabsf(xf[2 * w + 1])));
    }
    ptx::st_global_v4(p.x + col, xo);

    amax = warp_group_max<kLanesPerGroup>(amax);
    const float sc = fmaxf(amax, 1e-10f) / 448.0f;
    uint32_t q[2];
#pragma unroll
    for (int w = 0; w < 2; ++w) {
        const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(xf[4 * w] / sc, xf[4 * w + 1] / sc);
        const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(xf[4 * w + 2] / sc, xf[4 * w + 3] / sc);
        q[w] = lo | (hi << 16);
    }
    ptx::st_global_v2(p.x_fp8 + col, q[0], q[1]);
    if ((lane & (kLanesPerGroup - 1)) == 0)
        ptx::st_global_f32(p.x_scale + static_cast<int64_t>(col / kGroup) * p.scale_stride_group, sc);
}

template <int kHidden, int kCluster>
struct A0AddRmsNormQuantClusterTile {
    static constexpr int kVec = 8;                        // bf16 per 16-byte vector
    static constexpr int kGroup = 128;                    // FP8 activation group (1x128)
    static constexpr int kLanesPerGroup = kGroup / kVec;  // 16: half a warp
    static constexpr int kCtaCols = kHidden / kCluster;   // columns of one CTA
    static constexpr int kThreads = kCtaCols / kVec;      // one vector per thread
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kGroupsPerCta = kCtaCols / kGroup;
    static constexpr int kPartials = kCluster * kWarps;   // sum-of-squares partials per row
    static constexpr uint32_t kRecvBytes = kPartials * sizeof(float);

    static_assert(kCluster >= 1 && kCluster <= 8, "portable cluster size: 1..8 CTAs");
    static_assert(kHidden % (256 * kCluster) == 0, "each CTA owns whole warps of 256 columns (two 128-col groups)");
    static_assert(kThreads >= 32 && kThreads <= 1024, "1..32 warps per CTA");

    // Shared memory of one CTA (8-byte aligned by its first member).
    struct Smem {
        uint64_t bar;              // completes when all kPartials partials have landed in recv
        float recv[kPartials];     // [rank][warp] warp partial sums of r*r
    };

    // Prologue, before griddepcontrol.wait (nothing here reads the previous kernel's output).
    // This thread's 16 bytes of gamma (the norm weight is never written by the preceding kernel).
    static GLM5_DEVICE ptx::u32x4 load_gamma(const uint16_t* __restrict__ weight, int rank, int tid) {
        return ptx::ld_global_nc_v4(weight + rank * kCtaCols + tid * kVec);
    }

    // Arm the receive barrier and arrive at the start-up cluster barrier; every thread calls it.
    static GLM5_DEVICE void init(Smem& s, int tid) {
        if (tid == 0) {
            ptx::mbarrier_init(&s.bar, 1);
            ptx::mbarrier_arrive_expect_tx(&s.bar, kRecvBytes);
            ptx::fence_mbarrier_init();
        }
        ptx::cluster_arrive_relaxed();
    }

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
    }

    // All kThreads threads of every CTA of the cluster call this after init() and griddepcontrol.wait,
    // with the same row; rank = this CTA's rank in the cluster, tid in [0, kThreads).
    static GLM5_DEVICE void run(const ptx::u32x4& gamma, const A0RowPtrs& p, float eps, Smem& s, int rank, int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int col = rank * kCtaCols + tid * kVec;

        // 1. Both loads of this thread in flight before any use.
        const ptx::u32x4 h = ptx::ld_global_v4(p.hidden + col);
        const ptx::u32x4 res = ptx::ld_global_v4(p.residual + col);

        // 2. r = hidden + residual in fp32; residual_out = bf16(r); partial sum of squares.
        float r[kVec];
        float ss = 0.0f;
        ptx::u32x4 ro;
        uint32_t* rw = &ro.x;
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const uint32_t hw = word(h, w), qw = word(res, w);
            const float a = ptx::bf16lo_to_f32(hw) + ptx::bf16lo_to_f32(qw);
            const float b = ptx::bf16hi_to_f32(hw) + ptx::bf16hi_to_f32(qw);
            r[2 * w] = a;
            r[2 * w + 1] = b;
            ss = fmaf(a, a, ss);
            ss = fmaf(b, b, ss);
            rw[w] = ptx::f32x2_to_bf16x2_rn(a, b);
        }
        ptx::st_global_v4(p.residual_out + col, ro);

        // 3. Row sum of squares: warp butterfly, then every warp partial to every CTA of the cluster.
        ss = warp_sum(ss);
        ptx::cluster_wait();  // every peer is running and has armed its barrier (arrived in init())
        const uint32_t bar = ptx::cvta_shared(&s.bar);
        if (lane < kCluster) {
            const uint32_t slot = ptx::cvta_shared(&s.recv[rank * kWarps + warp]);
            ptx::st_async_b32(ptx::mapa_shared(slot, lane), __float_as_uint(ss), ptx::mapa_shared(bar, lane));
        }
        ptx::mbarrier_wait_parity_cluster(bar, 0);
        const volatile float* recv = s.recv;  // written by peers' st.async, invisible to the compiler
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < kPartials; ++i) total += recv[i];
        const float rstd = 1.0f / sqrtf(total / static_cast<float>(kHidden) + eps);

        // 4. x = bf16((r * rstd) * gamma); group amax over the bf16 x; FP8 quant with the group scale.
        a0_norm_quant_vector(r, rstd, gamma, p, col, lane);
    }
};

// A0 for one CTA of kThreads threads per row (the MegaRTP megakernel's 256 workers): thread t handles the
// vectors t, t + kThreads, ... (kIters of them), so iteration j of warp w covers the 256 columns of chunk
// j * kWarps + w. Each warp's butterfly per chunk and the in-order sum of the chunk partials reproduce the
// cluster tile's order exactly (its partial [rank][warp] is also one 256-column chunk, summed in chunk
// order), so both tiles give bitwise the same row. Shared memory: kHidden / 256 floats (partials).
template <int kHidden, int kThreads, int kBarrierId>
struct A0AddRmsNormQuantRowTile {
    static constexpr int kVec = 8;
    static constexpr int kGroup = 128;
    static constexpr int kLanesPerGroup = kGroup / kVec;
    static constexpr int kVecs = kHidden / kVec;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kIters = (kVecs + kThreads - 1) / kThreads;
    static constexpr int kChunks = kHidden / 256;  // sum-of-squares partials per row (one per warp-iteration)
    static constexpr int kSmemBytes = kChunks * 4;

    static_assert(kHidden % 256 == 0, "whole 256-column chunks (a warp-iteration is active or not as a whole)");
    static_assert(kThreads % 32 == 0, "whole warps");

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
    }
    static GLM5_DEVICE bool active(int j, int tid) { return j * kThreads + tid < kVecs; }

    // All kThreads threads, one row; `weight` the norm weight [kHidden] bf16 (loaded with the row, per
    // instruction: the megakernel cannot hold it across instructions without spilling); `partials` = kChunks floats of
    // shared memory. Ends after the last read of `partials` by this thread only: barrier before reusing it.
    static GLM5_DEVICE void run(const uint16_t* weight, const A0RowPtrs& p, float eps, float* partials, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        // Every global load of the row goes out in one round trip: the norm weight with the row (it is
        // not needed before pass 2, but loaded there each vector would wait out its own round trip).
        ptx::u32x4 h[kIters], res[kIters], gam[kIters];
#pragma unroll
        for (int j = 0; j < kIters; ++j)
            if (active(j, tid)) {
                const int col = (j * kThreads + tid) * kVec;
                h[j] = ptx::ld_global_v4(p.hidden + col);
                res[j] = ptx::ld_global_v4(p.residual + col);
                gam[j] = ptx::ld_global_nc_v4(weight + col);
            }
        // Pass 1: r = hidden + residual (fp32), residual_out, the chunk partials. r is not kept: pass 2
        // recomputes it from a second (L1 / L2) read of the row, which keeps the tile within the
        // megakernel's register budget (the sums are the same fp32 adds, so r is bitwise the same).
#pragma unroll
        for (int j = 0; j < kIters; ++j) {
            if (!active(j, tid)) continue;  // uniform per warp
            float ss = 0.0f;
            ptx::u32x4 ro;
            uint32_t* rw = &ro.x;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t hw = word(h[j], w), qw = word(res[j], w);
                const float a = ptx::bf16lo_to_f32(hw) + ptx::bf16lo_to_f32(qw);
                const float b = ptx::bf16hi_to_f32(hw) + ptx::bf16hi_to_f32(qw);
                ss = fmaf(a, a, ss);
                ss = fmaf(b, b, ss);
                rw[w] = ptx::f32x2_to_bf16x2_rn(a, b);
            }
            ptx::st_global_v4(p.residual_out + (j * kThreads + tid) * kVec, ro);
            ss = warp_sum(ss);
            if (lane == 0) partials[j * kWarps + warp] = ss;
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        float total = 0.0f;
#pragma unroll
        for (int i = 0; i < kChunks; ++i) total += partials[i];
        const float rstd = 1.0f / sqrtf(total / static_cast<float>(kHidden) + eps);
        ptx::u32x4 h2[kIters], res2[kIters];  // the second read of the row (L1), all before the first use
#pragma unroll
        for (int j = 0; j < kIters; ++j)
            if (active(j, tid)) {
                const int col = (j * kThreads + tid) * kVec;
                h2[j] = ptx::ld_global_v4(p.hidden + col);
                res2[j] = ptx::ld_global_v4(p.residual + col);
            }
        // One copy of the norm + quant code for the kIters vectors (a rolled loop; the vectors are picked from
        // registers): in the megakernel this tile's code runs cold, at ~50 ns per 128-byte line, and the
        // unrolled loop tripled its largest part (24 inlined IEEE divisions).
#pragma unroll 1
        for (int j = 0; j < kIters; ++j) {
            if (!active(j, tid)) continue;
            const int col = (j * kThreads + tid) * kVec;
            const ptx::u32x4 hv = pick(h2, j), rv = pick(res2, j);
            float r[kVec];
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t hw = word(hv, w), qw = word(rv, w);
                r[2 * w] = ptx::bf16lo_to_f32(hw) + ptx::bf16lo_to_f32(qw);
                r[2 * w + 1] = ptx::bf16hi_to_f32(hw) + ptx::bf16hi_to_f32(qw);
            }
            a0_norm_quant_vector(r, rstd, pick(gam, j), p, col, lane);
        }
    }

    // a[j] for a runtime j, in registers (predicated moves, no local-memory array).
    static GLM5_DEVICE ptx::u32x4 pick(const ptx::u32x4 (&a)[kIters], int j) {
        ptx::u32x4 v = a[0];
#pragma unroll
        for (int i = 1; i < kIters; ++i)
            if (j == i) v = a[i];
        return v;
    }
};

}  // namespace attn_pre
}  // namespace glm5
