// C0 tile: the indexer head gate w_raw[M, kHeads] = bf16(x[M, kHidden] . weights_proj[kHeads, kHidden]^T),
// bf16 operands, fp32 accumulation: a skinny, weight-streaming GEMM (0.4 MB of weights, K = 6144, N = 32).
//
// Framework-free (raw pointers, bf16 as uint16_t patterns). Two pieces:
//
// C0HeadGateTile: the fragment layout over 256-column K chunks, shared with the MoE router
// (csrc/moe/router.cuh, which runs it split-K with a last-CTA reduce over 32-token tiles). A 256-thread
// group of 8 warps covers one chunk: warp w owns the 32 columns [chunk + 32w, chunk + 32w + 32) and
// multiplies all 32 (padded) heads by 8-token n-tiles with mma.sync m16n8k16 (weights on the MMA M side:
// 2 m16 tiles of heads; tokens on N).
//
// K permutation. Every lane loads 16 contiguous bytes of a weight row and of a token row (lane
// (g, t) reads columns 8t..8t+7 of the warp's 32), straight into registers: no shared memory and no
// transposition. The dot product does not care which physical column the MMA calls "k" as long as
// A and B agree, so MMA step s (0, 1) of the 32-block uses physical columns 8t+4s+{0,1} as logical
// k = 2t+{0,1} (registers a0/a1 and b0) and 8t+4s+2+{0,1} as logical k = 2t+8+{0,1} (a2/a3, b1).
// The two steps together cover all 32 columns exactly once.
//
// C0HeadGateClusterTile: C0 itself. One thread-block cluster of kCluster CTAs (8 for GLM-5) per tile of
// kTok = 8 * kNT tokens; CTA `rank` owns kChunks = kHidden / 256 / kCluster consecutive K chunks (3 for
// GLM-5: 768 columns, 48 KB of weights held in registers, loaded before griddepcontrol.wait) and
// computes the [kTok x 32] partial of its K slice. The K reduction never leaves the cluster:
//   1. in-CTA: each warp's fp32 accumulators -> shared scratch [warp][token][head]; after a CTA barrier
//      thread (token, head quad) sums the 8 warps in warp order;
//   2. across the cluster: that float4 goes with st.async (distributed shared memory, completing 16
//      transaction bytes on the receiver's mbarrier) to the CTA that owns the token (owner = token %
//      kCluster), into slot [sender rank][token / kCluster];
//   3. the owner, once its mbarrier saw every byte addressed to it, sums the kCluster partials in rank
//      order, rounds to bf16 and stores w_raw.
// Fixed orders everywhere: bitwise reproducible, no workspace, no arrival counter, no global round
// trip, so launches may also run concurrently on several streams. A CTA reads only its own shared
// memory after step 2 and leaves only after its own mbarrier completed, so no CTA writes into an
// exited one; the start-up rule (peers running, their mbarriers initialised, before the first write)
// is a cluster barrier whose arrive is in the prologue and whose wait is just before step 2.
#pragma once

#include "../common/arch.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/cluster.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/pdl.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// The fragment layout over 256-column K chunks (see the header comment); the MoE router's GEMM.
template <int kHidden, int kHeads, int kBarrierId = 0>
struct C0HeadGateTile {
    static constexpr int kThreads = 256;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kKBlock = 32;                  // columns per warp (two k16 MMA steps)
    static constexpr int kKChunk = kWarps * kKBlock;    // columns per chunk
    static constexpr int kSplits = kHidden / kKChunk;   // chunks along K
    static constexpr int kHeadTiles = 2;                // 32 heads (padded) = 2 m16 tiles
    // The split-K user's token tile (the router: 4 n8 tiles = 32 tokens per CTA) and its cross-warp
    // scratch pitch (36 floats per token row: the lanes of one store hit 32 distinct banks).
    static constexpr int kNT = 4;
    static constexpr int kTokTile = 8 * kNT;
    static constexpr int kRedPitch = 36;
    static constexpr int kRedWarpFloats = kTokTile * kRedPitch;

    static_assert(kHidden % kKChunk == 0, "hidden size must be a multiple of 256 (whole K chunks)");
    static_assert(kHeads >= 4 && kHeads <= 32 && kHeads % 4 == 0, "heads: a multiple of 4, at most 32 (2 m16 tiles)");
    static_assert(kSplits >= 1 && kSplits <= 64, "at most 64 K chunks (the router reduces them in registers)");

