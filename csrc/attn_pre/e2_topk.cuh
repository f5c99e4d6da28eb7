// E2 tile: top-k of ONE row of indexer logits by radix select, translated to physical KV slots.
//
// Framework-free (raw pointers) so the same tile runs from the standalone launcher (e2_topk.cu,
// one CTA per row) and, later, from a persistent megakernel that hands a group of kThreads
// threads one row at a time.
//
// Contract (what glm5_fastpath.ops.e2_topk documents and the tests check):
//   L = clamp(seq_len, 0, min(width, bt_cols * 64)).  (The reference raises when seq_len exceeds
//       the logits width or the block-table capacity; a kernel cannot raise, so it clamps and
//       never reads out of bounds.)
//   slot(t) = bt[t / 64] * 64 + t % 64, computed in 64 bits and stored as int32.
//   L <= topk: out = [slot(0), ..., slot(L-1), -1 x (topk - L)]   (every token is taken).
//   L >  topk: out holds the slots of exactly topk positions: the topk largest logits, ties at
//       the k-th value broken towards the LOWER logical position (the reference's rule, so the
//       selected SET equals the reference's). Output order: deterministic (a function of the
//       row's values only), two runs of ascending position: first the positions whose key is
//       above the radix prefix where the search stopped, then the taken positions inside that
//       prefix (where the k-th value's ties are cut: the lowest positions are taken). Not sorted
//       by logit: the consumer (sparse MLA) does not care, and sorting costs a pass.
//   Value order: the fp32 bit pattern made order-preserving (key = bits ^ (sign ? ~0 : 1<<31)),
//   with -0.0 read as +0.0 (they are equal values, so they tie like the reference) and every NaN
//   mapped to key 0, below -inf (a NaN is taken only when fewer than topk live tokens are not
//   NaN; the reference raises on NaN). -inf is an ordinary value above NaN.
//
// Algorithm (one CTA of kThreads threads per row; thread t owns kItems CONTIGUOUS positions
// t*kItems .. t*kItems+kItems-1 of each chunk of kChunk = kThreads*kItems positions, so thread
// order is position order and one page-table entry covers all of a thread's items):
//   round 1: histogram of key bits 31..21 (2048 bins, shared-memory atomics) over live tokens;
//            a block scan over the bins in descending order finds the bin b1 holding the k-th
//            largest key, `above` = keys in higher bins, cnt = keys in b1.
//            If cnt == k - above, every key of b1 is taken: done (the common case is to stop
//            after round 1 or 2).
//   round 2: the same over bits 20..10 for the keys whose bits 31..21 == b1 (2048 bins).
//   round 3: bits 9..0 (1024 bins); after it the k-th key is known exactly.
//   compaction: per chunk a block exclusive scan of (count greater | count equal << 16) gives
//            every thread its output offsets: greater ones go to [0, k - need) in position
//            order, equal ones (ties) take ranks [0, need) in position order and the first need
//            of them go to [k - need, k).
//   Rows with L <= kChunk keep their keys in registers (one HBM read of the row, no shared
//   memory copy); longer rows are re-read from global memory (L2) for every round.
//
// Barriers: 3 per round (histogram done, scan totals, result broadcast), 1 per compaction
// chunk; the shared scan scratch is double-buffered so a scan needs just one barrier.
#pragma once

#include "../common/arch.cuh"
#include "../common/pdl.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

// Arguments of one row. Pointers are to this row's data.
struct E2RowArgs {
    const float* logits;     // [width] fp32 logits of the row (positions >= seq_len are ignored)
    int32_t width;           // readable columns of the row
    const void* seq_len;     // -> this row's seq_len (int32 or int64, see seq_len_64)
    const void* bt;          // -> this row's block table [bt_cols] (int32 or int64, see bt_64)
    int32_t bt_cols;         // pages in the row of the block table
    int32_t* out;            // [topk] int32 slots, -1 padded
    int32_t topk;            // k >= 1
    bool seq_len_64;
    bool bt_64;
};

