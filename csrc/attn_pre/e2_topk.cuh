// E2 tile: top-k of ONE row of indexer logits, translated to physical KV slots, for latency.
//
// Framework-free (raw pointers): the same tile runs from the standalone launchers (e2_topk.cu: one
// CTA per row, or one CLUSTER of CTAs per row for long rows) and, later, from a persistent
// megakernel that hands a group of kThreads threads one row at a time (kCluster = false).
//
// Contract (what glm5_fastpath.ops.e2_topk documents and the tests check):
//   L = clamp(seq_len, 0, min(width, bt_cols * 64)).  (The reference raises when seq_len exceeds
//       the logits width or the block-table capacity; a kernel cannot raise, so it clamps and
//       never reads out of bounds.)
//   slot(t) = bt[t / 64] * 64 + t % 64, computed in 64 bits and stored as int32.
//   L <= topk: out = [slot(0), ..., slot(L-1), -1 x (topk - L)]   (every token is taken).
//   L >  topk: out = the slots of exactly topk positions, IN ASCENDING LOGICAL POSITION: the topk
//       largest logits, ties at the k-th value broken towards the LOWER position (the reference's
//       rule, so the selected SET equals the reference's). The order is a function of the
//       selected set alone (not of the algorithm), hence deterministic.
//   Value order: fp32 order with -0.0 == +0.0 and every NaN below -inf (as keys: the bit pattern
//   made order-preserving, key = bits ^ (sign ? ~0 : 1<<31), -0 -> +0, NaN -> 0).
//
// Why it is built this way: at decode sizes the time of a one-CTA-per-row top-k is the SM's
// instruction issue (8192 positions x every instruction spent per position / 128 lanes per clock,
// plus every per-thread instruction once per warp) plus the barrier chain, not bytes. So the row is
// read ONCE into registers (chunk 0: kChunk = kThreads*kItems positions, thread t owning the kItems
// CONTIGUOUS positions t*kItems.., so thread order is position order and one page-table entry
// covers a thread's items) and touched by only three cheap per-position passes:
//   1. range:  fminf / fmaxf of the live fp32 values (NaN ignored; a tree per thread), one block
//      reduction.
//   2. value pass: a shared histogram of a LINEAR bin of the value over [min, max] (kBins bins):
//          bin(v) = max(round(fma(v - vmin, scale, 2^23)), 2^23) - 2^23,
//          scale = (kBins - 1) / (vmax - vmin), all fp32 round-to-nearest
//      (3 full-rate instructions, the integer read from the float's low bits, no F2I; no upper
//      clamp: v - vmin <= the range, so the sum rounds to at most 2^23 + kBins - 1). Every step is
//      monotone, so bin() is monotone in the value order (NaN and -inf -> 0, +inf -> the top, a row
//      with a live +-inf or one value degenerates to one bin: still exact, only slower). For
//      typical logits the bin of the k-th value holds a handful of keys and no bin is a hot spot
//      for the shared atomics (a fixed 11-bit radix digit puts most of a row in a few bins). One
//      branch-free red.shared per position (the compiler makes it a warp-aggregated
//      ATOMS.POPC.INC). A block scan over the bins (from the top) finds the bin b holding the k-th
//      largest, `above` = keys in higher bins.
//   3. classification + compaction: every position is G (taken), C (a candidate) or neither:
//        - the bin's count == k - above: G = bin >= b, no candidates;
//        - <= kMaxCand keys in the bin: G = bin > b, C = bin == b, ranked (larger keys, then equal
//          keys at lower positions);
//        - else (rare: outliers, heavy ties): exact 11-bit radix passes on (key - lo) >> shift over
//          the bin's key interval [lo, hi] (at most 3, each ending like the cases above or at a
//          single key Kt): G = key > Kt, C = key == Kt, of which the first `need` are taken.
//      One block scan of (#G | #C << 16) gives every thread its offsets; a selected position goes
//      to out[#G before it + #selected C before it] (ascending position).
// Two implementations of step 3 (and of the pass loop around it):
//   - the single-chunk path (run_single / compact_single: one CTA, L <= kChunk, topk <= kStage,
//     i.e. every GLM-5 decode row): bin floats kept in registers, G / C bit masks per thread, an
//     unordered candidate list completed by the scan's barrier, warp 0's rank published as a
//     64-bit mask in position order, the output staged in shared memory and stored coalesced.
//     Barriers per row in the common "rank" case: range 1, histogram 1, bin search 2, scan (+list)
//     1, rank 1, stage 1 = 7, with ~15 instructions per position and no per-position branch,
//     shared load or scattered global store.
//   - the general path (compact: several chunks, clusters, topk > kStage): per-chunk scans, the
//     candidate list in position order, per-position lookups of the rank's prefix, direct stores.
// Global memory: one read of the row, the page entries (read before griddepcontrol.wait), one
// write of the output.
//
// Longer rows: chunks 1..smem_chunks of a CTA's segment live in dynamic shared memory (raw bits,
// thread-owned layout filled by cp.async, so no barrier guards them); chunks beyond that are
// re-read from global memory (L2) per pass. Cluster (kCluster = true): the row is split into n_cta
// contiguous segments of `chunks * kChunk` positions, one per CTA of a thread-block cluster; each
// cross-CTA step reads the peers' shared memory (DSMEM) after a cluster barrier: range (per-warp
// slots), histograms (every CTA sums all CTAs' bins and runs the same search, so all agree), the
// per-CTA (#G, #C) totals that give each CTA its output base, and the candidate lists.
#pragma once

#include "../common/arch.cuh"
#include "../common/cluster.cuh"
#include "../common/pdl.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/vec_io.cuh"

// Phase timestamps for the single-chunk path (a debug build defines it: e2_topk.cu with
// -DGLM5_E2_PHASES records clock64() of thread 0 of CTA 0 at each mark; the speed tests print the
// breakdown). Compiled out otherwise.
#ifndef GLM5_E2_PHASE
#define GLM5_E2_PHASE(i) ((void)0)
#endif

