// E1 tile: paged FP8 indexer logits of ONE (sequence, KV split), i.e. up to kMaxPages 64-token
// pages of one sequence's index-K cache against that sequence's indexer query.
//
// Framework-free (raw pointers, e4m3 as bytes), so the same tile runs from the standalone launcher
// (e1_indexer_logits.cu: one CTA per (split, sequence)) and, later, from a persistent megakernel
// that hands a group of kThreads threads one tile at a time.
//
// Math (glm5_fastpath.ref.prefix.e1_indexer_logits), for t0 <= t < t_end:
//   t <  seq_len: logits[t] = s_k[t] * sum_h w[h] * max(sum_d q8[h,d] * k8[t,d], 0)
//   t >= seq_len: logits[t] = -inf
// with logical token t at physical page block_table[t / 64], row t % 64. q8/k8 products are exact
// (e4m3 -> f16 is exact, so is the f16 x f16 product), sums are fp32 (tensor-core accumulation,
// then the head sum as an fp32 FMA chain + a fixed shuffle tree): deterministic, ~1e-7 relative.
//
// Cache page (kPageBytes = 64 * (kDim + 4)): [64 tokens x kDim e4m3][64 x fp32 scale s_k].
//
// Data movement. Thread 0 streams whole pages global -> shared with the bulk copy engine
// (cp.async.bulk, one instruction per page, completing on a per-stage mbarrier), kStages pages
// ahead. A page is used by all warps and then released with one CTA barrier, after which thread 0
// refills that stage. Pages past seq_len are never read; a block-table entry outside
// [0, num_pages) for a live page is never dereferenced: its tokens' logits are NaN instead.
//
// Compute. Heads are the MMA M side (16 per m-tile, padded with zero rows up to a multiple of
// 16), tokens the N side (8 per n-tile), the head dim the K side. Warp w owns tokens
// [w * kTokPerWarp, (w+1) * kTokPerWarp) of every page. The q tile stays in registers for the
// whole tile as f16x2 MMA A-fragments (converted once); each page row is read from shared memory
// with 16-byte loads and unpacked to f16x2 B-fragments. MMA is mma.sync m16n8k16 f16 -> fp32.
//
// K-permutation. A dot product does not care in which order its K terms are summed, as long as
// A and B use the same order. Lane (g = lane/4, t = lane%4) reads the 16-byte chunks at bytes
// c*64 + t*16 (c < kDim/64) of a row -- for A the q row of head g + 8r, for B the cache row of
// token g of the n-tile -- and unpacks them into kWords f16 pairs; MMA step s takes pairs 2s and
// 2s+1 as its {k = 2t, 2t+1} and {k = 2t+8, 2t+9} fragment slots, on both operands. So logical k
// of step s maps to the same physical dim for A and B (a bijection over all kDim dims), and every
// operand load is one aligned 16-byte vector.
//
// Epilogue per n-tile: the lane holds D[head][token] for heads g + 8r and tokens 2t, 2t+1; it
// applies ReLU (NaN-propagating, like torch.clamp_min), the fp32 head weights (FMA chain over
// r), reduces over the 8 lanes of equal t (xor 4, 8, 16), and lanes g == 0 write
// s_k * sum into a shared logits buffer. The tile's output columns are then written coalesced.
//
// kPackedQ: keep q (and each cache row) in registers as raw e4m3 words (kChunks x 4 words per row
// instead of kWords f16 pairs: 32 instead of 64 q registers at 32 heads x 128 dims) and convert each MMA
// step's fragments when they are used (q's conversions repeat per n-tile). The conversion is exact, so the
// logits are bitwise the same; the MegaRTP megakernel uses it to fit its 168-register budget.
//
// PDL split (the launcher's business, see e1_indexer_logits.cu): prologue() reads only the
// block table (and may prefetch the first pages into L2); run() reads q, head_w and the cache,
// which are all the preceding kernels' outputs, so it must come after griddep_wait().
#pragma once

