// B0 row tile (split mode): the row epilogue of B0 as its own pass over the plain GEMM's output.
//
// Input: ONE row of qkv = bf16(x . W_qkva^T), [kQ + kKV + kR] bf16 (q_a | kv_a | k_pe), written by
// the preceding plain skinny GEMM (EPI_PLAIN). Outputs, exactly glm5_fastpath.ref.prefix.b0_qkv_a:
//   q_lora      = bf16_rn((f32(q) * rq) * f32(q_a_norm)),   rq = 1 / sqrt(sum(q^2) / kQ + eps)
//   c_kv        = bf16_rn((f32(kv) * rk) * f32(kv_a_norm)), rk = 1 / sqrt(sum(kv^2) / kKV + eps)
//   k_pe        = the raw bf16 rope columns (a copy)
//   per 128-column group g of the bf16 q_lora:
//     s_g       = max(amax_g |q_lora|, 1e-10) / 448                           (IEEE divide)
//     q_lora_fp8 = e4m3_rn_satfinite(f32(q_lora) / s_g)                       (IEEE divide)
// fp32 math, IEEE sqrt and divides (no fast-math), explicit _rn multiplies (no contraction); only
// the order of the two sums of squares is ours (per-thread fmaf chain, warp butterfly, then the
// kWarps partials added in warp order by every thread: all threads hold the same rq / rk).
//
// Framework-free (raw pointers, bf16 as uint16_t, e4m3 as bytes), like the A0 tile, so the same
// tile runs from the standalone launcher (b0_row_norms.cu, one CTA per token) or a persistent
// kernel that hands kThreads threads one row at a time.
//
// Thread layout. The q part is kQ/8 16-byte vectors; thread t owns q vectors v = i*kThreads + t
// (i < kQIters), so a warp's load covers 512 contiguous bytes and a 128-column group (16 vectors)
// is one aligned half-warp: the group amax is a 4-step shuffle, lane 0 of the half-warp writes the
// scale. The kv and rope parts form one "tail" of (kKV + kR)/8 vectors, tail vector u = i*kThreads
// + t: u < kKV/8 is a kv vector (normalised), the rest are rope vectors (copied). Every load of the
// row is issued before the first use (kQIters + kTailIters 16-byte loads per thread in flight).
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/pdl.cuh"
#include "../common/reduce.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// Pointers of one token row. All bf16 / e4m3 rows are 16-byte aligned (the launcher checks).
struct B0RowPtrs {
    const uint16_t* qkv;   // [kQ + kKV + kR] bf16, the plain GEMM's output row
    uint16_t* q_lora;      // [kQ] bf16
    uint8_t* q_fp8;        // [kQ] e4m3
    float* q_scale;        // [kQ / 128] fp32 (contiguous)
    uint16_t* c_kv;        // [kKV] bf16
    uint16_t* k_pe;        // [kR] bf16
};

template <int kQ, int kKV, int kR, int kThreads, int kBarrierId = 0>
struct B0RowNormsTile {
    static constexpr int kVec = 8;                        // bf16 per 16-byte vector
    static constexpr int kGroup = 128;                    // FP8 activation group (1x128)
    static constexpr int kLanesPerGroup = kGroup / kVec;  // 16: half a warp
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kN = kQ + kKV + kR;
    static constexpr int kQVecs = kQ / kVec;
    static constexpr int kKvVecs = kKV / kVec;
    static constexpr int kTailVecs = (kKV + kR) / kVec;
    static constexpr int kQIters = (kQVecs + kThreads - 1) / kThreads;
    static constexpr int kTailIters = (kTailVecs + kThreads - 1) / kThreads;
    static constexpr bool kQFull = kQVecs % kThreads == 0;       // no predicate on q vectors
    static constexpr bool kTailFull = kTailVecs % kThreads == 0;
    // Shared scratch the caller provides (floats): the q and kv partials of every warp. Reusing it
    // for the next row needs a barrier in between (a slow warp may still be reading it).
    static constexpr int kScratchFloats = 2 * kWarps;