    // This lane's weight fragments of one chunk: rows g, g+8 of both head tiles, 8 columns each (loaded
    // before griddepcontrol.wait: the weights are never written by the preceding kernel).
    struct Weights {
        ptx::u32x4 v[kHeadTiles][2];
    };

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;  // w is a compile-time constant after unrolling
    }

    static GLM5_DEVICE int column(int chunk, int tid) {
        return chunk * kKChunk + (tid >> 5) * kKBlock + 8 * (tid & 3);
    }

    static GLM5_DEVICE void load_weights(Weights& wr, const uint16_t* __restrict__ weights_proj, int chunk, int tid) {
        const int g = (tid & 31) >> 2;
        const int col = column(chunk, tid);
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
};

struct C0Ptrs {
    const uint16_t* x;      // [M, kHidden] bf16 (the producer's output)
    uint16_t* w_raw;        // [M, kHeads] bf16
    int32_t num_tokens;     // M
};

template <int kHidden, int kHeads, int kNT, int kCluster, int kBarrierId = 0>
struct C0HeadGateClusterTile {
    using Frag = C0HeadGateTile<kHidden, kHeads, kBarrierId>;
    static constexpr int kThreads = Frag::kThreads;          // 256
    static constexpr int kWarps = Frag::kWarps;              // 8
    static constexpr int kHeadTiles = Frag::kHeadTiles;      // 2
    static constexpr int kChunks = Frag::kSplits / kCluster;  // 256-column K chunks per CTA
    static constexpr int kTok = 8 * kNT;                     // tokens per cluster
    static constexpr int kQuads = kHeads / 4;                // float4 groups of heads
    static constexpr int kRedPitch = Frag::kRedPitch;
    static constexpr int kRedWarpFloats = kTok * kRedPitch;
    static constexpr int kSlots = (kTok + kCluster - 1) / kCluster;  // tokens one CTA owns, at most
    static constexpr int kRecvFloats = kCluster * kSlots * kHeads;

    static_assert(kCluster >= 1 && kCluster <= 8, "portable cluster size: 1..8 CTAs");
    static_assert(Frag::kSplits % kCluster == 0, "every CTA owns the same number of 256-column K chunks");
    static_assert(kNT >= 1 && kNT <= 4, "1..4 n8 token tiles per cluster");
    static_assert(kTok * kQuads <= kThreads, "step 3: one (token, head quad) per thread");

    // Shared memory of one CTA.
    struct Smem {
        alignas(16) uint64_t bar;                    // completes when every partial for our tokens arrived
        alignas(16) float red[kWarps * kRedWarpFloats];  // [warp][token][head], pitch kRedPitch
        alignas(16) float recv[kRecvFloats];         // [sender rank][owned slot][head]
    };

    struct Weights {
        typename Frag::Weights c[kChunks];
    };

    // Tokens of the tile owned by `rank` (tok % kCluster == rank) and the bytes it receives for them.
    static GLM5_DEVICE int owned_tokens(int rank) { return rank < kTok ? (kTok - 1 - rank) / kCluster + 1 : 0; }
    static GLM5_DEVICE uint32_t recv_bytes(int rank) {
        return static_cast<uint32_t>(kCluster * owned_tokens(rank) * kHeads * sizeof(float));
    }

    // Prologue, before griddepcontrol.wait: this lane's weight fragments of the CTA's K slice.
    static GLM5_DEVICE void load_weights(Weights& wr, const uint16_t* __restrict__ weights_proj, int rank, int tid) {
#pragma unroll
        for (int c = 0; c < kChunks; ++c) Frag::load_weights(wr.c[c], weights_proj, rank * kChunks + c, tid);
    }

    // Prologue: arm the receive barrier and arrive at the start-up cluster barrier; every thread calls it.
    static GLM5_DEVICE void init(Smem& s, int rank, int tid) {
        if (tid == 0) {
            ptx::mbarrier_init(&s.bar, 1);
            ptx::mbarrier_arrive_expect_tx(&s.bar, recv_bytes(rank));
            ptx::fence_mbarrier_init();
        }
        ptx::cluster_arrive_relaxed();
    }