#include "../common/arch.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/mma_f16.cuh"
#include "../common/pdl.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// One tile's inputs. Pointers are already offset to the tile's sequence.
struct E1TileArgs {
    const uint8_t* q;            // [kHeads, kDim] e4m3 (16-byte aligned)
    const float* head_w;         // [kHeads] fp32
    const uint8_t* cache;        // [num_pages, kPageBytes] index-K cache (16-byte aligned)
    const int32_t* block_table;  // the sequence's row: logical page -> physical page
    float* logits;               // the sequence's output row
    int64_t num_pages;           // pages in the cache: ids outside [0, num_pages) are never read
    int32_t seq_len;             // live tokens (caller clamps to [0, block-table capacity])
    int32_t t0;                  // first output column of the tile (a multiple of 64)
    int32_t t_end;               // one past the last output column; t_end - t0 <= kMaxPages * 64
};

template <int kHeads, int kDim, int kStages, int kMaxPages, int kThreads = 128, int kBarrierId = 0,
          bool kPackedQ = false>
struct E1IndexerLogitsTile {
    static constexpr int kPageTokens = 64;
    static constexpr int kKBytes = kPageTokens * kDim;
    static constexpr int kPageBytes = kKBytes + kPageTokens * 4;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kTokPerWarp = kPageTokens / kWarps;
    static constexpr int kNTiles = kTokPerWarp / 8;
    static constexpr int kMTiles = (kHeads + 15) / 16;
    static constexpr int kRows = 2 * kMTiles;  // q rows (heads g + 8r) per lane
    static constexpr int kChunks = kDim / 64;  // 16-byte chunks per lane per row
    static constexpr int kWords = kChunks * 8;  // f16 pairs per lane per row
    static constexpr int kQWords = kPackedQ ? kChunks * 4 : kWords;  // q registers per lane per row
    static constexpr int kSteps = kDim / 16;    // m16n8k16 steps over the head dim
    static constexpr int kMaxTokens = kMaxPages * kPageTokens;

    // Shared memory the caller provides (16-byte aligned base), kSmemBytes in all:
    static constexpr int kStagesOff = 0;                                   // kStages x page
    static constexpr int kLogitsOff = kStages * kPageBytes;                // kMaxTokens fp32
    static constexpr int kPageIdsOff = kLogitsOff + kMaxTokens * 4;        // kMaxPages int32
    static constexpr int kBarsOff = (kPageIdsOff + kMaxPages * 4 + 7) / 8 * 8;  // kStages mbarriers
    static constexpr int kSmemBytes = kBarsOff + kStages * 8;

    // A stuck bulk copy is a bug, not a state to wait out: trap (fail loudly) after this long.
    static constexpr uint64_t kWaitTimeoutNs = 10ull * 1000 * 1000 * 1000;

    static_assert(kHeads >= 1 && kHeads <= 32, "1..32 heads (two 16-row m-tiles of q in registers)");
    static_assert(kDim >= 64 && kDim % 64 == 0, "head dim must be a multiple of 64 (4 lanes x 16 B per 64 dims)");
    static_assert(kPageBytes % 16 == 0, "bulk copies move multiples of 16 bytes");
    static_assert(kThreads % 32 == 0 && kPageTokens % kWarps == 0 && kTokPerWarp % 8 == 0,
                  "each warp owns whole 8-token n-tiles of a page");
    static_assert(kStages >= 1 && kMaxPages >= 1, "at least one stage and one page");
    static_assert(kWords == 2 * kSteps, "each MMA step takes two f16 pairs per row");

    static GLM5_DEVICE int32_t* page_ids(uint8_t* smem) { return reinterpret_cast<int32_t*>(smem + kPageIdsOff); }
    static GLM5_DEVICE uint64_t* bars(uint8_t* smem) { return reinterpret_cast<uint64_t*>(smem + kBarsOff); }
    static GLM5_DEVICE float* slogits(uint8_t* smem) { return reinterpret_cast<float*>(smem + kLogitsOff); }

