// C0 tile: the indexer head gate w_raw[M, kHeads] = bf16(x[M, kHidden] . weights_proj[kHeads, kHidden]^T),
// bf16 operands, fp32 accumulation: a skinny, weight-streaming GEMM split along K.
//
// Framework-free (raw pointers, bf16 as uint16_t patterns) so the same tile runs from the standalone
// launcher (c0_head_gate.cu) and, later, from a persistent megakernel that hands a 256-thread group
// one (split, token tile) at a time.
//
// Work decomposition. A CTA of 256 threads (8 warps) owns one K chunk of kKChunk = 256 columns
// (kSplits = kHidden / 256 chunks; 24 for GLM-5) and one tile of 32 tokens. Warp w owns the 32
// columns [chunk + 32w, chunk + 32w + 32) and computes all 32 (padded) heads x 32 tokens of them with
// mma.sync m16n8k16 (weights on the MMA M side: 2 m16 tiles of heads; tokens on N: 4 n8 tiles).
//
// K permutation. Every lane loads 16 contiguous bytes of a weight row and of a token row (lane
// (g, t) reads columns 8t..8t+7 of the warp's 32), straight into registers: no shared memory and no
// transposition. The dot product does not care which physical column the MMA calls "k" as long as
// A and B agree, so MMA step s (0, 1) of the 32-block uses physical columns 8t+4s+{0,1} as logical
// k = 2t+{0,1} (registers a0/a1 and b0) and 8t+4s+2+{0,1} as logical k = 2t+8+{0,1} (a2/a3, b1).
// The two steps together cover all 32 columns exactly once.
//
// Reduction, deterministic. (1) Each warp's fp32 accumulators go to shared scratch; after a barrier
// every thread sums the 8 warp values of its (token, 4 heads) in warp order and stores the CTA's
// partial (fp32) to the workspace. (2) The CTAs of one token tile count their arrivals on a device
// counter; the last to arrive sums the kSplits partials in split order, rounds to bf16 and writes
// w_raw, and resets the counter to 0 for the next launch (no memset per call). The sum order is
// fixed, so the result is bitwise reproducible; it differs from a sequential fp32 dot product only
// in summation order (far below one bf16 ulp except by rounding-boundary chance).
//
// Workspace (device memory the caller keeps per device/stream): partials fp32
// [token tiles][kSplits][32][kHeads] and counters uint32 [token tiles], zero-initialised once. Every
// access happens after griddepcontrol.wait, so a PDL-overlapped next launch cannot race with it.
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/pdl.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

struct C0Ptrs {
    const uint16_t* x;      // [M, kHidden] bf16 (the producer's output)
    uint16_t* w_raw;        // [M, kHeads] bf16
    float* partials;        // workspace, [tiles][kSplits][32][kHeads] fp32
    uint32_t* counters;     // workspace, [tiles] uint32, 0 between launches
    int32_t num_tokens;     // M
};

template <int kHidden, int kHeads, int kBarrierId = 0>
struct C0HeadGateTile {
    static constexpr int kThreads = 256;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kKBlock = 32;                  // columns per warp (two k16 MMA steps)
    static constexpr int kKChunk = kWarps * kKBlock;    // columns per CTA
    static constexpr int kSplits = kHidden / kKChunk;   // CTAs along K
    static constexpr int kHeadTiles = 2;                // 32 heads (padded) = 2 m16 tiles
    static constexpr int kNT = 4;                       // n8 token tiles per CTA
    static constexpr int kTokTile = 8 * kNT;            // tokens per CTA
    static constexpr int kQuads = kHeads / 4;           // float4 groups of heads
    static constexpr int kRedPitch = 36;                // floats per token row of the scratch (bank-conflict free)
    static constexpr int kRedWarpFloats = kTokTile * kRedPitch;
    // Shared scratch the caller provides (floats, 16-byte aligned): the cross-warp partials plus one word
    // for the "last CTA" flag.
    static constexpr int kScratchFloats = kWarps * kRedWarpFloats + 4;
    static constexpr int kPartialFloatsPerSplit = kTokTile * kHeads;

    static_assert(kHidden % kKChunk == 0, "hidden size must be a multiple of 256 (one K chunk per CTA)");
    static_assert(kHeads >= 4 && kHeads <= 32 && kHeads % 4 == 0, "heads: a multiple of 4, at most 32 (2 m16 tiles)");
    static_assert(kSplits >= 1 && kSplits <= 64, "partials are reduced in registers by one CTA: at most 64 splits");