template <int kThreads, int kItems, int kBarrierId = 0>
struct E2TopkTile {
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kChunk = kThreads * kItems;
    static constexpr int kPage = 64;                   // index-K / KV page (tokens)
    static constexpr int kBins = 2048;                 // rounds 1 and 2 (11 bits); round 3 uses 1024
    static_assert(kThreads % 32 == 0 && kThreads >= 128 && kThreads <= 1024, "whole warps, 128..1024 threads");
    static_assert(kItems == 4 || kItems == 8 || kItems == 16, "items per thread: 4, 8 or 16 (16-byte loads, one page)");
    static_assert(kBins % kThreads == 0 && 1024 % kThreads == 0, "bins split evenly over threads");
    static_assert(kChunk < 65536, "the compaction scan packs two 16-bit per-chunk counts");
    static_assert(kPage % kItems == 0, "a thread's items lie in one page");

    // Shared memory the caller provides (static or carved from a larger buffer), 16.5 KB at most.
    struct Smem {
        int hist[2][kBins];
        int wtot[2][32];
        int res[4];
    };

    // Zero both histograms. Call before run() with a barrier in between; run() has one before its
    // first atomic (it costs nothing: it sits in the shadow of the first global loads). The
    // launcher calls this before griddepcontrol.wait. A megakernel calling run() for another row
    // must put a barrier after the previous run() and call prologue() again.
    static GLM5_DEVICE void prologue(Smem& s, int tid) {
#pragma unroll
        for (int i = tid; i < 2 * kBins; i += kThreads) (&s.hist[0][0])[i] = 0;
    }

    static GLM5_DEVICE void bar() { ptx::named_barrier_sync<kBarrierId, kThreads>(); }

    // Order-preserving key of an fp32 bit pattern; -0.0 -> +0.0, NaN -> 0 (lowest).
    static GLM5_DEVICE uint32_t to_key(uint32_t b) {
        b = (b == 0x80000000u) ? 0u : b;
        const uint32_t k = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
        return ((b & 0x7fffffffu) > 0x7f800000u) ? 0u : k;
    }

    // Raw bits of the kItems positions [base, base + kItems); positions >= width read as 0.
    static GLM5_DEVICE void load_bits(const float* row, int64_t base, int32_t width, bool vec_ok,
                                      uint32_t (&v)[kItems]) {
        if (vec_ok && base + kItems <= width) {
#pragma unroll
            for (int q = 0; q < kItems / 4; ++q) {
                const ptx::u32x4 x = ptx::ld_global_v4(row + base + 4 * q);
                v[4 * q] = x.x;
                v[4 * q + 1] = x.y;
                v[4 * q + 2] = x.z;
                v[4 * q + 3] = x.w;
            }
        } else {
#pragma unroll
            for (int j = 0; j < kItems; ++j)
                v[j] = (base + j < width) ? __float_as_uint(row[base + j]) : 0u;
        }
    }

    static GLM5_DEVICE int64_t page_entry(const E2RowArgs& a, int64_t logical_page) {
        return a.bt_64 ? static_cast<const int64_t*>(a.bt)[logical_page]
                       : static_cast<int64_t>(static_cast<const int32_t*>(a.bt)[logical_page]);
    }

    static GLM5_DEVICE int32_t slot(int64_t page, int64_t pos) {
        return static_cast<int32_t>(page * kPage + (pos & (kPage - 1)));
    }

    // Inclusive warp scan (Kogge-Stone over shuffles).
    static GLM5_DEVICE int warp_incl_scan(int v, int lane) {
#pragma unroll
        for (int off = 1; off < 32; off <<= 1) {
            const int u = __shfl_up_sync(0xffffffffu, v, off);
            if (lane >= off) v += u;
        }
        return v;
    }

    // Block exclusive scan in thread order; *total = sum over the block. One barrier; `wtot` must
    // not be the buffer of the previous scan (callers alternate s.wtot[0] / s.wtot[1]).
    static GLM5_DEVICE int block_excl_scan(int v, int* wtot, int* total, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        const int incl = warp_incl_scan(v, lane);
        if (lane == 31) wtot[warp] = incl;
        bar();
        const int wt = lane < kWarps ? wtot[lane] : 0;
        const int wincl = warp_incl_scan(wt, lane);
        *total = __shfl_sync(0xffffffffu, wincl, 31);
        const int before = __shfl_sync(0xffffffffu, wincl, warp > 0 ? warp - 1 : 0);
        return (warp > 0 ? before : 0) + incl - v;
    }

    // ---- key sources: where a round reads chunk c's keys from ----------------------------------

