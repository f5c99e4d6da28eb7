// MoE router tile: logits[M, kExperts] = fp32(h[M, kHidden] . W_g[kExperts, kHidden]^T) (bf16 operands,
// fp32 accumulation), then per token the noaux_tc top-k of GLM-5 / DeepSeek-V3 (n_group = topk_group = 1):
//
//   s = sigmoid(l) (fp32, expf + IEEE division)      choice = s + bias (fp32)
//   ids = top-kTopK of choice, by descending choice, exact ties: the lower expert id first
//   w   = s[ids] / (sum_j s[ids_j] + 1e-20)          (UNBIASED scores; sum in selection order)
//   scaled = w * routed_scaling_factor               (optional, one fp32 multiply per weight)
//
// This is glm5_fastpath.ref.moe.route: the reference returns w WITHOUT the routed scaling factor (it
// applies x2.5 in the combine, as SGLang's moe_sum_reduce does); `scaled` is offered for a consumer that
// folds the factor into the routing weight instead (then its combine must not multiply again).
//
// Framework-free (raw pointers, bf16 as uint16_t) so a persistent MoE kernel can run the same tile.
//
// Work decomposition. The GEMM is C0's (csrc/attn_pre/c0_head_gate.cuh) with N = kExperts instead of
// 32: a CTA of 256 threads owns one K chunk of 256 columns (kSplits = kHidden/256; 24 for GLM-5), one
// group of 32 experts (kGroups = kExperts/32; 8 for GLM-5) and one tile of 32 tokens. The weight
// fragments, their per-lane 16-byte column mapping and the K permutation are C0HeadGateTile's own
// (Weights / load_weights / word / column, reused through #include with kHeads = the group size and
// the weight pointer advanced to the group's first row); see that header for the fragment layout.
//
// Reduction, deterministic, in two arrival levels (fixed summation orders, so bitwise reproducible):
//   1. in-CTA: 8 warps' fp32 accumulators -> shared scratch -> summed in warp order -> the CTA's partial
//      [32 tokens][32 experts] to the workspace;
//   2. the last of the kSplits CTAs of a (token tile, expert group) to arrive (counter per pair) sums the
//      partials in split order and writes those 32 columns of `logits` (fp32);
//   3. the last of the kGroups level-2 CTAs of a token tile to arrive (counter per tile) runs the top-k
//      epilogue for the tile's tokens: warp w takes tokens w, w+8, ...; lane L holds experts L + 32j.
// Each last CTA resets its counter to 0 (no memset per launch; CUDA-graph replays reuse the workspace).
//
// Workspace: partials fp32 [tiles][kGroups][kSplits][32][32] and counters uint32
// [tiles * kGroups] (level 1) + [tiles] (level 2), zero-initialised once. Every workspace / h / output
// access follows griddepcontrol.wait (done by the caller), so a PDL-overlapped next launch cannot race.
#pragma once

#include <math.h>

#include "../attn_pre/c0_head_gate.cuh"
#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/pdl.cuh"
#include "../common/vec_io.cuh"

// Phase marks (diagnostic build only: router.cu with GLM5_ROUTER_PHASES defines the macro to record %globaltimer per
// CTA; compiled out otherwise). Marks: 0 entry, 1 past griddepcontrol.wait, 2 this CTA's part stored (arriving), 3 this
// CTA won the last arrival (top-k epilogue starts), 4 top-k epilogue done, 5 split-K level-1 reduce done, 6 the top-k
// keys built (logits and bias loaded; the last pass of warp 0).
#ifndef GLM5_ROUTER_MARK
#define GLM5_ROUTER_MARK(i) ((void)0)
#endif
// GLM5_ROUTER_TOPK_ROUNDS=1 (diagnostic): the top-k epilogue's round loop instead of the bitonic merge (topk_pass).
#ifndef GLM5_ROUTER_TOPK_ROUNDS
#define GLM5_ROUTER_TOPK_ROUNDS 0
#endif