    // This lane's weight fragments: rows g, g+8 of both head tiles, 8 columns each (loaded before
    // griddepcontrol.wait: the weights are never written by the preceding kernel).
    struct Weights {
        ptx::u32x4 v[kHeadTiles][2];
    };

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
    }

    static GLM5_DEVICE int column(int split, int tid) {
        return split * kKChunk + (tid >> 5) * kKBlock + 8 * (tid & 3);
    }

    static GLM5_DEVICE void load_weights(Weights& wr, const uint16_t* __restrict__ weights_proj, int split, int tid) {
        const int g = (tid & 31) >> 2;
        const int col = column(split, tid);
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) {
#pragma unroll
            for (int hh = 0; hh < 2; ++hh) {
                const int row = mt * 16 + hh * 8 + g;
                wr.v[mt][hh] = row < kHeads ? ptx::ld_global_nc_v4(weights_proj + static_cast<int64_t>(row) * kHidden + col)
                                            : ptx::u32x4{0u, 0u, 0u, 0u};
            }
        }
    }

    // All 256 threads call this for one (split, token tile); tid in [0, 256). Needs tile*32 < M.
    static GLM5_DEVICE void run(const Weights& wr, const C0Ptrs& p, int split, int tile, float* scratch, int tid) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int tok_base = tile * kTokTile;
        const int valid = min(kTokTile, p.num_tokens - tok_base);  // >= 1
        const int col = column(split, tid);

        // 1. token fragments (16 bytes per lane and n8 tile) and the MMAs
        ptx::u32x4 xv[kNT];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const int tok = tok_base + nt * 8 + g;
            xv[nt] = (nt * 8 < valid && tok < p.num_tokens)
                         ? ptx::ld_global_v4(p.x + static_cast<int64_t>(tok) * kHidden + col)
                         : ptx::u32x4{0u, 0u, 0u, 0u};
        }
        float acc[kHeadTiles][kNT][4];
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll
        for (int s = 0; s < 2; ++s) {
#pragma unroll
            for (int mt = 0; mt < kHeadTiles; ++mt) {
                if (mt * 16 >= kHeads) continue;  // compile-time: the small preset has one head tile
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
                    if (nt * 8 >= valid) continue;  // CTA-uniform
                    ptx::mma_m16n8k16_bf16(acc[mt][nt], word(wr.v[mt][0], 2 * s), word(wr.v[mt][1], 2 * s),
                                           word(wr.v[mt][0], 2 * s + 1), word(wr.v[mt][1], 2 * s + 1),
                                           word(xv[nt], 2 * s), word(xv[nt], 2 * s + 1));
                }
            }
        }

        // 2. warp partials -> shared scratch [warp][token][head] (pitch 36: lanes hit 32 distinct banks)
        float* red = scratch + warp * kRedWarpFloats;
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
                const int h = mt * 16 + g, tk = nt * 8 + 2 * t;
                red[tk * kRedPitch + h] = acc[mt][nt][0];
                red[(tk + 1) * kRedPitch + h] = acc[mt][nt][1];
                red[tk * kRedPitch + h + 8] = acc[mt][nt][2];
                red[(tk + 1) * kRedPitch + h + 8] = acc[mt][nt][3];
            }
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();

        // 3. CTA partial: sum of the 8 warps in warp order -> workspace
        float* part_tile = p.partials + static_cast<int64_t>(tile) * kSplits * kPartialFloatsPerSplit;
        for (int i = tid; i < kTokTile * kQuads; i += kThreads) {
            const int tk = i / kQuads, q = i % kQuads;
            if (tk >= valid) continue;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float4 v = *reinterpret_cast<const float4*>(scratch + w * kRedWarpFloats + tk * kRedPitch + 4 * q);
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
            ptx::st_global_cg_f32x4(part_tile + split * kPartialFloatsPerSplit + tk * kHeads + 4 * q, sum);
        }

        // 4. arrival: the last CTA of this token tile reduces the splits
        __threadfence();
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        uint32_t* flag = reinterpret_cast<uint32_t*>(scratch + kWarps * kRedWarpFloats);
        if (tid == 0) {
            const uint32_t old = ptx::atomic_add_acq_rel_gpu(p.counters + tile, 1u);
            const uint32_t last = old == static_cast<uint32_t>(kSplits - 1);
            if (last) ptx::st_relaxed_gpu_u32(p.counters + tile, 0u);  // self-reset for the next launch
            *flag = last;
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        if (*flag == 0u) return;
        __threadfence();

        for (int i = tid; i < kTokTile * kQuads; i += kThreads) {
            const int tk = i / kQuads, q = i % kQuads;
            if (tk >= valid) continue;
            const float* src = part_tile + tk * kHeads + 4 * q;
            float4 v[kSplits];
#pragma unroll
            for (int s = 0; s < kSplits; ++s) v[s] = ptx::ld_global_cg_f32x4(src + s * kPartialFloatsPerSplit);
            float4 sum = v[0];
#pragma unroll
            for (int s = 1; s < kSplits; ++s) {
                sum.x += v[s].x;
                sum.y += v[s].y;
                sum.z += v[s].z;
                sum.w += v[s].w;
            }
            ptx::st_global_v2(p.w_raw + static_cast<int64_t>(tok_base + tk) * kHeads + 4 * q,
                              ptx::f32x2_to_bf16x2_rn(sum.x, sum.y), ptx::f32x2_to_bf16x2_rn(sum.z, sum.w));
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