    // The whole row (L <= kChunk) lives in registers.
    struct RegSource {
        const uint32_t (&keys)[kItems];
        int64_t page;  // block-table entry of this thread's page (prefetched)
        GLM5_DEVICE int chunks() const { return 1; }
        GLM5_DEVICE void get(int, uint32_t (&k)[kItems]) const {
#pragma unroll
            for (int j = 0; j < kItems; ++j) k[j] = keys[j];
        }
        GLM5_DEVICE int64_t page_of(const E2RowArgs&, int) const { return page; }
    };

    // Longer rows: re-read from global memory (L2 after the first round).
    struct GlobalSource {
        const float* row;
        int32_t width;
        bool vec_ok;
        int n_chunks;
        int tid;
        GLM5_DEVICE int chunks() const { return n_chunks; }
        GLM5_DEVICE void get(int c, uint32_t (&k)[kItems]) const {
            load_bits(row, static_cast<int64_t>(c) * kChunk + tid * kItems, width, vec_ok, k);
#pragma unroll
            for (int j = 0; j < kItems; ++j) k[j] = to_key(k[j]);
        }
        GLM5_DEVICE int64_t page_of(const E2RowArgs& a, int c) const {
            return page_entry(a, (static_cast<int64_t>(c) * kChunk + tid * kItems) / kPage);
        }
    };