    // Pages of the tile that hold live tokens (the only pages read).
    static GLM5_DEVICE int live_pages(const E1TileArgs& a) {
        const int live_end = min(a.seq_len, a.t_end);
        return live_end > a.t0 ? (live_end - a.t0 + kPageTokens - 1) / kPageTokens : 0;
    }

    // Before griddep_wait(): block-table lookups into shared memory, mbarrier init and, when
    // l2_prefetch, an L2 prefetch of the first kStages pages (a hint only: it returns nothing and
    // L2 is coherent, so it is safe while the producer still writes the cache). Ends with a CTA
    // barrier. Reads nothing that the preceding kernels write except through that hint.
    static GLM5_DEVICE void prologue(const E1TileArgs& a, uint8_t* smem, int tid, bool l2_prefetch) {
        int32_t* ids = page_ids(smem);
        const int n = live_pages(a);
        const int first = a.t0 / kPageTokens;
        for (int i = tid; i < n; i += kThreads) {
            const int32_t pid = a.block_table[first + i];
            const bool ok = pid >= 0 && pid < a.num_pages;
            ids[i] = ok ? pid : -1;
            if (ok && l2_prefetch && i < kStages)
                ptx::bulk_prefetch_l2(a.cache + static_cast<int64_t>(pid) * kPageBytes, kPageBytes);
        }
        if (tid == 0) {
#pragma unroll
            for (int s = 0; s < kStages; ++s) ptx::mbarrier_init(&bars(smem)[s], 1);
            ptx::fence_mbarrier_init();
        }
        ptx::named_barrier_sync<kBarrierId, kThreads>();
    }

    // The L2 prefetch of the first kStages live pages from the ids prologue() stored (call it after
    // prologue(..., l2_prefetch=false), whose CTA barrier publishes the ids): the GLM5_PDL_WAIT_AT=1
    // build's split of prologue(..., true) around its wait. A hint only, like the prologue's.
    static GLM5_DEVICE void prefetch_l2(const E1TileArgs& a, uint8_t* smem, int tid) {
        const int32_t* ids = page_ids(smem);
        const int n = min(live_pages(a), kStages);
        for (int i = tid; i < n; i += kThreads) {
            const int32_t pid = ids[i];
            if (pid >= 0) ptx::bulk_prefetch_l2(a.cache + static_cast<int64_t>(pid) * kPageBytes, kPageBytes);
        }
    }

    // After griddep_wait(): stream the live pages, compute, write columns [t0, t_end).
    // All kThreads threads call it. The caller must barrier before reusing `smem` for another tile.
    static GLM5_DEVICE void run(const E1TileArgs& a, uint8_t* smem, int tid) {
        const int n = live_pages(a);
        if (n > 0) {
            if (tid == 0) {
                for (int i = 0; i < kStages && i < n; ++i) issue(a, smem, i);
            }
            compute_pages(a, smem, n, tid);  // ends with a CTA barrier
        }
        const float* slog = slogits(smem);
        const float neg_inf = __int_as_float(0xff800000);
        for (int t = a.t0 + tid; t < a.t_end; t += kThreads)
            ptx::st_global_f32(a.logits + t, t < a.seq_len ? slog[t - a.t0] : neg_inf);
        if (tid == 0) {  // every thread has finished its last wait (it passed the barrier after it)
#pragma unroll
            for (int s = 0; s < kStages; ++s) ptx::mbarrier_inval(&bars(smem)[s]);
        }
    }

   private:
    // Coherent fp32 load (head_w is the preceding kernel's output: never the non-coherent path).
    static GLM5_DEVICE float ld_coherent_f32(const float* p) {
        float v;
        asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
        return v;
    }