namespace glm5 {
namespace moe {

struct RouterPtrs {
    const uint16_t* h;        // [M, kHidden] bf16 (the producer's output)
    const float* bias;        // [kExperts] fp32 e_score_correction_bias
    float* logits;            // [M, kExperts] fp32
    int32_t* topk_ids;        // [M, kTopK] int32
    float* topk_weights;      // [M, kTopK] fp32, normalised, without the routed scaling factor
    float* scaled_weights;    // [M, kTopK] fp32 = topk_weights * routed_scaling, or nullptr
    float* partials;          // workspace [tiles][kGroups][kSplits][32][32] fp32
    uint32_t* counters;       // workspace [tiles * kGroups + tiles] uint32, 0 between launches
    int32_t num_tokens;       // M
    float routed_scaling;     // routed_scaling_factor (2.5 for GLM-5)
};

template <int kHidden, int kExperts, int kTopK, int kBarrierId = 0>
struct RouterTile {
    static constexpr int kGroupExperts = kExperts < 32 ? kExperts : 32;  // experts per CTA (MMA M side)
    static constexpr int kGroups = kExperts / kGroupExperts;
    using Gemm = attn_pre::C0HeadGateTile<kHidden, kGroupExperts, kBarrierId>;  // fragment code reused
    using Weights = typename Gemm::Weights;
    static constexpr int kThreads = Gemm::kThreads;  // 256
    static constexpr int kWarps = Gemm::kWarps;      // 8
    static constexpr int kKChunk = Gemm::kKChunk;    // 256
    static constexpr int kSplits = Gemm::kSplits;
    static constexpr int kHeadTiles = Gemm::kHeadTiles;  // 2 m16 tiles (rows >= kGroupExperts are zero)
    static constexpr int kNT = Gemm::kNT;                // 4 n8 token tiles
    static constexpr int kTokTile = Gemm::kTokTile;      // 32
    static constexpr int kRedPitch = Gemm::kRedPitch;    // 36
    static constexpr int kRedWarpFloats = Gemm::kRedWarpFloats;
    static constexpr int kQuads = kGroupExperts / 4;
    static constexpr int kPartialFloatsPerSplit = kTokTile * kGroupExperts;
    static constexpr int kScratchFloats = kWarps * kRedWarpFloats + 4;  // + the "last CTA" flag word
    static constexpr int kPerLane = (kExperts + 31) / 32;               // experts per lane in the epilogue
    static constexpr float kNormEps = 1e-20f;                           // ref.moe.NORM_EPS

    static_assert(kExperts % kGroupExperts == 0, "experts: at most 32, or a multiple of 32");
    static_assert(kGroupExperts % 4 == 0, "experts: a multiple of 4");
    static_assert(kTopK >= 1 && kTopK <= 32 && kTopK <= kExperts, "top-k: 1..32 and at most the expert count");
    static_assert(kPerLane <= 32, "at most 32 experts per lane (1024 experts)");

    static GLM5_DEVICE size_t partial_offset(int tile, int group) {
        return (static_cast<size_t>(tile) * kGroups + group) * kSplits * kPartialFloatsPerSplit;
    }

    // This lane's weight fragments for (split, group): before griddepcontrol.wait (weights are never
    // written by the preceding kernel).
    static GLM5_DEVICE void load_weights(Weights& wr, const uint16_t* __restrict__ gate, int split, int group, int tid) {
        Gemm::load_weights(wr, gate + static_cast<int64_t>(group) * kGroupExperts * kHidden, split, tid);
    }

    // All 256 threads call this for one (split, group, token tile); needs tile * 32 < M. Returns true in every thread
    // of the CTA that ran the tile's top-k epilogue (its ids / weights are then written and visible to this CTA after
    // a CTA barrier: the fused router + MoE plan kernel, router_plan.cu, plans there).
    static GLM5_DEVICE bool run(const Weights& wr, const RouterPtrs& p, int split, int group, int tile, float* scratch,
                                int tid) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int tok_base = tile * kTokTile;
        const int valid = min(kTokTile, p.num_tokens - tok_base);  // >= 1
        const int col = Gemm::column(split, tid);