    // One radix round: histogram of digit (key >> kShift) & (kRoundBins - 1) over live keys with
    // (key & mask) == prefix; finds the bin holding the k_rem-th largest of them.
    // Writes s.res = {bin, above (count in higher bins), count in the bin}.
    template <int kRoundBins, int kShift, class Src>
    static GLM5_DEVICE void radix_round(const Src& src, int32_t L, uint32_t mask, uint32_t prefix, int k_rem,
                                        int* hist, int* hist_to_clear, int* wtot, Smem& s, int tid) {
        if (hist_to_clear != nullptr) {
#pragma unroll
            for (int i = tid; i < kBins; i += kThreads) hist_to_clear[i] = 0;
        }
        for (int c = 0; c < src.chunks(); ++c) {
            uint32_t k[kItems];
            src.get(c, k);
            const int64_t base = static_cast<int64_t>(c) * kChunk + tid * kItems;
            // run-length merge of equal digits inside the thread: fewer same-address atomics when
            // neighbouring logits are close (and all-equal rows cost one atomic per thread)
            int cur = -1, n = 0;
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                if (base + j < L && (k[j] & mask) == prefix) {
                    const int d = static_cast<int>((k[j] >> kShift) & (kRoundBins - 1));
                    if (d != cur) {
                        if (n) atomicAdd(&hist[cur], n);
                        cur = d;
                        n = 0;
                    }
                    ++n;
                }
            }
            if (n) atomicAdd(&hist[cur], n);
        }
        bar();
        // thread t owns bins kRoundBins-1-t*B .. kRoundBins-B-t*B (descending), B per thread
        constexpr int B = kRoundBins / kThreads;
        int h[B];
        int v = 0;
#pragma unroll
        for (int j = 0; j < B; ++j) {
            h[j] = hist[kRoundBins - 1 - tid * B - j];
            v += h[j];
        }
        int total;
        const int excl = block_excl_scan(v, wtot, &total, tid);
        if (excl < k_rem && k_rem <= excl + v) {
            int acc = excl;
            bool found = false;
#pragma unroll
            for (int j = 0; j < B; ++j) {
                if (!found && acc + h[j] >= k_rem) {
                    s.res[0] = kRoundBins - 1 - tid * B - j;
                    s.res[1] = acc;
                    s.res[2] = h[j];
                    found = true;
                }
                acc += h[j];
            }
        }
        bar();
    }

    template <class Src>
    static GLM5_DEVICE void select(const Src& src, const E2RowArgs& a, int32_t L, Smem& s, int tid) {
        const int k = a.topk;
        uint32_t mask = 0, prefix = 0;
        int k_rem = k;
        bool done = false;
        int wb = 1;  // the s.wtot buffer the NEXT scan uses (round 1 takes 0)
        // round 1: bits 31..21
        radix_round<2048, 21>(src, L, mask, prefix, k_rem, s.hist[0], nullptr, s.wtot[0], s, tid);
        {
            const int bin = s.res[0], above = s.res[1], cnt = s.res[2];
            prefix = static_cast<uint32_t>(bin) << 21;
            mask = 0xffe00000u;
            k_rem -= above;
            done = (cnt == k_rem);
        }
        if (!done) {  // round 2: bits 20..10
            radix_round<2048, 10>(src, L, mask, prefix, k_rem, s.hist[1], s.hist[0], s.wtot[1], s, tid);
            wb = 0;
            const int bin = s.res[0], above = s.res[1], cnt = s.res[2];
            prefix |= static_cast<uint32_t>(bin) << 10;
            mask = 0xfffffc00u;
            k_rem -= above;
            done = (cnt == k_rem);
        }
        if (!done) {  // round 3: bits 9..0 (hist[0] was cleared during round 2)
            radix_round<1024, 0>(src, L, mask, prefix, k_rem, s.hist[0], nullptr, s.wtot[0], s, tid);
            const int bin = s.res[0], above = s.res[1];
            prefix |= static_cast<uint32_t>(bin);
            mask = 0xffffffffu;
            k_rem -= above;
            wb = 1;
        }
        // compaction: greater -> [0, n_gt) in position order; equal -> ranks, first k_rem taken
        const int n_gt = k - k_rem;
        int g_base = 0, e_base = 0;
        for (int c = 0; c < src.chunks(); ++c) {
            uint32_t kk[kItems];
            src.get(c, kk);
            const int64_t base = static_cast<int64_t>(c) * kChunk + tid * kItems;
            uint32_t gt_bits = 0, eq_bits = 0;
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                const bool live = base + j < L;
                const uint32_t mk = kk[j] & mask;
                gt_bits |= static_cast<uint32_t>(live && mk > prefix) << j;
                eq_bits |= static_cast<uint32_t>(live && mk == prefix) << j;
            }
            const int ng = __popc(gt_bits), ne = __popc(eq_bits);
            int total;
            const int off = block_excl_scan(ng | (ne << 16), s.wtot[wb], &total, tid);
            wb ^= 1;
            if ((gt_bits | eq_bits) != 0) {
                const int64_t page = src.page_of(a, c);
                int go = g_base + (off & 0xffff);
                int eo = e_base + (off >> 16);
#pragma unroll
                for (int j = 0; j < kItems; ++j) {
                    if ((gt_bits >> j) & 1u) a.out[go++] = slot(page, base + j);
                    if ((eq_bits >> j) & 1u) {
                        if (eo < k_rem) a.out[n_gt + eo] = slot(page, base + j);
                        ++eo;
                    }
                }
            }
            g_base += total & 0xffff;
            e_base += total >> 16;
            if (g_base >= n_gt && e_base >= k_rem) break;  // uniform: totals are the same in every thread
        }
    }

    // All kThreads threads of the tile call this with the same row; tid in [0, kThreads).
    // Requires prologue() earlier (the barrier between them is the first one in here).
    static GLM5_DEVICE void run(const E2RowArgs& a, Smem& s, int tid) {
        // Issue every independent load first: seq_len, this thread's first kItems logits (whether
        // or not they are live; bounded by width), and the page entry of those positions.
        const int64_t seq = a.seq_len_64 ? *static_cast<const int64_t*>(a.seq_len)
                                         : static_cast<int64_t>(*static_cast<const int32_t*>(a.seq_len));
        const bool vec_ok = (reinterpret_cast<uintptr_t>(a.logits) & 15u) == 0;
        const int64_t base0 = static_cast<int64_t>(tid) * kItems;
        uint32_t keys[kItems];
        load_bits(a.logits, base0, a.width, vec_ok, keys);
        const int64_t cap = static_cast<int64_t>(a.bt_cols) * kPage;
        const int64_t page0 = (base0 < cap) ? page_entry(a, base0 / kPage) : 0;
        bar();  // prologue's zeroing is visible to every thread before any atomic

        const int64_t lim = cap < a.width ? cap : static_cast<int64_t>(a.width);
        const int32_t L = static_cast<int32_t>(seq < 0 ? 0 : (seq > lim ? lim : seq));
        if (L <= a.topk) {  // every token is taken, -1 after them
            for (int j = tid; j < a.topk; j += kThreads)
                a.out[j] = (j < L) ? slot(page_entry(a, j / kPage), j) : -1;
            return;
        }
        if (L <= kChunk) {
#pragma unroll
            for (int j = 0; j < kItems; ++j) keys[j] = to_key(keys[j]);
            select(RegSource{keys, page0}, a, L, s, tid);
        } else {
            select(GlobalSource{a.logits, a.width, vec_ok, (L + kChunk - 1) / kChunk, tid}, a, L, s, tid);
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