    // All 256 threads of every CTA of the cluster call this after init() and griddepcontrol.wait, with
    // the same tile (needs tile * kTok < M); rank = this CTA's rank in the cluster.
    static GLM5_DEVICE void run(const Weights& wr, const C0Ptrs& p, int tile, Smem& s, int rank, int tid) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int tok_base = tile * kTok;
        const int valid = min(kTok, p.num_tokens - tok_base);  // >= 1

        // 1. token fragments (16 bytes per lane, chunk and n8 tile; all in flight at once), then the MMAs
        ptx::u32x4 xv[kChunks][kNT];
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
            const int col = Frag::column(rank * kChunks + c, tid);
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
                const int tok = tok_base + nt * 8 + g;
                xv[c][nt] = tok < p.num_tokens ? ptx::ld_global_v4(p.x + static_cast<int64_t>(tok) * kHidden + col)
                                               : ptx::u32x4{0u, 0u, 0u, 0u};
            }
        }
        float acc[kHeadTiles][kNT][4];
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt)
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;
#pragma unroll
        for (int c = 0; c < kChunks; ++c) {
#pragma unroll
            for (int st = 0; st < 2; ++st) {
#pragma unroll
                for (int mt = 0; mt < kHeadTiles; ++mt) {
                    if (mt * 16 >= kHeads) continue;  // compile-time: the small preset has one head tile
                    const typename Frag::Weights& w = wr.c[c];
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt) {
                        if (nt * 8 >= valid) continue;  // CTA-uniform
                        ptx::mma_m16n8k16_bf16(acc[mt][nt], Frag::word(w.v[mt][0], 2 * st), Frag::word(w.v[mt][1], 2 * st),
                                               Frag::word(w.v[mt][0], 2 * st + 1), Frag::word(w.v[mt][1], 2 * st + 1),
                                               Frag::word(xv[c][nt], 2 * st), Frag::word(xv[c][nt], 2 * st + 1));
                    }
                }
            }
        }

        // 2. warp partials -> shared scratch [warp][token][head] (pitch 36: lanes hit 32 distinct banks)
        float* red = s.red + warp * kRedWarpFloats;
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

        // 3. the CTA's partial of (token, head quad): the 8 warps in warp order -> the token's owner CTA
        ptx::cluster_wait();  // every peer is running and has armed its barrier (arrived in init())
        const uint32_t bar = ptx::cvta_shared(&s.bar);
        if (tid < kTok * kQuads) {
            const int tk = tid / kQuads, q = tid % kQuads;
            float4 sum = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
#pragma unroll
            for (int w = 0; w < kWarps; ++w) {
                const float4 v = *reinterpret_cast<const float4*>(s.red + w * kRedWarpFloats + tk * kRedPitch + 4 * q);
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
            const uint32_t owner = static_cast<uint32_t>(tk % kCluster);
            const uint32_t slot = ptx::cvta_shared(s.recv + (rank * kSlots + tk / kCluster) * kHeads + 4 * q);
            ptx::st_async_v4_b32(ptx::mapa_shared(slot, owner), __float_as_uint(sum.x), __float_as_uint(sum.y),
                                   __float_as_uint(sum.z), __float_as_uint(sum.w), ptx::mapa_shared(bar, owner));
        }

        // 4. owner: sum the kCluster partials of each owned token in rank order, round to bf16, store
        if (tid < owned_tokens(rank) * kQuads) {
            const int slot = tid / kQuads, q = tid % kQuads;
            const int tk = slot * kCluster + rank;
            ptx::mbarrier_wait_parity_cluster(bar, 0);
            // Written by the peers' st.async; the wait's "memory" clobber keeps these loads after it.
            const float* src = s.recv + slot * kHeads + 4 * q;
            float4 sum = *reinterpret_cast<const float4*>(src);
#pragma unroll
            for (int r = 1; r < kCluster; ++r) {
                const float4 v = *reinterpret_cast<const float4*>(src + r * kSlots * kHeads);
                sum.x += v.x;
                sum.y += v.y;
                sum.z += v.z;
                sum.w += v.w;
            }
            if (tk < valid)
                ptx::st_global_v2(p.w_raw + static_cast<int64_t>(tok_base + tk) * kHeads + 4 * q,
                                  ptx::f32x2_to_bf16x2_rn(sum.x, sum.y), ptx::f32x2_to_bf16x2_rn(sum.z, sum.w));
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