namespace glm5 {
namespace attn_pre {

// Order keys of fp32 bit patterns (host-visible constants: the tests emulate them).
constexpr uint32_t kE2KeyNegInf = 0x007fffffu;  // key of -inf
constexpr uint32_t kE2KeyPosInf = 0xff800000u;  // key of +inf

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
    int32_t chunks;          // chunks of kChunk positions per CTA (segment = chunks * kChunk positions)
    int32_t smem_chunks;     // chunks 1..smem_chunks live in chunk_smem (<= chunks - 1)
    uint32_t* chunk_smem;    // [smem_chunks][kChunk] raw fp32 bits, thread-owned layout (may be null)
    int32_t n_cta;           // CTAs sharing the row (cluster size; 1 without a cluster)
    int32_t rank;            // this CTA's segment (cluster rank; 0 without a cluster)
};

// What load_meta() reads from seq_lens / block_table (before griddepcontrol.wait by default).
// (The block-table entry of each thread's chunk-0 page goes to shared memory, Smem::page0, so it
// does not hold a register through the whole row.)
struct E2Meta {
    int32_t L;          // clamped live length
    int32_t take[2];    // L <= topk: slots of output entries j0, j0 + n_cta*kThreads (or -1)
};

// kRolledStores: the general path's store loop iterates over set bits instead of unrolling over kItems (the
// same stores in the same order). The megakernel takes it: its code runs cold, so size is time (9.1 K vs 10.2 K
// SASS instructions at kItems 8). The standalone kernels keep the unrolled loop: rolled, their 64-register builds
// (two CTAs per SM) spill 6-8 bytes.
template <int kThreads, int kItems, bool kCluster = false, int kBarrierId = 0, bool kRolledStores = false>
struct E2TopkTile {
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kChunk = kThreads * kItems;
    static constexpr int kPage = 64;        // index-K / KV page (tokens)
    static constexpr int kBins = 2048;      // value pass and radix passes (11-bit digits)
    static constexpr int kBinsPerThread = kBins / kThreads;
    static constexpr int kMaxCand = 64;     // a bin with at most this many keys is ranked by warp 0
    static constexpr uint32_t kBin0 = 0x4b000000u;  // bits of 2^23: value-bin floats are 2^23 + bin
    static_assert(kThreads % 32 == 0 && kThreads >= 64 && kThreads <= 1024, "whole warps, 64..1024 threads");
    static_assert(kItems == 4 || kItems == 8 || kItems == 16 || kItems == 32, "items per thread: 4..32 (16-byte loads)");
    static_assert(kBins % kThreads == 0 && kBinsPerThread % 2 == 0, "an even number of bins per thread");
    static_assert(kChunk < 65536, "the compaction scan packs two 16-bit per-chunk counts");
    static_assert(kPage % kItems == 0, "a thread's items lie in one page");
    static_assert(kMaxCand == 64, "warp 0 holds two candidates per lane");

    // Static shared memory (the caller provides it), ~17.5 KB.
    struct alignas(16) Smem {
        int hist[2][kBins];          // double-buffered: pass p uses hist[p & 1]
        int wtot[2][32];             // block-scan scratch (alternating)
        uint32_t rmin[32], rmax[32]; // per-warp range of the live values, as keys (step 1)
        uint32_t cmin[32], cmax[32]; // per-warp range of the bin's keys (radix path)
        uint32_t cand[kMaxCand];     // candidate keys in position order (this CTA's)
        int selpre[kMaxCand + 1];    // #selected candidates among the first i (whole row)
        uint32_t selm[2];            // selected-candidate bit masks (candidates 0..31, 32..63)
        int ctot[2];                 // this CTA's (#G, #C) (cluster compaction)
        int res[4];                  // bin search result broadcast
        int ncand;                   // single-chunk path: entries appended to clist
        uint2 clist[kMaxCand];       // single-chunk path: candidate (key, position in the chunk), any order
        uint32_t page0[kThreads];    // low 32 bits of the block-table entry of each thread's chunk-0 page
    };
    // The single-chunk path stages the row's output (topk <= kStage entries) in hist[1], which no
    // pass reads any more by then, and writes it out with coalesced 16-byte stores.
    static constexpr int kStage = kBins;

    // ---- small helpers ------------------------------------------------------------------------

    static GLM5_DEVICE void bar() { ptx::named_barrier_sync<kBarrierId, kThreads>(); }

    // Barrier over every thread that shares the row (CTA, or the whole cluster with release/acquire
    // of shared memory, so peers' shared writes before it are visible to DSMEM reads after it).
    static GLM5_DEVICE void row_sync() {
        if constexpr (kCluster) {
            ptx::cluster_arrive_release();
            ptx::cluster_wait_acquire();
        } else {
            bar();
        }
    }

    // 32-bit shared variable of CTA `r` (this CTA without a cluster).
    static GLM5_DEVICE uint32_t peek(const void* p, int r) {
        if constexpr (kCluster) {
            return ptx::ld_shared_cluster_u32(ptx::mapa_shared(ptx::smem_addr(p), static_cast<uint32_t>(r)));
        } else {
            return *static_cast<const volatile uint32_t*>(p);
        }
    }
    static GLM5_DEVICE void peek2(const void* p, int r, uint32_t& a, uint32_t& b) {
        if constexpr (kCluster) {
            ptx::ld_shared_cluster_v2_u32(ptx::mapa_shared(ptx::smem_addr(p), static_cast<uint32_t>(r)), a, b);
        } else {
            const uint2 v = *static_cast<const uint2*>(p);
            a = v.x;
            b = v.y;
        }
    }

    // Order-preserving key of an fp32 bit pattern; -0.0 -> +0.0, NaN -> 0 (lowest).
    static GLM5_DEVICE uint32_t to_key(uint32_t b) {
        b = (b == 0x80000000u) ? 0u : b;
        const uint32_t k = b ^ (static_cast<uint32_t>(static_cast<int32_t>(b) >> 31) | 0x80000000u);
        return ((b & 0x7fffffffu) > 0x7f800000u) ? 0u : k;
    }
    static GLM5_DEVICE float from_key(uint32_t k) {
        return __uint_as_float((k & 0x80000000u) ? (k ^ 0x80000000u) : ~k);
    }

    // The value bin as the bits of the float 2^23 + bin (see the header). Explicit _rn intrinsics:
    // each step separately rounded, never re-associated or contracted differently. 3 instructions:
    // no upper clamp is needed because scale = RN((kBins - 1) / range) and v - vlo <= range, so
    // (v - vlo) * scale <= (kBins - 1) * (1 + 2^-24) and the sum rounds to at most 2^23 + kBins - 1;
    // fmaxf maps NaN (a NaN value, or inf * 0 when the range is infinite) to bin 0.
    struct VBin {
        float vlo, scale;
        GLM5_DEVICE uint32_t fbits(uint32_t raw) const {
            const float t = __fmaf_rn(__fsub_rn(__uint_as_float(raw), vlo), scale, 8388608.0f);
            return __float_as_uint(fmaxf(t, 8388608.0f));
        }
        GLM5_DEVICE int bin(uint32_t raw) const { return static_cast<int>(fbits(raw) - kBin0); }
    };