        // 1. token fragments and the MMAs (C0's fragment mapping: experts on M, tokens on N)
        ptx::u32x4 xv[kNT];
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const int tok = tok_base + nt * 8 + g;
            xv[nt] = (nt * 8 < valid && tok < p.num_tokens)
                         ? ptx::ld_global_v4(p.h + static_cast<int64_t>(tok) * kHidden + col)
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
                if (mt * 16 >= kGroupExperts) continue;  // compile-time
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
                    if (nt * 8 >= valid) continue;  // CTA-uniform
                    ptx::mma_m16n8k16_bf16(acc[mt][nt], Gemm::word(wr.v[mt][0], 2 * s), Gemm::word(wr.v[mt][1], 2 * s),
                                           Gemm::word(wr.v[mt][0], 2 * s + 1), Gemm::word(wr.v[mt][1], 2 * s + 1),
                                           Gemm::word(xv[nt], 2 * s), Gemm::word(xv[nt], 2 * s + 1));
                }
            }
        }

        // 2. warp partials -> scratch [warp][token][expert] (pitch 36: 32 distinct banks per store)
        float* red = scratch + warp * kRedWarpFloats;
#pragma unroll
        for (int mt = 0; mt < kHeadTiles; ++mt) {
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) {
                const int e = mt * 16 + g, tk = nt * 8 + 2 * t;
                red[tk * kRedPitch + e] = acc[mt][nt][0];
                red[(tk + 1) * kRedPitch + e] = acc[mt][nt][1];
                red[tk * kRedPitch + e + 8] = acc[mt][nt][2];
                red[(tk + 1) * kRedPitch + e + 8] = acc[mt][nt][3];
            }
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();

        // 3. the CTA's partial: the 8 warps summed in warp order -> workspace
        float* part = p.partials + partial_offset(tile, group);
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
            ptx::st_cg_f32x4(part + split * kPartialFloatsPerSplit + tk * kGroupExperts + 4 * q, sum);
        }

        // 4. level 1: the last CTA of (tile, group) sums the splits in split order -> logits columns
        GLM5_ROUTER_MARK(2);
        if (!arrive_last(p.counters + tile * kGroups + group, kSplits, scratch, tid)) return false;
        for (int i = tid; i < kTokTile * kQuads; i += kThreads) {
            const int tk = i / kQuads, q = i % kQuads;
            if (tk >= valid) continue;
            const float* src = part + tk * kGroupExperts + 4 * q;
            float4 v[kSplits];
#pragma unroll
            for (int s = 0; s < kSplits; ++s) v[s] = ptx::ld_cg_f32x4(src + s * kPartialFloatsPerSplit);
            float4 sum = v[0];
#pragma unroll
            for (int s = 1; s < kSplits; ++s) {
                sum.x += v[s].x;
                sum.y += v[s].y;
                sum.z += v[s].z;
                sum.w += v[s].w;
            }
            ptx::st_cg_f32x4(p.logits + static_cast<int64_t>(tok_base + tk) * kExperts + group * kGroupExperts + 4 * q,
                             sum);
        }

        GLM5_ROUTER_MARK(5);
        // 5. level 2: the last group CTA of the tile runs the top-k epilogue. It reads logits rows other
        // threads of this CTA just wrote: arrive_last's barrier orders them; with one group there is no
        // level 2, so a plain CTA barrier must (without it warps 1..7 read unwritten rows).
        if constexpr (kGroups > 1) {
            if (!arrive_last(p.counters + kLevel2Base + tile, kGroups, scratch, tid)) return false;
        } else {
            ptx::named_barrier_sync<kBarrierId, kThreads>();
        }
        GLM5_ROUTER_MARK(3);
        topk_epilogue(p, tok_base, valid, warp, lane);
        GLM5_ROUTER_MARK(4);
        return true;
    }

    // Counter words: kMaxTiles * kGroups level-1 counters ([tile][group]), then kMaxTiles level-2 ones.
    static constexpr int kMaxTiles = 8;  // 256 tokens / 32 (the op's maximum M)
    static constexpr int kLevel2Base = kMaxTiles * kGroups;
    static constexpr int kCounterWords = kLevel2Base + kMaxTiles;

    // Every thread of the CTA calls this after writing its part; true in all threads of the CTA that
    // arrives last (which also resets the counter for the next launch). Release/acquire: fence + barrier
    // + acq_rel atomic on the way in, barrier + fence on the way out (as C0).
    static GLM5_DEVICE bool arrive_last(uint32_t* counter, int expected, float* scratch, int tid) {
        __threadfence();
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        uint32_t* flag = reinterpret_cast<uint32_t*>(scratch + kWarps * kRedWarpFloats);
        if (tid == 0) {
            const uint32_t old = ptx::atomic_add_acq_rel_gpu(counter, 1u);
            const uint32_t last = old == static_cast<uint32_t>(expected - 1);
            if (last) ptx::st_relaxed_gpu_u32(counter, 0u);
            *flag = last;
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();
        const bool last = *flag != 0u;
        // every thread has read the flag before anyone can rewrite it (the next arrive_last's barrier
        // precedes tid 0's write)
        if (last) __threadfence();
        return last;
    }

    // Selection keys: one u64 per (token, expert) whose unsigned order is the selection order (larger choice
    // first, equal choices: the lower id first). High word: the fp32 choice's bits made order-preserving (sign
    // flipped for +, all bits for -); low word: ~id. 0 = taken / not an expert. A NaN choice gets high word 0 (below
    // every number, -inf included, whose high word is 0x007fffff) and still ~id, so a row with fewer than kTopK
    // numbers picks its NaN experts in id order and every id stays valid (a NaN row gives NaN weights, as before).
    // choice is never -0.0 (sigmoid >= +0 plus a bias), so the bit order equals the float order, ties included.
    static GLM5_DEVICE uint64_t select_key(float choice, int id) {
        const uint32_t b = __float_as_uint(choice);
        const uint32_t hi = choice != choice ? 0u : (b & 0x80000000u) ? ~b : (b | 0x80000000u);
        return (static_cast<uint64_t>(hi) << 32) | static_cast<uint32_t>(~id);
    }
    static GLM5_DEVICE uint64_t umax64(uint64_t a, uint64_t b) { return a > b ? a : b; }

    // Per-lane list lengths of the bitonic top-k: kLocal keys per lane (kPerLane padded to a power of two), kList the
    // merged list (kTopK padded to a power of two).
    static constexpr int pow2_at_least(int n) { return n <= 1 ? 1 : 2 * pow2_at_least((n + 1) / 2); }
    static constexpr int kLocal = pow2_at_least(kPerLane);
    static constexpr int kList = pow2_at_least(kTopK);

    // Compare-exchange on keys: a gets the larger, b the smaller (keys are distinct but for the 0 padding).
    static GLM5_DEVICE void cx_desc(uint64_t& a, uint64_t& b) {
        const bool swap = a < b;
        const uint64_t hi = swap ? b : a;
        b = swap ? a : b;
        a = hi;
    }

    // The selected keys of kT tokens, in selection order (descending key), in every lane: the classic warp top-k by
    // bitonic merging. Each lane sorts its kPerLane keys (a bitonic sorting network, padded with 0 keys to kLocal),
    // keeps its top kList, then 5 butterfly steps (xor 1, 2, 4, 8, 16) each merge the lane's sorted list with its
    // partner's: c_i = max(a_i, b_{kList-1-i}) holds the top kList of both (a bitonic sequence), a half-cleaner
    // network sorts it. Both partners hold the same multiset, hence the same sorted list; after the 5 steps every
    // lane holds the warp's top kList. Why: the round loop it replaced (kTopK rounds of a per-lane max, a 5-shuffle
    // max and the owner zeroing its key) is a serial chain of ~kTopK x 6 dependent shuffles; this is 5 dependent
    // exchanges. Measured (H200, session 38): the winner's epilogue 2.08 against 2.43 us at 1 token (0.29 of it the
    // loads), the router launch 0.45-0.6 us faster at 1-4 tokens, level at 16-32.
    // The keys are unique (id in the low word), so the list, and everything derived from it, equals the round loop's.
    template <int kT>
    static GLM5_DEVICE void topk_keys(uint64_t (&key)[kT][kPerLane], uint64_t (&top)[kT][kList]) {
#pragma unroll
        for (int u = 0; u < kT; ++u) {
            uint64_t x[kLocal];
#pragma unroll
            for (int j = 0; j < kLocal; ++j) x[j] = j < kPerLane ? key[u][j] : 0ull;
            // bitonic sort of x, descending (blocks with (i & k) == 0 descending, the others ascending)
#pragma unroll
            for (int k = 2; k <= kLocal; k <<= 1) {
#pragma unroll
                for (int j = k >> 1; j > 0; j >>= 1) {
#pragma unroll
                    for (int i = 0; i < kLocal; ++i) {
                        const int l = i ^ j;
                        if (l > i) {
                            if ((i & k) == 0) cx_desc(x[i], x[l]);
                            else cx_desc(x[l], x[i]);
                        }
                    }
                }
            }
#pragma unroll
            for (int i = 0; i < kList; ++i) top[u][i] = i < kLocal ? x[i] : 0ull;
        }
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
#pragma unroll
            for (int u = 0; u < kT; ++u) {
                uint64_t other[kList];
#pragma unroll
                for (int i = 0; i < kList; ++i) other[i] = __shfl_xor_sync(0xffffffffu, top[u][i], off);
#pragma unroll
                for (int i = 0; i < kList; ++i) top[u][i] = umax64(top[u][i], other[kList - 1 - i]);
#pragma unroll
                for (int j = kList >> 1; j > 0; j >>= 1) {
#pragma unroll
                    for (int i = 0; i < kList; ++i) {
                        const int l = i ^ j;
                        if (l > i) cx_desc(top[u][i], top[u][l]);
                    }
                }
            }
        }
    }

    // Top-k of kT tokens at once, one warp (lane L holds experts L + 32j): the keys' top kTopK (topk_keys), then lane
    // r < kTopK fetches the r-th winner's score from its owner lane, and every lane sums the kTopK scores in selection
    // order. Output: w = s / (sum + eps), s the unbiased sigmoid score. GLM5_ROUTER_TOPK_ROUNDS=1 (a diagnostic build
    // for A/B and bitwise tests) selects the round loop topk_keys replaced.
    template <int kT>
    static GLM5_DEVICE void topk_pass(const RouterPtrs& p, int64_t tok0, int stride, const float (&bias)[kPerLane],
                                      int lane) {
        float score[kT][kPerLane];
        uint64_t key[kT][kPerLane];
#pragma unroll
        for (int u = 0; u < kT; ++u) {
            const int64_t tok = tok0 + static_cast<int64_t>(u) * stride;
#pragma unroll
            for (int j = 0; j < kPerLane; ++j) {
                const int e = lane + 32 * j;
                if (e < kExperts) {
                    float l;
                    asm volatile("ld.global.cg.f32 %0, [%1];" : "=f"(l) : "l"(p.logits + tok * kExperts + e));
                    score[u][j] = 1.0f / (1.0f + expf(-l));
                    key[u][j] = select_key(score[u][j] + bias[j], e);
                } else {
                    score[u][j] = 0.0f;
                    key[u][j] = 0ull;
                }
            }
        }
        // phase mark 6 (diagnostic build): the keys are built, i.e. the logits / bias loads have landed (the branch
        // on a key makes the mark wait for them)
        if (key[0][0] != 1ull) GLM5_ROUTER_MARK(6);
        int my_id[kT];
        float my_s[kT], sum[kT];
#if GLM5_ROUTER_TOPK_ROUNDS
#pragma unroll
        for (int u = 0; u < kT; ++u) my_id[u] = 0, my_s[u] = 0.0f, sum[u] = 0.0f;
#pragma unroll 1
        for (int r = 0; r < kTopK; ++r) {
            uint64_t best[kT];
#pragma unroll
            for (int u = 0; u < kT; ++u) {
                best[u] = key[u][0];
#pragma unroll
                for (int j = 1; j < kPerLane; ++j) best[u] = umax64(best[u], key[u][j]);
            }
#pragma unroll
            for (int off = 16; off > 0; off >>= 1) {
#pragma unroll
                for (int u = 0; u < kT; ++u) best[u] = umax64(best[u], __shfl_xor_sync(0xffffffffu, best[u], off));
            }
#pragma unroll
            for (int u = 0; u < kT; ++u) {
                const int wid = static_cast<int>(~static_cast<uint32_t>(best[u]));  // the same in every lane
                float s_own = 0.0f;
#pragma unroll
                for (int j = 0; j < kPerLane; ++j) {
                    const bool hit = key[u][j] == best[u];
                    s_own = hit ? score[u][j] : s_own;
                    key[u][j] = hit ? 0ull : key[u][j];
                }
                const float ws = __shfl_sync(0xffffffffu, s_own, wid & 31);
                sum[u] += ws;
                my_id[u] = lane == r ? wid : my_id[u];
                my_s[u] = lane == r ? ws : my_s[u];
            }
        }
#else
        uint64_t top[kT][kList];
        topk_keys<kT>(key, top);
#pragma unroll
        for (int u = 0; u < kT; ++u) {
            uint64_t mine = top[u][0];  // lane r < kTopK: the r-th winner (others: any, unused)
#pragma unroll
            for (int r = 1; r < kTopK; ++r) mine = lane == r ? top[u][r] : mine;
            my_id[u] = static_cast<int>(~static_cast<uint32_t>(mine));
            // the winner's score from its owner: lane id & 31, slot id >> 5 (one shuffle per slot, the slot selected)
            float s = 0.0f;
#pragma unroll
            for (int j = 0; j < kPerLane; ++j) {
                const float v = __shfl_sync(0xffffffffu, score[u][j], my_id[u] & 31);
                s = (my_id[u] >> 5) == j ? v : s;
            }
            my_s[u] = s;
            float acc = 0.0f;  // selection order, from 0 (as the round loop's running sum)
#pragma unroll
            for (int r = 0; r < kTopK; ++r) acc += __shfl_sync(0xffffffffu, s, r);
            sum[u] = acc;
        }
#endif
        if (lane < kTopK) {
#pragma unroll
            for (int u = 0; u < kT; ++u) {
                const int64_t tok = tok0 + static_cast<int64_t>(u) * stride;
                const float w = my_s[u] / (sum[u] + kNormEps);
                p.topk_ids[tok * kTopK + lane] = my_id[u];
                p.topk_weights[tok * kTopK + lane] = w;
                if (p.scaled_weights != nullptr) p.scaled_weights[tok * kTopK + lane] = w * p.routed_scaling;
            }
        }
    }

    // Warp w takes tokens w, w + kWarps, ... of [tok_base, tok_base + valid), kMaxPass (1 or 2) of them per pass
    // while it has that many left. 2 in the split-K kernel (4 needed 148 registers: one CTA per SM), 1 in the
    // decode kernel (85-register cap, 3 CTAs per SM).
    template <int kMaxPass = 2>
    static GLM5_DEVICE void topk_epilogue(const RouterPtrs& p, int tok_base, int valid, int warp, int lane) {
        static_assert(kMaxPass == 1 || kMaxPass == 2, "pass sizes 1, 2");
        float bias[kPerLane];
#pragma unroll
        for (int j = 0; j < kPerLane; ++j) {
            const int e = lane + 32 * j;
            bias[j] = e < kExperts ? __ldg(p.bias + e) : 0.0f;
        }
        int tk = warp;
        while (tk < valid) {
            const int left = (valid - tk + kWarps - 1) / kWarps;  // warp-uniform
            if (kMaxPass == 2 && left >= 2) {
                topk_pass<kMaxPass>(p, tok_base + tk, kWarps, bias, lane);
                tk += 2 * kWarps;
            } else {
                topk_pass<1>(p, tok_base + tk, kWarps, bias, lane);
                tk += kWarps;
            }
        }
    }
};