    static_assert(kThreads % 32 == 0 && kThreads >= 32 && kThreads <= 1024, "whole warps, at most 1024 threads");
    static_assert(kQ > 0 && kQ % kGroup == 0, "q_lora_rank must be a positive multiple of the 128-column quant group");
    static_assert(kKV > 0 && kKV % kVec == 0, "kv_lora_rank must be a positive multiple of 8");
    static_assert(kR > 0 && kR % kVec == 0, "rope dim must be a positive multiple of 8 (16-byte rows)");
    static_assert(kQIters >= 1 && kQIters <= 8 && kTailIters >= 1 && kTailIters <= 8,
                  "row is held in registers: 1..8 vectors per thread per part");

    // This thread's slice of both norm weights, loaded before griddep_wait() (weights are never
    // written by the preceding kernel).
    struct Gamma {
        ptx::u32x4 q[kQIters];
        ptx::u32x4 kv[kTailIters];
    };

    static GLM5_DEVICE bool q_valid(int v) { return kQFull || v < kQVecs; }
    static GLM5_DEVICE bool tail_valid(int u) { return kTailFull || u < kTailVecs; }

    static GLM5_DEVICE void load_gamma(Gamma& g, const uint16_t* __restrict__ q_norm,
                                       const uint16_t* __restrict__ kv_norm, int tid) {
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
            const int v = i * kThreads + tid;
            if (q_valid(v)) g.q[i] = ptx::ld_global_nc_v4(q_norm + v * kVec);
            else g.q[i] = ptx::u32x4{0u, 0u, 0u, 0u};
        }
#pragma unroll
        for (int i = 0; i < kTailIters; ++i) {
            const int u = i * kThreads + tid;
            if (u < kKvVecs) g.kv[i] = ptx::ld_global_nc_v4(kv_norm + u * kVec);
            else g.kv[i] = ptx::u32x4{0u, 0u, 0u, 0u};
        }
    }

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
    }

    static GLM5_DEVICE float sumsq8(const ptx::u32x4& x, float acc) {
#pragma unroll
        for (int w = 0; w < 4; ++w) {
            const float a = ptx::bf16lo_to_f32(word(x, w)), b = ptx::bf16hi_to_f32(word(x, w));
            acc = fmaf(a, a, acc);
            acc = fmaf(b, b, acc);
        }
        return acc;
    }

    // The row as this thread holds it: q vectors v = i*kThreads + tid, tail vectors u = i*kThreads + tid
    // (zero where invalid). A caller that computes the row itself (the megakernel's split-K reduce)
    // fills it and calls finish(); run() loads it from p.qkv.
    struct RowRegs {
        ptx::u32x4 q[kQIters];
        ptx::u32x4 t[kTailIters];
    };

    // 1. Issue every load of the row before the first use (coherent loads: the previous kernel
    //    wrote the row).
    static GLM5_DEVICE void load_row(RowRegs& r, const uint16_t* qkv, int tid) {
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
            const int v = i * kThreads + tid;
            if (q_valid(v)) r.q[i] = ptx::ld_global_v4(qkv + v * kVec);
            else r.q[i] = ptx::u32x4{0u, 0u, 0u, 0u};
        }