    static GLM5_DEVICE int64_t page_entry(const E2RowArgs& a, int64_t logical_page) {
        return a.bt_64 ? static_cast<const int64_t*>(a.bt)[logical_page]
                       : static_cast<int64_t>(static_cast<const int32_t*>(a.bt)[logical_page]);
    }
    // slot = int32(page * 64 + pos % 64): the int32 result depends only on the low 32 bits of the
    // 64-bit product, so 32-bit arithmetic on the entry's low 32 bits gives the same bits.
    static GLM5_DEVICE int32_t slot(uint32_t page, int64_t pos) {
        return static_cast<int32_t>(page * static_cast<uint32_t>(kPage) + static_cast<uint32_t>(pos & (kPage - 1)));
    }
    static GLM5_DEVICE uint32_t page_lo(const E2RowArgs& a, int64_t logical_page) {
        return static_cast<uint32_t>(page_entry(a, logical_page));
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

    static GLM5_DEVICE int n_live_of(int64_t base, int32_t L) {
        const int64_t n = static_cast<int64_t>(L) - base;
        return n <= 0 ? 0 : (n >= kItems ? kItems : static_cast<int>(n));
    }

    // Raw bits of the n live positions [base, base + n) (n <= kItems); the rest read as 0.
    static GLM5_DEVICE void load_bits(const float* row, int64_t base, int n, bool vec_ok, uint32_t (&v)[kItems]) {
        if (vec_ok && n == kItems) {
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
            for (int j = 0; j < kItems; ++j) v[j] = (j < n) ? __float_as_uint(row[base + j]) : 0u;
        }
    }

    // ---- the row's data, chunk by chunk ---------------------------------------------------------

    struct Row {
        const E2RowArgs& a;
        int32_t L;
        int64_t seg0;        // first position of this CTA's segment
        int n_chunks;        // chunks of this segment holding live positions (uniform)
        bool vec_ok;
        int tid;
        const uint32_t (&r0)[kItems];  // chunk 0 raw bits (registers)

        GLM5_DEVICE int64_t base(int c) const {
            return seg0 + static_cast<int64_t>(c) * kChunk + static_cast<int64_t>(tid) * kItems;
        }
        // Raw bits of chunk c >= 1.
        GLM5_DEVICE void get(int c, uint32_t (&r)[kItems]) const {
            if (c <= a.smem_chunks) {
                const uint4* p = reinterpret_cast<const uint4*>(a.chunk_smem + static_cast<int64_t>(c - 1) * kChunk);
#pragma unroll
                for (int q = 0; q < kItems / 4; ++q) {
                    const uint4 x = p[q * kThreads + tid];
                    r[4 * q] = x.x;
                    r[4 * q + 1] = x.y;
                    r[4 * q + 2] = x.z;
                    r[4 * q + 3] = x.w;
                }
            } else {
                load_bits(a.logits, base(c), n_live_of(base(c), L), vec_ok, r);
            }
        }
        // f(c, raw, n_live) for every chunk with live positions, in position order. The chunk
        // count is uniform over the CTA, so f may contain barriers.
        template <class F>
        GLM5_DEVICE void each(F&& f) const {
            if (n_chunks > 0) f(0, r0, n_live_of(base(0), L));
            for (int c = 1; c < n_chunks; ++c) {
                uint32_t r[kItems];
                get(c, r);
                f(c, r, n_live_of(base(c), L));
            }
        }
    };

    // ---- phases -----------------------------------------------------------------------------

    // Zero both histograms and the cluster totals. Call before run() (the first barrier in run()
    // orders it before any atomic). A megakernel running another row must put a barrier after
    // the previous run() and call prologue() again.
    static GLM5_DEVICE void prologue(Smem& s, int tid) {
        uint4* h = reinterpret_cast<uint4*>(&s.hist[0][0]);  // 16-byte aligned (first member)
        for (int i = tid; i < 2 * kBins / 4; i += kThreads) h[i] = make_uint4(0u, 0u, 0u, 0u);
        if (tid == 0) {
            s.ctot[0] = s.ctot[1] = 0;
            s.ncand = 0;
        }
    }

    // seq_len -> L; page entries this thread needs first. Reads only seq_lens and block_table, so
    // it may run before griddepcontrol.wait when no still-running kernel writes them.
    static GLM5_DEVICE E2Meta load_meta(const E2RowArgs& a, Smem& s, int tid) {
        E2Meta m;
        // The chunk-0 page entry is read whenever it lies inside the block-table row, NOT only when
        // it is live, so that its load does not wait for seq_len's (two independent loads in flight
        // instead of a dependent pair); an entry of an unused page is read but never used.
        const int64_t b0 = static_cast<int64_t>(a.rank) * a.chunks * kChunk + static_cast<int64_t>(tid) * kItems;
        const uint32_t p0 = b0 / kPage < a.bt_cols ? page_lo(a, b0 / kPage) : 0u;
        const int64_t seq = a.seq_len_64 ? *static_cast<const int64_t*>(a.seq_len)
                                         : static_cast<int64_t>(*static_cast<const int32_t*>(a.seq_len));
        const int64_t cap = static_cast<int64_t>(a.bt_cols) * kPage;
        const int64_t lim = cap < a.width ? cap : static_cast<int64_t>(a.width);
        m.L = static_cast<int32_t>(seq < 0 ? 0 : (seq > lim ? lim : seq));
        m.take[0] = m.take[1] = -1;
        if (m.L <= a.topk) {
#pragma unroll
            for (int i = 0; i < 2; ++i) {
                const int64_t j = static_cast<int64_t>(a.rank) * kThreads + tid + static_cast<int64_t>(i) * a.n_cta * kThreads;
                if (j < m.L) m.take[i] = slot(page_lo(a, j / kPage), j);
            }
        } else {
            s.page0[tid] = p0;  // read back by this thread only
        }
        return m;
    }

    // L <= topk: out[j] = slot(j) for j < L, -1 after; the CTAs of a cluster split the entries.
    static GLM5_DEVICE void take_all(const E2RowArgs& a, const E2Meta& m, int tid) {
        const int64_t step = static_cast<int64_t>(a.n_cta) * kThreads;
        int64_t j = static_cast<int64_t>(a.rank) * kThreads + tid;
        for (int i = 0; i < 2 && j < a.topk; ++i, j += step) a.out[j] = m.take[i];
        for (; j < a.topk; j += step) a.out[j] = (j < m.L) ? slot(page_lo(a, j / kPage), j) : -1;
    }

    // Histogram search: the bin holding the k_rem-th largest counted key, bins scanned from the
    // top. Every CTA of a cluster sums all CTAs' histograms and finds the same bin.
    // Returns {bin, above (count in higher bins), count in the bin}.
    static GLM5_DEVICE int3 search(const E2RowArgs& a, Smem& s, const int* hist, int* wtot, int k_rem, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        constexpr int B = kBinsPerThread;
        const int top = kBins - 1 - tid * B;  // this thread's bins: top, top-1, ..., top-B+1
        int h[B];
#pragma unroll
        for (int j = 0; j < B; ++j) h[j] = 0;
        for (int r = 0; r < (kCluster ? a.n_cta : 1); ++r) {
#pragma unroll
            for (int j = 0; j < B; j += 2) {
                uint32_t lo, hi;  // bins top-j-1 (lower address) and top-j
                peek2(&hist[top - j - 1], r, lo, hi);
                h[j] += static_cast<int>(hi);
                h[j + 1] += static_cast<int>(lo);
            }
        }
        int v = 0;
#pragma unroll
        for (int j = 0; j < B; ++j) v += h[j];
        const int incl = warp_incl_scan(v, lane);
        if (lane == 31) wtot[warp] = incl;
        bar();
        const int wt = lane < kWarps ? wtot[lane] : 0;
        const int wincl = warp_incl_scan(wt, lane);
        const int before = __shfl_sync(0xffffffffu, wincl, warp > 0 ? warp - 1 : 0);
        const int excl = (warp > 0 ? before : 0) + incl - v;
        if (excl < k_rem && k_rem <= excl + v) {  // exactly one thread
            int acc = excl;
            bool found = false;
#pragma unroll
            for (int j = 0; j < B; ++j) {
                if (!found && acc + h[j] >= k_rem) {
                    s.res[0] = top - j;
                    s.res[1] = acc;
                    s.res[2] = h[j];
                    found = true;
                }
                acc += h[j];
            }
        }
        bar();
        return make_int3(s.res[0], s.res[1], s.res[2]);
    }

    // Histogram of digit(raw) over the live positions with pred(raw); digit in [0, kBins).
    // Consecutive equal digits of a thread are merged into one atomic.
    template <class Pred, class Digit>
    static GLM5_DEVICE void histogram(const Row& row, int* hist, Pred pred, Digit digit) {
        row.each([&](int, const uint32_t (&r)[kItems], int n) {
            int d[kItems];
#pragma unroll
            for (int j = 0; j < kItems; ++j) d[j] = (j < n && pred(r[j])) ? digit(r[j]) : -1;
            int run = 0;
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                run += d[j] >= 0 ? 1 : 0;
                const bool last = (j == kItems - 1) || d[j + (j < kItems - 1 ? 1 : 0)] != d[j];
                if (last && d[j] >= 0) atomicAdd(&hist[d[j]], run);
                if (last) run = 0;
            }
        });
    }