// ---- decode variant (M <= 32): whole-K dot products, one arrival level ---------------------------------
// Why: the split-K tile above needs three serial global rounds (partials -> a last CTA per expert group ->
// a last CTA per token tile), each a fence + atomic + barrier; on the H200 engine profile (2026-11-29) the
// router was ~11 us per layer at 1 token, against 0.74 us for its 3.1 MB of gate weights. Here a CTA owns
// kEpc experts and its 8 warps split K in kKParts parts, so every logit is finished inside one CTA; the
// last CTA to arrive (one counter) runs the same top-k epilogue over all M <= 32 tokens.
//
// Work split: warp w -> expert kEpc * cta + w % kEpc, K part w / kEpc ([part * kKPerWarp, +kKPerWarp));
// lane L holds the gate columns part * kKPerWarp + (32 i + L) * 8 .. +8 for i < kVec (16-byte loads, a
// warp-instruction covers 512 contiguous bytes), loaded before griddepcontrol.wait. Per token (two at a
// time for load ILP): fp32 FMAs over the lane's columns in (i, element) order, a butterfly sum over the
// warp, the part's sum to shared memory; then thread (token, expert) adds the parts in part order and
// writes the logit. Fixed orders throughout: bitwise deterministic (not bitwise equal to the split-K
// tile: another summation order).
template <int kHidden, int kExperts, int kTopK>
struct RouterDecodeTile {
    using Base = RouterTile<kHidden, kExperts, kTopK>;
    static constexpr int kThreads = Base::kThreads;  // 256
    static constexpr int kWarps = Base::kWarps;      // 8
    static constexpr int kMaxTokens = 32;            // one token tile: Base::topk_epilogue's warp loop
    // K parts: the largest of 4, 2, 1 dividing the 256-column chunks (so every warp's range is whole 256-column
    // chunks for any H the split-K kernel takes); experts per CTA = 8 warps / parts.
    static constexpr int kChunks = kHidden / 256;
    static constexpr int kKParts = kChunks % 4 == 0 ? 4 : (kChunks % 2 == 0 ? 2 : 1);
    static constexpr int kEpc = kWarps / kKParts;    // experts per CTA (2 for GLM-5, 4 for the small preset)
    static constexpr int kKPerWarp = kHidden / kKParts;
    static constexpr int kVec = kKPerWarp / (32 * 8);  // 16-byte gate loads per lane
    static constexpr int kCounter = Base::kCounterWords;  // the one arrival counter, after the split-K ones
    // Configs the decode kernel does not take (experts not a multiple of kEpc) still build the cubin: its
    // kernel then only returns, and the launcher never selects it (ops.moe_router RouterConfig.decode_supported).
    static constexpr bool kSupported = kExperts % kEpc == 0;