    // Thread 0: page i of the tile into stage i % kStages (an invalid page id only arrives, so the
    // phase completes with nothing copied).
    static GLM5_DEVICE void issue(const E1TileArgs& a, uint8_t* smem, int i) {
        const int s = i % kStages;
        const int32_t pid = page_ids(smem)[i];
        uint64_t* bar = &bars(smem)[s];
        if (pid >= 0) {
            ptx::mbarrier_arrive_expect_tx(bar, kPageBytes);
#if defined(GLM5_E1_CACHE_EVICT_FIRST) && GLM5_E1_CACHE_EVICT_FIRST
            // Each page is read once per step: evict-first, so the index-K stream (17.9 MB at 16 sequences of 8192
            // tokens, 72 MB at 64) does not push code and activations out of L2 (the megakernel's opt-in,
            // GLM5_FASTPATH_MRTP_E1_EVICT_FIRST).
            ptx::bulk_copy_g2s_hint(smem + kStagesOff + s * kPageBytes,
                                    a.cache + static_cast<int64_t>(pid) * kPageBytes, kPageBytes, bar,
                                    ptx::l2_policy_evict_first());
#else
            ptx::bulk_copy_g2s(smem + kStagesOff + s * kPageBytes, a.cache + static_cast<int64_t>(pid) * kPageBytes,
                               kPageBytes, bar);
#endif
        } else {
            ptx::mbarrier_arrive(bar);
        }
    }

    static GLM5_DEVICE void wait_stage(uint64_t* bar, uint32_t parity) {
        if (ptx::mbarrier_try_wait_parity(bar, parity)) return;
        const uint64_t start = ptx::globaltimer_ns();
        while (!ptx::mbarrier_try_wait_parity(bar, parity)) {
            if (ptx::globaltimer_ns() - start > kWaitTimeoutNs) __trap();
        }
    }

    // 16 bytes = 16 e4m3 -> 8 f16 pairs, byte order kept (pair p = bytes 2p, 2p+1).
    static GLM5_DEVICE void unpack16(const ptx::u32x4& v, uint32_t* out) {
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
        for (int k = 0; k < 4; ++k) {
            out[2 * k] = ptx::e4m3x2_to_f16x2(static_cast<uint16_t>(w[k] & 0xffffu));
            out[2 * k + 1] = ptx::e4m3x2_to_f16x2(static_cast<uint16_t>(w[k] >> 16));
        }
    }

    static GLM5_DEVICE void compute_pages(const E1TileArgs& a, uint8_t* smem, int n, int tid) {
        const int lane = tid & 31;
        const int warp = tid >> 5;
        const int g = lane >> 2;
        const int t4 = lane & 3;

        // q as f16x2 A-fragments (kPackedQ: raw e4m3 words) and the head weights, once per tile (zero rows
        // past kHeads).
        uint32_t qf[kRows][kQWords];
        float w[kRows];
#pragma unroll
        for (int r = 0; r < kRows; ++r) {
            const int head = g + 8 * r;
            if (head < kHeads) {
#pragma unroll
                for (int c = 0; c < kChunks; ++c) {
                    const ptx::u32x4 v = ptx::ld_global_v4(a.q + head * kDim + c * 64 + t4 * 16);
                    if constexpr (kPackedQ) {
                        qf[r][c * 4 + 0] = v.x;
                        qf[r][c * 4 + 1] = v.y;
                        qf[r][c * 4 + 2] = v.z;
                        qf[r][c * 4 + 3] = v.w;
                    } else {
                        unpack16(v, &qf[r][c * 8]);
                    }
                }
                w[r] = ld_coherent_f32(a.head_w + head);
            } else {
#pragma unroll
                for (int k = 0; k < kQWords; ++k) qf[r][k] = 0u;
                w[r] = 0.0f;
            }
        }

        const int32_t* ids = page_ids(smem);
        float* slog = slogits(smem);
        for (int i = 0; i < n; ++i) {
            const int s = i % kStages;
            wait_stage(&bars(smem)[s], static_cast<uint32_t>((i / kStages) & 1));
            const uint8_t* stage = smem + kStagesOff + s * kPageBytes;
            float* out = slog + i * kPageTokens;
            if (ids[i] >= 0) {
                page_logits(stage, qf, w, out, warp, g, t4);
            } else if (lane < kTokPerWarp) {  // unreadable page: NaN marks its tokens
                out[warp * kTokPerWarp + lane] = __int_as_float(0x7fffffff);
            }
            ptx::named_barrier_sync<kBarrierId, kThreads>();  // stage s is free, out[] is complete
            if (tid == 0 && i + kStages < n) issue(a, smem, i + kStages);
        }
    }