    // The value pass: every live position, digit = value bin. Full threads (all kItems live, the
    // common case) take a predicate-free path; the atomic address comes straight from the bin
    // float's bits.
    static GLM5_DEVICE void red_add(uint32_t smem_addr, uint32_t v) {
        asm volatile("red.shared.add.u32 [%0], %1;" ::"r"(smem_addr), "r"(v) : "memory");
    }
    // Histogram of the bin floats f[0..n) of one chunk: one red.shared per position, no branch when
    // the chunk is full. (Merging runs of equal bins inside a thread cost a compare and a divergent
    // branch per position and almost never merged anything on E1-like rows.) The address comes
    // straight from the bin float's bits: hist_base(hist) + 4 * bits.
    static GLM5_DEVICE uint32_t hist_base(const int* hist) { return ptx::smem_addr(hist) - kBin0 * 4u; }
    static GLM5_DEVICE void histogram_bins(uint32_t base_addr, const uint32_t (&f)[kItems], int n) {
        if (n == kItems) {
#pragma unroll
            for (int j = 0; j < kItems; ++j) red_add(base_addr + f[j] * 4u, 1u);
        } else {
#pragma unroll
            for (int j = 0; j < kItems; ++j)
                if (j < n) red_add(base_addr + f[j] * 4u, 1u);
        }
    }

    // The value pass over every chunk of the row (general path).
    static GLM5_DEVICE void value_histogram(const Row& row, int* hist, const VBin& vb) {
        const uint32_t base_addr = hist_base(hist);
        row.each([&](int, const uint32_t (&r)[kItems], int n) {
            uint32_t f[kItems];
#pragma unroll
            for (int j = 0; j < kItems; ++j) f[j] = vb.fbits(r[j]);
            histogram_bins(base_addr, f, n);
        });
    }

    // Min / max key over the live positions with pred(raw) of the whole row: per-warp slots, one
    // row_sync, every warp reduces all slots (of every CTA). No such position: lo > hi.
    template <class Pred>
    static GLM5_DEVICE void key_range(const E2RowArgs& a, const Row& row, uint32_t* smin, uint32_t* smax, Pred pred,
                                      uint32_t& lo, uint32_t& hi, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        uint32_t mn = 0xffffffffu, mx = 0u;
        row.each([&](int, const uint32_t (&r)[kItems], int n) {
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                if (j < n && pred(r[j])) {
                    const uint32_t k = to_key(r[j]);
                    mn = min(mn, k);
                    mx = max(mx, k);
                }
            }
        });
        reduce_range(a, smin, smax, mn, mx, lane, warp);
        lo = mn;
        hi = mx;
    }

    // Per-thread (mn, mx) keys -> the row's, in every thread (one row_sync).
    static GLM5_DEVICE void reduce_range(const E2RowArgs& a, uint32_t* smin, uint32_t* smax, uint32_t& mn,
                                         uint32_t& mx, int lane, int warp) {
        mn = __reduce_min_sync(0xffffffffu, mn);
        mx = __reduce_max_sync(0xffffffffu, mx);
        if (lane == 0) {
            smin[warp] = mn;
            smax[warp] = mx;
        }
        row_sync();
        mn = 0xffffffffu;
        mx = 0u;
        if (lane < kWarps) {
            for (int r = 0; r < (kCluster ? a.n_cta : 1); ++r) {
                mn = min(mn, peek(&smin[lane], r));
                mx = max(mx, peek(&smax[lane], r));
            }
        }
        mn = __reduce_min_sync(0xffffffffu, mn);
        mx = __reduce_max_sync(0xffffffffu, mx);
    }

    // lo[0] = min(lo[0 .. 2W)), hi[0] = max(hi[0 .. 2W)), pairwise (compile-time indices only).
    template <int W>
    static GLM5_DEVICE void minmax_tree(float (&lo)[kItems / 2], float (&hi)[kItems / 2]) {
        if constexpr (W >= 1) {
#pragma unroll
            for (int j = 0; j < W; ++j) {
                lo[j] = fminf(lo[j], lo[j + W]);
                hi[j] = fmaxf(hi[j], hi[j + W]);
            }
            minmax_tree<W / 2>(lo, hi);
        }
    }