#pragma unroll
        for (int i = 0; i < kTailIters; ++i) {
            const int u = i * kThreads + tid;
            if (tail_valid(u)) r.t[i] = ptx::ld_global_v4(qkv + kQ + u * kVec);
            else r.t[i] = ptx::u32x4{0u, 0u, 0u, 0u};
        }
    }

    // All kThreads threads of the tile call this with the same row; tid in [0, kThreads).
    static GLM5_DEVICE void run(const Gamma& gamma, const B0RowPtrs& p, float eps, float* scratch, int tid) {
        RowRegs r;
        load_row(r, p.qkv, tid);
        finish(gamma, r, p, eps, scratch, tid);
    }

    // Steps 2-5 on a row already in registers (p.qkv is not read). scratch: kScratchFloats floats,
    // free (a caller running several rows alternates two scratch blocks or puts a barrier between rows).
    static GLM5_DEVICE void finish(const Gamma& gamma, const RowRegs& r, const B0RowPtrs& p, float eps, float* scratch,
                                   int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const ptx::u32x4* q = r.q;
        const ptx::u32x4* t = r.t;

        // 2. Partial sums of squares (zero vectors add nothing); k_pe copied as soon as it is here.
        float ssq = 0.0f, ssk = 0.0f;
#pragma unroll
        for (int i = 0; i < kQIters; ++i) ssq = sumsq8(q[i], ssq);
#pragma unroll
        for (int i = 0; i < kTailIters; ++i) {
            const int u = i * kThreads + tid;
            if (u < kKvVecs) ssk = sumsq8(t[i], ssk);
            else if (tail_valid(u)) ptx::st_global_v4(p.k_pe + (u - kKvVecs) * kVec, t[i]);
        }

        // 3. Row sums: warp butterfly, then the kWarps partials through shared memory.
        ssq = warp_sum(ssq);
        ssk = warp_sum(ssk);
        if (lane == 0) {
            scratch[warp] = ssq;
            scratch[kWarps + warp] = ssk;
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        float tq = 0.0f, tk = 0.0f;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            tq += scratch[w];
            tk += scratch[kWarps + w];
        }
        const float rq = 1.0f / sqrtf(tq / static_cast<float>(kQ) + eps);
        const float rk = 1.0f / sqrtf(tk / static_cast<float>(kKV) + eps);

        // 4. c_kv = bf16((kv * rk) * gamma).
#pragma unroll
        for (int i = 0; i < kTailIters; ++i) {
            const int u = i * kThreads + tid;
            if (u < kKvVecs) {
                ptx::u32x4 o;
                uint32_t* ow = &o.x;
#pragma unroll
                for (int w = 0; w < 4; ++w) {
                    const uint32_t xw = word(t[i], w), gw = word(gamma.kv[i], w);
                    const float a = __fmul_rn(__fmul_rn(ptx::bf16lo_to_f32(xw), rk), ptx::bf16lo_to_f32(gw));
                    const float b = __fmul_rn(__fmul_rn(ptx::bf16hi_to_f32(xw), rk), ptx::bf16hi_to_f32(gw));
                    ow[w] = ptx::f32x2_to_bf16x2_rn(a, b);
                }
                ptx::st_global_v4(p.c_kv + u * kVec, o);
            }
        }

        // 5. q_lora = bf16((q * rq) * gamma); group amax over the bf16 q_lora; FP8 quant. The
        //    shuffles run in every lane (a half-warp is wholly valid or wholly not: kQVecs % 16 == 0).
#pragma unroll
        for (int i = 0; i < kQIters; ++i) {
            const int v = i * kThreads + tid;
            const bool ok = q_valid(v);
            ptx::u32x4 o;
            uint32_t* ow = &o.x;
            float y[kVec];
            float amax = 0.0f;
#pragma unroll
            for (int w = 0; w < 4; ++w) {
                const uint32_t xw = word(q[i], w), gw = word(gamma.q[i], w);
                const float a = __fmul_rn(__fmul_rn(ptx::bf16lo_to_f32(xw), rq), ptx::bf16lo_to_f32(gw));
                const float b = __fmul_rn(__fmul_rn(ptx::bf16hi_to_f32(xw), rq), ptx::bf16hi_to_f32(gw));
                ow[w] = ptx::f32x2_to_bf16x2_rn(a, b);
                y[2 * w] = ptx::bf16lo_to_f32(ow[w]);
                y[2 * w + 1] = ptx::bf16hi_to_f32(ow[w]);
                amax = fmaxf(amax, fmaxf(fabsf(y[2 * w]), fabsf(y[2 * w + 1])));
            }
            amax = warp_group_max<kLanesPerGroup>(amax);
            if (ok) {
                ptx::st_global_v4(p.q_lora + v * kVec, o);
                const float s = fmaxf(amax, 1e-10f) / 448.0f;
                uint32_t q8[2];
#pragma unroll
                for (int w = 0; w < 2; ++w) {
                    const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(y[4 * w] / s, y[4 * w + 1] / s);
                    const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(y[4 * w + 2] / s, y[4 * w + 3] / s);
                    q8[w] = lo | (hi << 16);
                }
                ptx::st_global_v2(p.q_fp8 + v * kVec, q8[0], q8[1]);
                if ((lane & (kLanesPerGroup - 1)) == 0) ptx::st_global_f32(p.q_scale + v / kLanesPerGroup, s);
            }
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