    static_assert(kHidden % 256 == 0 && kWarps % kKParts == 0 && kKPerWarp % 256 == 0 && kVec >= 1, "K parts");
    static_assert(kKParts * kEpc * kMaxTokens + 4 <= Base::kScratchFloats, "partials fit the scratch");

    struct Weights {
        ptx::u32x4 v[kVec];
    };

    static constexpr int kCtas = kSupported ? kExperts / kEpc : 1;  // grid size

    static GLM5_DEVICE void load_weights(Weights& w, const uint16_t* __restrict__ gate, int cta, int tid) {
        const int warp = tid >> 5, lane = tid & 31;
        const int e = cta * kEpc + warp % kEpc, part = warp / kEpc;
        const uint16_t* row = gate + static_cast<int64_t>(e) * kHidden + part * kKPerWarp;
#pragma unroll
        for (int i = 0; i < kVec; ++i) w.v[i] = ptx::ld_global_nc_v4(row + (32 * i + lane) * 8);
    }

    static GLM5_DEVICE float dot8(const ptx::u32x4& a, const ptx::u32x4& b, float acc) {
        const uint32_t x[4] = {a.x, a.y, a.z, a.w}, y[4] = {b.x, b.y, b.z, b.w};
#pragma unroll
        for (int j = 0; j < 4; ++j) {
            acc = fmaf(ptx::bf16lo_to_f32(x[j]), ptx::bf16lo_to_f32(y[j]), acc);
            acc = fmaf(ptx::bf16hi_to_f32(x[j]), ptx::bf16hi_to_f32(y[j]), acc);
        }
        return acc;
    }