    // Step 1: range of the live values (fminf / fmaxf skip NaN; +-inf count) -> the value bins.
    static GLM5_DEVICE VBin value_range(const E2RowArgs& a, const Row& row, Smem& s, int tid) {
        float mn = __uint_as_float(0x7f800000u), mx = __uint_as_float(0xff800000u);
        row.each([&](int, const uint32_t (&r)[kItems], int n) {
            if (n == kItems) {  // a tree (depth log2 kItems), not a chain of kItems dependent min/max
                float lo[kItems / 2], hi[kItems / 2];
#pragma unroll
                for (int j = 0; j < kItems / 2; ++j) {
                    lo[j] = fminf(__uint_as_float(r[j]), __uint_as_float(r[j + kItems / 2]));
                    hi[j] = fmaxf(__uint_as_float(r[j]), __uint_as_float(r[j + kItems / 2]));
                }
                minmax_tree<kItems / 4>(lo, hi);
                mn = fminf(mn, lo[0]);
                mx = fmaxf(mx, hi[0]);
            } else {
#pragma unroll
                for (int j = 0; j < kItems; ++j) {
                    if (j < n) {
                        mn = fminf(mn, __uint_as_float(r[j]));
                        mx = fmaxf(mx, __uint_as_float(r[j]));
                    }
                }
            }
        });
        uint32_t kmn = to_key(__float_as_uint(mn)), kmx = to_key(__float_as_uint(mx));
        reduce_range(a, s.rmin, s.rmax, kmn, kmx, tid & 31, tid >> 5);
        VBin vb{0.0f, 0.0f};
        if (kmn <= kmx) {  // else no non-NaN value: one bin
            vb.vlo = from_key(kmn);
            const float range = __fsub_rn(from_key(kmx), vb.vlo);
            vb.scale = range > 0.0f ? __fdiv_rn(static_cast<float>(kBins - 1), range) : 0.0f;  // inf range -> 0
            if (!(vb.scale <= 3.0e38f)) vb.scale = 0.0f;  // a subnormal range (scale inf): one bin
        }
        return vb;
    }

    // Classification of a position for the compaction: G (taken) and C (candidate).
    enum Mode : int { kByBin = 0, kByKey = 1 };
    struct Rule {
        int mode;          // kByBin: G = bin > gb (or >= when no candidates), C = bin == gb
        VBin vb;
        uint32_t gbin_f;   // bin float bits: G = fbits > gbin_f; C = fbits == cbin_f
        uint32_t cbin_f;
        uint32_t klo, khi; // kByKey: G = key > khi, C = klo <= key <= khi
        bool rank;         // C resolved by warp 0's rank (<= kMaxCand), else the first `need` C
        int need;
    };

    template <int kMode>
    static GLM5_DEVICE void classify(const Rule& rule, const uint32_t (&r)[kItems], int n, uint32_t& g, uint32_t& c) {
        g = 0u;
        c = 0u;
#pragma unroll
        for (int j = 0; j < kItems; ++j) {
            bool gj, cj;
            if constexpr (kMode == kByBin) {
                const uint32_t f = rule.vb.fbits(r[j]);
                gj = f > rule.gbin_f;
                cj = f == rule.cbin_f;
            } else {
                const uint32_t k = to_key(r[j]);
                gj = k > rule.khi;
                cj = k >= rule.klo && k <= rule.khi;
            }
            const bool live = j < n;
            g |= static_cast<uint32_t>(live && gj) << j;
            c |= static_cast<uint32_t>(live && cj) << j;
        }
    }