    // This warp's kTokPerWarp tokens of one page in shared memory -> out[token] (page-relative).
    // MMA fragment pair p (0..kWords) of a row held in `words`: the pair itself, or (kPackedQ) converted
    // from packed word p / 2 (pairs 2k, 2k + 1 are the low / high half of word k, the byte order unpack16
    // keeps). Used for q rows and cache rows alike.
    static GLM5_DEVICE uint32_t pair(const uint32_t* words, int p) {
        if constexpr (kPackedQ) {
            const uint32_t word = words[p >> 1];
            return ptx::e4m3x2_to_f16x2(static_cast<uint16_t>((p & 1) ? (word >> 16) : (word & 0xffffu)));
        } else {
            return words[p];
        }
    }

    static GLM5_DEVICE void page_logits(const uint8_t* stage, const uint32_t (&qf)[kRows][kQWords],
                                        const float (&w)[kRows], float* out, int warp, int g, int t4) {
#pragma unroll
        for (int j = 0; j < kNTiles; ++j) {
            const int tok_base = warp * kTokPerWarp + j * 8;
            const uint8_t* row = stage + (tok_base + g) * kDim + t4 * 16;
            // the cache row's B fragments (kPackedQ: raw words, converted at the step like q)
            uint32_t kf[kPackedQ ? kChunks * 4 : kWords];
#pragma unroll
            for (int c = 0; c < kChunks; ++c) {
                const ptx::u32x4 v = *reinterpret_cast<const ptx::u32x4*>(row + c * 64);
                if constexpr (kPackedQ) {
                    kf[c * 4 + 0] = v.x;
                    kf[c * 4 + 1] = v.y;
                    kf[c * 4 + 2] = v.z;
                    kf[c * 4 + 3] = v.w;
                } else {
                    unpack16(v, &kf[c * 8]);
                }
            }

            float acc[kMTiles][4];
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) acc[mt][0] = acc[mt][1] = acc[mt][2] = acc[mt][3] = 0.0f;
#pragma unroll
            for (int s = 0; s < kSteps; ++s) {
#pragma unroll
                for (int mt = 0; mt < kMTiles; ++mt)
                    ptx::mma_m16n8k16_f16_f32(acc[mt], pair(qf[2 * mt], 2 * s), pair(qf[2 * mt + 1], 2 * s),
                                              pair(qf[2 * mt], 2 * s + 1), pair(qf[2 * mt + 1], 2 * s + 1),
                                              pair(kf, 2 * s), pair(kf, 2 * s + 1));
            }

            // acc[mt][0..1]: head g + 16mt (= row 2mt), tokens 2t4, 2t4+1; acc[mt][2..3]: head g + 8 + 16mt.
            float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
            for (int mt = 0; mt < kMTiles; ++mt) {
                p0 = fmaf(w[2 * mt], ptx::relu_nan(acc[mt][0]), p0);
                p1 = fmaf(w[2 * mt], ptx::relu_nan(acc[mt][1]), p1);
                p0 = fmaf(w[2 * mt + 1], ptx::relu_nan(acc[mt][2]), p0);
                p1 = fmaf(w[2 * mt + 1], ptx::relu_nan(acc[mt][3]), p1);
            }
#pragma unroll
            for (int off = 4; off < 32; off <<= 1) {  // over g: the 8 lanes sharing t4
                p0 += __shfl_xor_sync(0xffffffffu, p0, off);
                p1 += __shfl_xor_sync(0xffffffffu, p1, off);
            }
            if (g == 0) {
                const int tok = tok_base + 2 * t4;
                const float2 sk = *reinterpret_cast<const float2*>(stage + kKBytes + tok * 4);
                *reinterpret_cast<float2*>(out + tok) = make_float2(p0 * sk.x, p1 * sk.y);
            }
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