    static GLM5_DEVICE float warp_sum(float v) {
#pragma unroll
        for (int off = 16; off > 0; off >>= 1) v += __shfl_xor_sync(0xffffffffu, v, off);
        return v;  // every lane: the same bits (butterfly)
    }

    // All 256 threads; call after griddepcontrol.wait. This CTA computes the logits of its kEpc experts for tokens
    // [m0, m1) (m1 - m0 <= kMaxTokens): the grid's y dimension deals the tokens (token-parallel: every y slice
    // runs the same short loop, so M tokens cost about what m1 - m0 cost, instead of a serial loop over all M).
    // `arrivals` = every CTA of the grid (the last one runs the top-k of all M tokens). Per token the summation
    // order does not depend on the slice: the logits are bitwise those of a one-slice launch. Returns true in the
    // CTA that ran the top-k epilogue (as RouterTile::run).
    static GLM5_DEVICE bool run(const Weights& w, const RouterPtrs& p, int cta, float* scratch, int tid, int m0 = 0,
                                int m1 = -1, int arrivals = kCtas) {
        const int warp = tid >> 5, lane = tid & 31;
        const int el = warp % kEpc, part = warp / kEpc;
        const int m_n = m1 < 0 ? p.num_tokens : m1;
        float* part_sums = scratch;  // [kKParts][kEpc][kMaxTokens], token index relative to m0
        const uint16_t* hcol = p.h + part * kKPerWarp + lane * 8;
        for (int m = m0; m < m_n; m += 2) {
            const bool two = m + 1 < m_n;
            ptx::u32x4 a[kVec], b[kVec];
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                a[i] = ptx::ld_global_v4(hcol + static_cast<int64_t>(m) * kHidden + 32 * 8 * i);
                b[i] = two ? ptx::ld_global_v4(hcol + static_cast<int64_t>(m + 1) * kHidden + 32 * 8 * i)
                           : ptx::u32x4{0u, 0u, 0u, 0u};
            }
            float s0 = 0.0f, s1 = 0.0f;
#pragma unroll
            for (int i = 0; i < kVec; ++i) {
                s0 = dot8(w.v[i], a[i], s0);
                s1 = dot8(w.v[i], b[i], s1);
            }
            s0 = warp_sum(s0);
            s1 = warp_sum(s1);
            if (lane == 0) {
                part_sums[(part * kEpc + el) * kMaxTokens + (m - m0)] = s0;
                if (two) part_sums[(part * kEpc + el) * kMaxTokens + (m - m0) + 1] = s1;
            }
        }
        ptx::named_barrier_sync<0, kThreads>();
        if (tid < (m_n - m0) * kEpc) {
            const int r = tid / kEpc, e = tid % kEpc;
            float l = part_sums[e * kMaxTokens + r];
#pragma unroll
            for (int k = 1; k < kKParts; ++k) l += part_sums[(k * kEpc + e) * kMaxTokens + r];
            ptx::st_global_f32(p.logits + static_cast<int64_t>(m0 + r) * kExperts + cta * kEpc + e, l);
        }
        // one arrival level: the last CTA runs the top-k epilogue over every token (it reads the logits with
        // ld.global.cg after the acquire in arrive_last)
        GLM5_ROUTER_MARK(2);
        if (!Base::arrive_last(p.counters + kCounter, arrivals, scratch, tid)) return false;
        GLM5_ROUTER_MARK(3);
        Base::template topk_epilogue<1>(p, 0, p.num_tokens, warp, lane);
        GLM5_ROUTER_MARK(4);
        return true;
    }
};

}  // namespace moe
}  // namespace glm5