    // Step 3: classification, candidates, compaction (see the header).
    template <int kMode>
    static GLM5_DEVICE void compact(const E2RowArgs& a, const Row& row, const Rule& rule, int k_rem, Smem& s, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        // sweep A: scans per chunk (chunk 0's kept), candidate list, this CTA's totals
        uint32_t g0 = 0u, c0 = 0u;
        int off0 = 0, tot0 = 0;
        int g_cta = 0, c_cta = 0;
        int wb = 0;
        row.each([&](int c, const uint32_t (&r)[kItems], int n) {
            uint32_t g, cm;
            classify<kMode>(rule, r, n, g, cm);
            int total;
            const int off = block_excl_scan(__popc(g) | (__popc(cm) << 16), s.wtot[wb], &total, tid);
            wb ^= 1;
            if (rule.rank && cm != 0u) {
                int i = c_cta + (off >> 16);
#pragma unroll
                for (int j = 0; j < kItems; ++j)
                    if ((cm >> j) & 1u) s.cand[i++] = to_key(r[j]);
            }
            if (c == 0) {
                g0 = g;
                c0 = cm;
                off0 = off;
                tot0 = total;
            }
            g_cta += total & 0xffff;
            c_cta += total >> 16;
        });
        int g_base = 0, c_base = 0;  // #G / #C in the CTAs before this one
        if constexpr (kCluster) {
            if (tid == 0) {
                s.ctot[0] = g_cta;
                s.ctot[1] = c_cta;
            }
            row_sync();
            for (int r = 0; r < a.rank; ++r) {
                g_base += static_cast<int>(peek(&s.ctot[0], r));
                c_base += static_cast<int>(peek(&s.ctot[1], r));
            }
        } else {
            if (rule.rank) bar();  // the candidate list is complete
        }
        if (rule.rank) {
            if (warp == 0) {
                // the row's candidates in position order: CTA r's list follows the lists of CTAs < r
                uint32_t x[2] = {0u, 0u};
                int cnt = 0;
                for (int r = 0; r < (kCluster ? a.n_cta : 1); ++r) {
                    const int nr = kCluster ? static_cast<int>(peek(&s.ctot[1], r)) : c_cta;
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        const int i = lane + 32 * h;
                        if (i >= cnt && i < cnt + nr) x[h] = peek(&s.cand[i - cnt], r);
                    }
                    cnt += nr;
                }
                // candidate i is taken iff #larger + #equal at lower positions < k_rem
                int before[2] = {0, 0};
                for (int j = 0; j < cnt; ++j) {  // uniform trip count
                    const uint32_t kj = __shfl_sync(0xffffffffu, j < 32 ? x[0] : x[1], j & 31);
#pragma unroll
                    for (int h = 0; h < 2; ++h)
                        before[h] += (kj > x[h] || (kj == x[h] && j < lane + 32 * h)) ? 1 : 0;
                }
                const uint32_t m0 = __ballot_sync(0xffffffffu, lane < cnt && before[0] < k_rem);
                const uint32_t m1 = __ballot_sync(0xffffffffu, lane + 32 < cnt && before[1] < k_rem);
                const uint32_t lt = (1u << lane) - 1u;
                s.selpre[lane] = __popc(m0 & lt);
                s.selpre[lane + 32] = __popc(m0) + __popc(m1 & lt);
                if (lane == 0) {
                    s.selpre[64] = __popc(m0) + __popc(m1);
                    s.selm[0] = m0;
                    s.selm[1] = m1;
                }
            }
            bar();
        }
        // sweep B: write the selected slots in position order
        const int need = rule.need;
        int gb = g_base, cb = c_base;  // #G / #C before the current chunk (whole row)
        row.each([&](int c, const uint32_t (&r)[kItems], int n) {
            const int64_t base = row.base(c);
            uint32_t g = g0, cm = c0;
            int off = off0, total = tot0;
            uint32_t page = s.page0[tid];
            if (c > 0) {
                classify<kMode>(rule, r, n, g, cm);
                if ((g | cm) != 0u) page = page_lo(a, base / kPage);  // latency hidden by the scan
                off = block_excl_scan(__popc(g) | (__popc(cm) << 16), s.wtot[wb], &total, tid);
                wb ^= 1;
            }
            if ((g | cm) != 0u) {
                int go = gb + (off & 0xffff);
                int co = cb + (off >> 16);
                const int32_t s0 = slot(page, base);  // the thread's items are one page: slot(base + j) = s0 + j
                if constexpr (kRolledStores) {
                    // The G / C positions in ascending order (G and C are disjoint), one iteration each.
                    uint32_t sel = g | cm;
#pragma unroll 1
                    while (sel != 0u) {
                        const int j = __ffs(sel) - 1;
                        sel &= sel - 1u;
                        if ((g >> j) & 1u) {
                            const int sel_before = rule.rank ? s.selpre[co] : min(co, need);
                            a.out[go + sel_before] = s0 + j;
                            ++go;
                        } else {
                            const bool take = rule.rank ? ((s.selm[co >> 5] >> (co & 31)) & 1u) != 0u : co < need;
                            if (take) a.out[go + (rule.rank ? s.selpre[co] : co)] = s0 + j;
                            ++co;
                        }
                    }
                } else {
#pragma unroll
                    for (int j = 0; j < kItems; ++j) {
                        if ((g >> j) & 1u) {
                            const int sel_before = rule.rank ? s.selpre[co] : min(co, need);
                            a.out[go + sel_before] = s0 + j;
                            ++go;
                        }
                        if ((cm >> j) & 1u) {
                            const bool take = rule.rank ? ((s.selm[co >> 5] >> (co & 31)) & 1u) != 0u : co < need;
                            if (take) a.out[go + (rule.rank ? s.selpre[co] : co)] = s0 + j;
                            ++co;
                        }
                    }
                }
            }
            gb += total & 0xffff;
            cb += total >> 16;
        });
    }

    // After the value pass (histogram complete, row_sync passed): the bin search, then the rule that
    // classifies every position (the bin taken whole / its <= kMaxCand keys ranked / exact radix
    // passes over its key interval, see the header). k_rem: in = topk, out = what the C positions
    // must still supply.
    static GLM5_DEVICE Rule resolve_rule(const E2RowArgs& a, const Row& row, const VBin& vb, Smem& s, int& k_rem,
                                         int tid) {
        const int3 r = search(a, s, s.hist[0], s.wtot[0], k_rem, tid);
        k_rem -= r.y;
        return needs_radix(r.z, k_rem) ? radix_rule(a, row, vb, r.x, s, k_rem, tid) : bin_rule(vb, r.x, r.z, k_rem);
    }

    // The value bin b1 (holding cnt keys, k_rem of them still wanted) is taken whole, or its keys
    // are ranked; otherwise (needs_radix) radix passes split it.
    static GLM5_DEVICE bool needs_radix(int cnt, int k_rem) { return cnt != k_rem && cnt > kMaxCand; }
    static GLM5_DEVICE Rule bin_rule(const VBin& vb, int b1, int cnt, int k_rem) {
        Rule rule{kByBin, vb, kBin0 + static_cast<uint32_t>(b1) - 1u, 0u, 0u, 0u, false, 0};  // the bin taken whole
        if (cnt != k_rem) {  // the bin's <= kMaxCand keys are ranked
            rule.gbin_f = rule.cbin_f = kBin0 + static_cast<uint32_t>(b1);
            rule.rank = true;
        }
        return rule;
    }
    // Exact radix passes over the key interval of value bin b1 (needs_radix).
    static GLM5_DEVICE Rule radix_rule(const E2RowArgs& a, const Row& row, const VBin& vb, int b1, Smem& s, int& k_rem,
                                       int tid) {
        Rule rule{kByKey, vb, 0u, 0u, 0u, 0u, false, 0};
        const uint32_t fb1 = kBin0 + static_cast<uint32_t>(b1);
        uint32_t lo, hi;
        key_range(a, row, s.cmin, s.cmax, [vb, fb1](uint32_t x) { return vb.fbits(x) == fb1; }, lo, hi, tid);
        int pass = 1;
        while (true) {
            if (lo == hi) {  // one key Kt: G = key > Kt, the first k_rem of its ties are taken
                rule.klo = rule.khi = lo;
                rule.need = k_rem;
                break;
            }
            const uint32_t span = hi - lo;
            const int shift = max(0, (32 - __clz(static_cast<int>(span))) - 11);
            const int hb = pass & 1;
            const uint32_t l0 = lo, h0 = hi;
            histogram(row, s.hist[hb],
                      [l0, h0](uint32_t x) {
                          const uint32_t kx = to_key(x);
                          return kx >= l0 && kx <= h0;
                      },
                      [l0, shift](uint32_t x) { return static_cast<int>((to_key(x) - l0) >> shift); });
            row_sync();
            // the other buffer was last read by the previous search (every CTA is past it)
            for (int i = tid; i < kBins; i += kThreads) s.hist[hb ^ 1][i] = 0;
            const int3 r = search(a, s, s.hist[hb], s.wtot[hb], k_rem, tid);
            k_rem -= r.y;
            const int cnt = r.z;
            const uint64_t nlo = static_cast<uint64_t>(lo) + (static_cast<uint64_t>(r.x) << shift);
            const uint64_t nhi = nlo + (1ull << shift) - 1ull;
            lo = static_cast<uint32_t>(nlo);
            hi = static_cast<uint32_t>(min(nhi, static_cast<uint64_t>(hi)));
            ++pass;
            if (cnt == k_rem) {  // the whole sub-interval is taken: G = key >= lo (lo > 0 here)
                rule.khi = lo - 1u;
                rule.klo = lo;  // > khi: no candidates
                break;
            }
            if (cnt <= kMaxCand && lo != hi) {  // G = key > hi, the interval's keys are ranked
                rule.klo = lo;
                rule.khi = hi;
                rule.rank = true;
                break;
            }
        }
        return rule;
    }

    // ---- the single-chunk path: one CTA, L <= kChunk, topk <= kStage (every decode row of GLM-5) ----
    //
    // Same selection as the general path (same range, bins, search and rule, so the same output), with
    // the per-position work cut to what the SM must issue (the time of this path is instruction issue
    // plus a chain of 6-7 barriers, not bytes):
    //   - the bin floats f[] are computed once and kept in registers (range 2 + bins 3 + histogram 2
    //     instructions per position, no branch);
    //   - one classification sweep builds bit masks G (taken) and C (candidates) per thread; rank
    //     candidates go to an unordered (key, position) list with one shared atomic per thread that has
    //     any (~10 of a row); one block scan of (#G | #C << 16), whose barrier also completes the list;
    //   - warp 0 ranks the <= 64 candidates (larger key, then lower position) and publishes the taken
    //     set as a 64-bit mask in POSITION order (bit i = the i-th candidate of the row by position,
    //     i.e. the candidate whose thread's C offset + index is i), so a thread's output offset is
    //     #G before it + popc(mask below its C offset): no per-position lookup;
    //   - the selected slots go to shared memory (position order) and leave in coalesced 16-byte stores
    //     instead of 2048 scattered 4-byte ones.
    // x[]: the bin floats (kByBin) or the raw bits (kByKey) of the thread's items. In kByBin mode the
    // raw values are no longer in registers (holding both would spill at 512 x 16): the few
    // candidates re-read theirs (the row was just read: L1).
    template <int kMode>
    static GLM5_DEVICE void compact_single(const E2RowArgs& a, const uint32_t (&x)[kItems], int n, const Rule& rule,
                                           int k_rem, Smem& s, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        const int k = a.topk;
        // classification: bit j of gm / cm = position tid * kItems + j is G / C
        uint32_t gm = 0u, cm = 0u;
        if constexpr (kMode == kByBin) {
            const uint32_t gt = rule.gbin_f, ct = rule.cbin_f;
            if (rule.rank) {  // C is ~10 positions of the row: test "any" per position, build the mask rarely
                bool anyc = false;
#pragma unroll
                for (int j = 0; j < kItems; ++j) {
                    gm |= static_cast<uint32_t>(x[j] > gt) << j;
                    anyc |= x[j] == ct;
                }
                if (anyc) {
#pragma unroll
                    for (int j = 0; j < kItems; ++j) cm |= static_cast<uint32_t>(x[j] == ct) << j;
                }
            } else {  // the bin taken whole: no candidates
#pragma unroll
                for (int j = 0; j < kItems; ++j) gm |= static_cast<uint32_t>(x[j] > gt) << j;
            }
        } else {
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                const uint32_t kx = to_key(x[j]);
                gm |= static_cast<uint32_t>(kx > rule.khi) << j;
                cm |= static_cast<uint32_t>(kx >= rule.klo && kx <= rule.khi) << j;
            }
        }
        if (n < kItems) {  // positions past L (n < kItems <= 32: the shift is defined)
            const uint32_t lm = (1u << n) - 1u;
            gm &= lm;
            cm &= lm;
        }
        const int pos0 = tid * kItems;  // position of item 0 in the chunk (the segment starts at 0 here)
        if (rule.rank && cm != 0u) {    // rare: ~10 positions of a row
            uint32_t raw[kItems];
#pragma unroll
            for (int j = 0; j < kItems; ++j) {  // kByBin: every re-read in flight at once
                if constexpr (kMode == kByBin) raw[j] = ((cm >> j) & 1u) ? __float_as_uint(a.logits[pos0 + j]) : 0u;
                else raw[j] = x[j];
            }
            int i = atomicAdd(&s.ncand, __popc(cm));
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                if ((cm >> j) & 1u) {
                    if (i < kMaxCand) s.clist[i] = make_uint2(to_key(raw[j]), static_cast<uint32_t>(pos0 + j));
                    ++i;
                }
            }
        }
        int total;
        const int off = block_excl_scan(__popc(gm) | (__popc(cm) << 16), s.wtot[0], &total, tid);  // + the list
        GLM5_E2_PHASE(5);  // classified, scanned

        uint64_t tmask = 0ull;  // rank: taken candidates, bit i = the i-th candidate by position
        if (rule.rank) {
            if (warp == 0) {
                const int nc = min(total >> 16, kMaxCand);
                uint32_t key[2];
                int pos[2], kr[2] = {0, 0}, pr[2] = {0, 0};
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    const int i = lane + 32 * h;
                    const uint2 e = i < nc ? s.clist[i] : make_uint2(0u, 0x7fffffffu);
                    key[h] = e.x;
                    pos[h] = static_cast<int>(e.y);
                }
#pragma unroll 4
                for (int j = 0; j < nc; ++j) {  // uniform trip count; e is a broadcast read
                    const uint2 e = s.clist[j];
                    const int pj = static_cast<int>(e.y);
#pragma unroll
                    for (int h = 0; h < 2; ++h) {
                        kr[h] += (e.x > key[h] || (e.x == key[h] && pj < pos[h])) ? 1 : 0;  // the rank rule
                        pr[h] += pj < pos[h] ? 1 : 0;
                    }
                }
                uint32_t mlo = 0u, mhi = 0u;
#pragma unroll
                for (int h = 0; h < 2; ++h) {
                    if (lane + 32 * h < nc && kr[h] < k_rem) {
                        if (pr[h] < 32) mlo |= 1u << pr[h];
                        else mhi |= 1u << (pr[h] - 32);
                    }
                }
                mlo = __reduce_or_sync(0xffffffffu, mlo);
                mhi = __reduce_or_sync(0xffffffffu, mhi);
                if (lane == 0) {
                    s.selm[0] = mlo;
                    s.selm[1] = mhi;
                }
            }
            bar();
            tmask = static_cast<uint64_t>(s.selm[0]) | (static_cast<uint64_t>(s.selm[1]) << 32);
        }
        GLM5_E2_PHASE(6);  // candidates ranked

        // output offset: #G before this thread + the candidates taken before it (position order)
        const int co = off >> 16;
        int o = off & 0xffff;
        if (rule.rank) o += __popcll(co >= 64 ? tmask : (tmask & ((1ull << co) - 1ull)));
        else o += min(co, rule.need);  // the first `need` C are taken (need = 0 when there is no C)
        int* p = s.hist[1] + o;        // the stage (kStage >= topk entries)
        const int32_t v0 = slot(s.page0[tid], static_cast<int64_t>(pos0));  // the thread's items are one page
        if (cm == 0u) {
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                if ((gm >> j) & 1u) *p++ = v0 + j;
            }
        } else {
            int ci = co;
#pragma unroll
            for (int j = 0; j < kItems; ++j) {
                if ((gm >> j) & 1u) {
                    *p++ = v0 + j;
                } else if ((cm >> j) & 1u) {
                    const bool take = rule.rank ? ((tmask >> (ci & 63)) & 1ull) != 0ull : ci < rule.need;
                    if (take) *p++ = v0 + j;
                    ++ci;
                }
            }
        }
        bar();
        GLM5_E2_PHASE(7);  // staged
        // the stage -> out, coalesced (16-byte stores when the output row is 16-byte aligned)
        const int* st = s.hist[1];
        int32_t* out = a.out;
        int i0 = 0;
        if ((reinterpret_cast<uintptr_t>(out) & 15u) == 0u) {
            const int n4 = k >> 2;
            for (int i = tid; i < n4; i += kThreads) {
                const uint4 v = reinterpret_cast<const uint4*>(st)[i];
                ptx::st_global_v4(out + 4 * i, ptx::u32x4{v.x, v.y, v.z, v.w});
            }
            i0 = 4 * n4;
        }
        for (int i = i0 + tid; i < k; i += kThreads) out[i] = st[i];
        GLM5_E2_PHASE(8);  // stores issued
    }

    static GLM5_DEVICE void run_single(const E2RowArgs& a, int32_t L, const uint32_t (&r)[kItems], bool vec_ok, Smem& s,
                                       int tid) {
        const int64_t base = static_cast<int64_t>(tid) * kItems;
        const int n = n_live_of(base, L);
        // 1. range -> value bins (one barrier)
        VBin vb;
        {
            const Row row{a, L, 0, 1, vec_ok, tid, r};
            vb = value_range(a, row, s, tid);
        }
        GLM5_E2_PHASE(2);  // the row has arrived, range known
        // 2. the bin floats, kept for the classification (the raw bits die here); the value pass
        uint32_t f[kItems];
#pragma unroll
        for (int j = 0; j < kItems; ++j) f[j] = vb.fbits(r[j]);
        histogram_bins(hist_base(s.hist[0]), f, n);
        bar();
        GLM5_E2_PHASE(3);  // histogram complete
        // 3. search and rule; 4. classification, compaction, output
        int k_rem = a.topk;
        const int3 sr = search(a, s, s.hist[0], s.wtot[0], k_rem, tid);
        k_rem -= sr.y;
        GLM5_E2_PHASE(4);  // threshold bin found
        if (!needs_radix(sr.z, k_rem)) {  // the common case: the bin taken whole or ranked
            compact_single<kByBin>(a, f, n, bin_rule(vb, sr.x, sr.z, k_rem), k_rem, s, tid);
        } else {  // rare: re-read the raw bits (L1) for the radix passes and a key classification
            uint32_t r2[kItems];
            load_bits(a.logits, base, n, vec_ok, r2);
            const Row row{a, L, 0, 1, vec_ok, tid, r2};
            const Rule rule = radix_rule(a, row, vb, sr.x, s, k_rem, tid);
            compact_single<kByKey>(a, r2, n, rule, k_rem, s, tid);
        }
    }

    // All kThreads threads of the tile (of every CTA of the cluster) call this with the same row,
    // after prologue() and load_meta() (and griddepcontrol.wait). tid in [0, kThreads).
    static GLM5_DEVICE void run(const E2RowArgs& a, const E2Meta& m, Smem& s, int tid) {
        const int32_t L = m.L;
        const int k = a.topk;
        if (L <= k) {  // every token is taken, -1 after them (uniform over the cluster)
            take_all(a, m, tid);
            return;
        }
        const int64_t seg0 = static_cast<int64_t>(a.rank) * a.chunks * kChunk;
        const int64_t seg_live = static_cast<int64_t>(L) - seg0;  // may be <= 0 for a trailing CTA
        const int n_chunks = seg_live <= 0 ? 0
                           : static_cast<int>(min(static_cast<int64_t>(a.chunks), (seg_live + kChunk - 1) / kChunk));
        const bool vec_ok = (reinterpret_cast<uintptr_t>(a.logits) & 15u) == 0;

        // Chunk 0 -> registers; chunks 1..smem_chunks -> shared memory (cp.async, all in flight at
        // once). Thread-owned slots: the thread that reads them waits for its own copies.
        uint32_t r0[kItems];
        const int64_t b0 = seg0 + static_cast<int64_t>(tid) * kItems;
        load_bits(a.logits, b0, n_chunks > 0 ? n_live_of(b0, L) : 0, vec_ok, r0);
        if constexpr (!kCluster) {
            if (n_chunks == 1 && k <= kStage) {  // uniform over the CTA
                run_single(a, L, r0, vec_ok, s, tid);
                return;
            }
        }
        const int n_smem = min(n_chunks - 1, a.smem_chunks);
        for (int c = 1; c <= n_smem; ++c) {
            uint32_t* p = a.chunk_smem + static_cast<int64_t>(c - 1) * kChunk;
            const int64_t b = seg0 + static_cast<int64_t>(c) * kChunk + static_cast<int64_t>(tid) * kItems;
            const int n = n_live_of(b, L);
#pragma unroll
            for (int q = 0; q < kItems / 4; ++q) {
                uint32_t* dst = p + (static_cast<int64_t>(q) * kThreads + tid) * 4;
                const int nq = n - 4 * q;
                if (vec_ok) {
                    ptx::cp_async_16(ptx::smem_addr(dst), nq > 0 ? a.logits + b + 4 * q : a.logits,
                                     static_cast<uint32_t>(nq <= 0 ? 0 : (nq >= 4 ? 16 : 4 * nq)));
                } else {
#pragma unroll
                    for (int e = 0; e < 4; ++e) {
                        if (e < nq) ptx::cp_async_ca_4(ptx::smem_addr(dst + e), a.logits + b + 4 * q + e);
                        else dst[e] = 0u;
                    }
                }
            }
        }
        if (n_smem > 0) ptx::cp_async_wait_all();
        const Row row{a, L, seg0, n_chunks, vec_ok, tid, r0};

        // 1. range -> value bins; 2. value pass (hist[0], zeroed by prologue)
        const VBin vb = value_range(a, row, s, tid);
        value_histogram(row, s.hist[0], vb);
        row_sync();
        int k_rem = k;
        const Rule rule = resolve_rule(a, row, vb, s, k_rem, tid);
        if (rule.mode == kByBin) compact<kByBin>(a, row, rule, k_rem, s, tid);
        else compact<kByKey>(a, row, rule, k_rem, s, tid);
        // Peers may still read this CTA's shared memory (histograms, candidates, totals): no CTA
        // of the cluster leaves before all are done.
        if constexpr (kCluster) row_sync();
    }
};

}  // namespace attn_pre
}  // namespace glm5
