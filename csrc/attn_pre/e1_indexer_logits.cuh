// E1: paged FP8 indexer logits, as role functions of one CTA (a producer warp + a consumer
// warpgroup) over a balanced share of the batch's pages.
//
// Framework-free (raw pointers, e4m3 as bytes), so the same roles run from the standalone launcher
// (e1_indexer_logits.cu: a grid of ~2 CTAs per SM) and, later, from a persistent megakernel.
//
// Math (glm5_fastpath.ref.prefix.e1_indexer_logits), for row m and column t < max_ctx:
//   t <  len(m): logits[m, t] = s_k[t] * sum_h w[m, h] * max(sum_d q8[m, h, d] * k8[t, d], 0)
//   t >= len(m): logits[m, t] = -inf
// len(m) = seq_lens[m] clamped to [0, min(max_ctx, 64 * bt_width)]; logical token t of row m is row
// t % 64 of physical page block_table[m, t / 64]. A cache page (kPageBytes = 64 * (kDim + 4)) is
// [64 tokens x kDim e4m3][64 x fp32 s_k]. A live page whose block-table entry lies outside
// [0, num_pages) is never read: its live tokens' logits are NaN.
//
// Work split. The batch's live pages (sum over rows of ceil(len / 64)) are cut into num_ctas
// contiguous, equal shares (+-1 page) in row-major order, and so are the "dead" pages (64-column
// blocks past a row's live pages, written -inf); plan() computes the CTA's shares from seq_lens
// with two block scans, so rows of any lengths keep every SM equally busy.
//
// Data movement. The producer warp reads the block table 32 entries at a time and streams whole
// pages global -> shared with the bulk copy engine (cp.async.bulk, one instruction per page, L2
// evict-first: each page is read once) into a ring of kStages pages, each completing on its "full"
// mbarrier; the page's row, first column, len and page id go to a small per-stage record. Before
// griddepcontrol.wait (meta_before_wait) it also L2-prefetches the CTA's first kPrefetchPages
// pages (a hint: L2 is the point of coherence, so a prefetch while the producer kernel still
// writes the cache cannot make a later read stale). Once its last page is issued it triggers the
// dependent launch: the next kernel's CTAs then start (and prefetch) while our ring drains, not
// while we still have most of our bytes to stream.
//
// Compute (consumer warpgroup, 128 threads). One page = one wgmma tile: the 64 tokens are M, the
// heads (padded with zeros to kN, a multiple of 8) are N, the head dim is K. A (the page) comes
// from registers: each thread loads its 2 rows (16w + g, 16w + g + 8) x kDim / 4 bytes with 16-byte
// shared loads, converts e4m3 -> f16 exactly, and releases the stage at once (its "empty"
// mbarrier) -- the MMA no longer needs it. B (q of the page's row) sits in shared memory as f16 in
// the 128-byte-swizzle K-major layout, converted once per row. kDim / 16 wgmma m64nNk16 with fp32
// accumulators; the loads of page i+1 run while the MMAs of page i are in flight.
//
// K permutation. A dot product does not depend on the order of its terms as long as A and B use
// the same order. Thread t = lane % 4 holds bytes [t * kDim/4, (t+1) * kDim/4) of each of its rows:
// byte pairs p = 0 .. kDim/8 - 1 of that range; MMA step s takes pair 2s as its k = {2t, 2t+1}
// slot and pair 2s+1 as its k = {2t+8, 2t+9} slot (the wgmma register layout). So logical pair
// kp = 8s + 4h + t of the K dimension is physical pair t * kDim/8 + 2s + h (h = 0, 1), a bijection;
// q is stored in B with the same map (store_q), so every A operand load is one aligned 16-byte
// vector and the physical order never matters. With kDim = 128 a thread's 32 bytes are two
// chunks; odd g loads them in swapped order (and swaps back with selects) so that the 8 threads
// of each quarter-warp hit 8 distinct 16-byte bank groups.
//
// Epilogue per page: lane (g, t) holds D[token 16w+g (+8)][head 8j + 2t + b]; it applies ReLU
// (NaN-propagating, like torch.clamp_min), the fp32 head weights (an FMA chain), reduces over the
// 4 lanes of the quad (xor 1, 2) and lanes t = 0 / 1 write s_k * sum for tokens g / g + 8: each
// warp stores 16 consecutive floats. Every logit's arithmetic is fixed by the token alone, so the
// output is bitwise independent of the split, the grid and PDL.
//
// PDL split (the launcher's business): plan() and producer_prefetch() read only seq_lens, the
// block table and (as an L2 hint) the cache; producer_run() / consumer_run() read q, head_w and
// the cache, the preceding kernels' outputs, and write the logits, so they come after
// griddep_wait().
//
// Shared memory (kSmemBytes, ~68 KB for GLM-5): q as f16 (kN x kDim x 2, 1024-aligned), the ring,
// the stage records, 2 x kStages mbarriers, the plan and the scan scratch. 160 threads, <= 136
// registers: 3 CTAs fit an SM, two of this grid and one of the next kernel under PDL.
#pragma once

#include "../common/arch.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/mma_f16.cuh"
#include "../common/pdl.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/sm90_tma.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/vec_io.cuh"
#include "e1_sm90_detail.cuh"

namespace glm5 {
namespace attn_pre {

// The whole launch's inputs (pointers not yet offset to a row).
struct E1Problem {
    const uint8_t* q;            // [m, kHeads, kDim] e4m3 (16-byte aligned)
    const float* head_w;         // [m, kHeads] fp32
    const uint8_t* cache;        // [num_pages, kPageBytes] index-K cache (16-byte aligned)
    const int32_t* seq_lens;     // [m]
    const int32_t* block_table;  // [m, bt_width], row stride bt_stride
    float* logits;               // [m, max_ctx]
    int64_t num_pages;           // pages in the cache: ids outside [0, num_pages) are never read
    int64_t bt_stride;
    int32_t m;
    int32_t bt_width;
    int32_t max_ctx;  // m * ceil(max_ctx / 64) < 2^31 (the launcher checks)
};

// One CTA's shares, in shared memory: live pages from (live_row, live_pg) on, n_live of them in
// row-major order over rows' live pages; dead pages likewise (a row's dead pages are its page
// slots [ceil(len / 64), ceil(max_ctx / 64))).
struct E1Plan {
    int32_t live_row, live_pg, n_live;
    int32_t dead_row, dead_pg, n_dead;
    int32_t pad[2];
};

// What the producer tells the consumer about the page in a stage (written before its arrive).
struct alignas(16) E1StageInfo {
    int32_t pid;   // physical page, -1 when the block-table entry is out of range (nothing copied)
    int32_t row;   // batch row
    int32_t col0;  // first output column (page index in the row * 64)
    int32_t len;   // the row's clamped length
};

template <int kHeads, int kDim, int kStages, int kPrefetchPages>
struct E1PagedLogits {
    static constexpr int kPageTokens = 64;
    static constexpr int kKBytes = kPageTokens * kDim;
    static constexpr int kPageBytes = kKBytes + kPageTokens * 4;
    static constexpr int kN = (kHeads + 7) / 8 * 8;       // wgmma N: heads padded to a multiple of 8
    static constexpr int kSteps = kDim / 16;              // wgmma k16 steps = raw 32-bit words per row
    static constexpr int kChunks = kDim / 64;             // 16-byte chunks per thread per row
    static constexpr int kPairsPerThread = kDim / 8;      // byte pairs per thread per row
    static constexpr int kQBlockBytes = kN * 128;         // one 64-element k-block of B: kN rows x 128 B
    static constexpr int kQBytes = kN * kDim * 2;         // q as f16
    static constexpr int kQChunks = kN * (kDim / 16);     // 16-byte e4m3 chunks of q (padded heads)
    static constexpr int kConsumerThreads = 128;          // one warpgroup (warps 0..3)
    static constexpr int kProducerWarp = 4;
    static constexpr int kThreads = kConsumerThreads + 32;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kConsumerBarrier = 1;  // named barrier of the consumer warpgroup (0 = whole CTA)

    // Shared memory (offsets from the 1024-byte aligned base `align_smem` returns):
    static constexpr int kQOff = 0;                                    // kQBytes, 1024-aligned k-blocks
    static constexpr int kStagesOff = kQOff + kQBytes;                 // kStages x page
    static constexpr int kInfoOff = kStagesOff + kStages * kPageBytes; // kStages x E1StageInfo
    static constexpr int kBarsOff = kInfoOff + kStages * 16;           // full[kStages], empty[kStages]
    static constexpr int kPlanOff = kBarsOff + 2 * kStages * 8;        // E1Plan
    static constexpr int kScanOff = kPlanOff + 32;                     // 2 x kWarps x 2 int32
    static constexpr int kLayoutBytes = kScanOff + 2 * kWarps * 2 * 4;
    static constexpr int kAlignSlack = 1024;  // the dynamic smem base is only guaranteed 16-byte aligned
    static constexpr int kSmemBytes = kLayoutBytes + kAlignSlack;

    static_assert(kHeads >= 1 && kHeads <= 32, "1..32 heads (wgmma N <= 32 keeps the accumulators at 16 registers)");
    static_assert(kDim == 64 || kDim == 128, "head dim 64 or 128 (4 threads x kDim/4 bytes per row)");
    static_assert(kPageBytes % 16 == 0 && kQBytes % 1024 == 0, "bulk copies move 16-byte multiples; B k-blocks are 1024-aligned");
    static_assert(kStages >= 2 && kStages <= 16, "2..16 stages");
    static_assert(kPrefetchPages >= 0, "pages to L2-prefetch before the wait");
    static_assert(kStagesOff % 1024 == 0 && kInfoOff % 16 == 0 && kBarsOff % 8 == 0, "alignment");

    // ---- shared memory ----------------------------------------------------------------------------
    static GLM5_DEVICE uint8_t* align_smem(uint8_t* raw) {
        const uint32_t a = ptx::cvta_shared(raw);
        return raw + ((1024u - (a & 1023u)) & 1023u);
    }
    static GLM5_DEVICE uint8_t* q_smem(uint8_t* sm) { return sm + kQOff; }
    static GLM5_DEVICE uint8_t* stage(uint8_t* sm, int s) { return sm + kStagesOff + s * kPageBytes; }
    static GLM5_DEVICE E1StageInfo* info(uint8_t* sm) { return reinterpret_cast<E1StageInfo*>(sm + kInfoOff); }
    // mbarriers by shared-window address (the sm90_mbarrier.cuh convention)
    static GLM5_DEVICE uint32_t full_bar(uint8_t* sm, int s) { return ptx::cvta_shared(sm + kBarsOff) + 8u * s; }
    static GLM5_DEVICE uint32_t empty_bar(uint8_t* sm, int s) {
        return ptx::cvta_shared(sm + kBarsOff) + 8u * (kStages + s);
    }
    static GLM5_DEVICE E1Plan* plan_of(uint8_t* sm) { return reinterpret_cast<E1Plan*>(sm + kPlanOff); }
    static GLM5_DEVICE int32_t* scan_scratch(uint8_t* sm, int buf) {
        return reinterpret_cast<int32_t*>(sm + kScanOff) + buf * kWarps * 2;
    }

    // ---- small helpers -----------------------------------------------------------------------------
    static GLM5_DEVICE int32_t ld_i32(const int32_t* p) {  // coherent (never the non-coherent path)
        int32_t v;
        asm volatile("ld.global.b32 %0, [%1];" : "=r"(v) : "l"(p));
        return v;
    }
    static GLM5_DEVICE float ld_f32(const float* p) {  // coherent: head_w is the preceding kernel's output
        float v;
        asm volatile("ld.global.f32 %0, [%1];" : "=f"(v) : "l"(p));
        return v;
    }
    static GLM5_DEVICE ptx::u32x4 lds128(const void* p) {
        ptx::u32x4 v;
        asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                     : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                     : "r"(ptx::cvta_shared(p)));
        return v;
    }
    static GLM5_DEVICE float lds_f32(const void* p) {
        float v;
        asm volatile("ld.shared.f32 %0, [%1];" : "=f"(v) : "r"(ptx::cvta_shared(p)));
        return v;
    }
    static GLM5_DEVICE void sts_u32(void* p, uint32_t v) {
        asm volatile("st.shared.b32 [%0], %1;" ::"r"(ptx::cvta_shared(p)), "r"(v) : "memory");
    }
    static GLM5_DEVICE uint32_t cvt_lo(uint32_t w) { return ptx::e4m3x2_to_f16x2(static_cast<uint16_t>(w & 0xffffu)); }
    static GLM5_DEVICE uint32_t cvt_hi(uint32_t w) { return ptx::e4m3x2_to_f16x2(static_cast<uint16_t>(w >> 16)); }
    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int i) { return i == 0 ? v.x : i == 1 ? v.y : i == 2 ? v.z : v.w; }

    static GLM5_DEVICE int cap_of(const E1Problem& p) {
        return static_cast<int>(min(static_cast<int64_t>(p.max_ctx), static_cast<int64_t>(p.bt_width) * kPageTokens));
    }
    static GLM5_DEVICE int pages_per_row(const E1Problem& p) { return (p.max_ctx + kPageTokens - 1) / kPageTokens; }
    static GLM5_DEVICE int clamped_len(const E1Problem& p, int row, int cap) {
        return min(max(ld_i32(p.seq_lens + row), 0), cap);
    }

    // ---- setup: the CTA's shares (all kThreads threads; ends with a CTA barrier) --------------------

    // Inclusive block scan of (a, b) over the kThreads threads in thread order; totals too.
    static GLM5_DEVICE void block_scan2(int a, int b, int& ia, int& ib, int& ta, int& tb, int32_t* scratch, int tid) {
        const int lane = tid & 31, warp = tid >> 5;
        ia = a;
        ib = b;
#pragma unroll
        for (int o = 1; o < 32; o <<= 1) {
            const int xa = __shfl_up_sync(0xffffffffu, ia, o);
            const int xb = __shfl_up_sync(0xffffffffu, ib, o);
            if (lane >= o) {
                ia += xa;
                ib += xb;
            }
        }
        if (lane == 31) {
            scratch[2 * warp] = ia;
            scratch[2 * warp + 1] = ib;
        }
        __syncthreads();
        int pa = 0, pb = 0;
        ta = 0;
        tb = 0;
#pragma unroll
        for (int w = 0; w < kWarps; ++w) {
            const int va = scratch[2 * w], vb = scratch[2 * w + 1];
            if (w < warp) {
                pa += va;
                pb += vb;
            }
            ta += va;
            tb += vb;
        }
        ia += pa;
        ib += pb;
    }

    // Before or after griddep_wait (reads seq_lens only). cta in [0, num_ctas).
    static GLM5_DEVICE void plan(const E1Problem& p, int cta, int num_ctas, uint8_t* sm, int tid) {
        const int cap = cap_of(p), pw = pages_per_row(p);
        // pass 1: total live pages
        int first = 0, local = 0;
        for (int r = tid; r < p.m; r += kThreads) {
            const int l = (clamped_len(p, r, cap) + kPageTokens - 1) / kPageTokens;
            if (r == tid) first = l;
            local += l;
        }
        int ia, ib, total_live, unused;
        block_scan2(local, 0, ia, ib, total_live, unused, scan_scratch(sm, 0), tid);
        const int total_dead = p.m * pw - total_live;
        // equal shares, the first (total % num_ctas) CTAs one page more
        const int ql = total_live / num_ctas, rl = total_live % num_ctas;
        const int qd = total_dead / num_ctas, rd = total_dead % num_ctas;
        const int p0 = ql * cta + min(cta, rl), n_live = ql + (cta < rl ? 1 : 0);
        const int d0 = qd * cta + min(cta, rd), n_dead = qd + (cta < rd ? 1 : 0);
        E1Plan* pl = plan_of(sm);
        if (tid == 0) {
            pl->n_live = n_live;
            pl->n_dead = n_dead;
            pl->live_row = pl->live_pg = pl->dead_row = pl->dead_pg = 0;
        }
        // pass 2: the rows holding page p0 of the live space and page d0 of the dead space
        bool need_l = n_live > 0, need_d = n_dead > 0;
        int carry_l = 0, carry_d = 0;
        for (int base = 0, it = 1; base < p.m && (need_l || need_d); base += kThreads, ++it) {
            const int r = base + tid;
            const int l = r < p.m ? (base == 0 ? first : (clamped_len(p, r, cap) + kPageTokens - 1) / kPageTokens) : 0;
            const int d = r < p.m ? pw - l : 0;
            int il, id, tl, td;
            block_scan2(l, d, il, id, tl, td, scan_scratch(sm, it & 1), tid);
            const int el = carry_l + il - l, ed = carry_d + id - d;
            if (need_l && l > 0 && el <= p0 && p0 < el + l) {
                pl->live_row = r;
                pl->live_pg = p0 - el;
            }
            if (need_d && d > 0 && ed <= d0 && d0 < ed + d) {
                pl->dead_row = r;
                pl->dead_pg = l + (d0 - ed);
            }
            carry_l += tl;
            carry_d += td;
            need_l = need_l && carry_l <= p0;
            need_d = need_d && carry_d <= d0;
        }
        __syncthreads();
    }

    // Thread 0, once, before the first CTA barrier.
    static GLM5_DEVICE void init_barriers(uint8_t* sm) {
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            sm90::mbar_init(full_bar(sm, s), 1);
            sm90::mbar_init(empty_bar(sm, s), kConsumerThreads);
        }
        sm90::fence_barrier_init();
    }

    // ---- segment walker (one warp; every lane calls f with the same arguments) -----------------------
    // Walks `count` pages from page `pg` of row `row` over the rows' page intervals, 32 rows per step:
    // live intervals [0, L) when kLive, dead intervals [L, pw) otherwise (L = ceil(len / 64)), and
    // calls f(row, first_page, pages, len) once per non-empty segment, in order.
    template <bool kLive, class F>
    static GLM5_DEVICE void walk(const E1Problem& p, int row, int pg, int count, int lane, F&& f) {
        const int cap = cap_of(p), pw = pages_per_row(p);
        while (count > 0 && row < p.m) {
            const int r = row + lane;
            int len = 0, lo = 0, hi = 0;
            if (r < p.m) {
                len = clamped_len(p, r, cap);
                const int L = (len + kPageTokens - 1) / kPageTokens;
                lo = kLive ? 0 : L;
                hi = kLive ? L : pw;
                if (lane == 0) lo = max(lo, pg);
            }
            const int n = max(hi - lo, 0);
            int incl = n;
#pragma unroll
            for (int o = 1; o < 32; o <<= 1) {
                const int x = __shfl_up_sync(0xffffffffu, incl, o);
                if (lane >= o) incl += x;
            }
            const int take = max(min(incl, count) - (incl - n), 0);
            uint32_t mask = __ballot_sync(0xffffffffu, take > 0);
            while (mask) {
                const int src = __ffs(mask) - 1;
                mask &= mask - 1;
                f(row + src, __shfl_sync(0xffffffffu, lo, src), __shfl_sync(0xffffffffu, take, src),
                  __shfl_sync(0xffffffffu, len, src));
            }
            count -= min(__shfl_sync(0xffffffffu, incl, 31), count);
            row += 32;
            pg = 0;
        }
    }

    // ---- producer warp ------------------------------------------------------------------------------

    // Before griddep_wait, with meta_before_wait: L2-prefetch the first kPrefetchPages live pages.
    static GLM5_DEVICE void producer_prefetch(const E1Problem& p, uint8_t* sm, int lane) {
        const E1Plan pl = *plan_of(sm);
        const int n = min(pl.n_live, kPrefetchPages);
        walk<true>(p, pl.live_row, pl.live_pg, n, lane, [&](int row, int first, int cnt, int) {
            const int32_t* bt = p.block_table + row * p.bt_stride + first;
            for (int base = 0; base < cnt; base += 32) {
                if (base + lane < cnt) {
                    const int32_t pid = ld_i32(bt + base + lane);
                    if (pid >= 0 && pid < p.num_pages)
                        ptx::bulk_prefetch_l2(p.cache + static_cast<int64_t>(pid) * kPageBytes, kPageBytes);
                }
            }
        });
    }

    // After griddep_wait: stream the CTA's live pages through the ring. Triggers the dependent
    // launch (griddepcontrol.launch_dependents) once its last page is issued.
    static GLM5_DEVICE void producer_run(const E1Problem& p, uint8_t* sm, int lane) {
        const E1Plan pl = *plan_of(sm);
        const uint64_t policy = sm90::l2_policy_evict_first();  // each page is read once
        const uint32_t stages0 = ptx::cvta_shared(stage(sm, 0));
        int s = 0;          // stage of the next page
        uint32_t round = 0; // times the ring wrapped before it
        walk<true>(p, pl.live_row, pl.live_pg, pl.n_live, lane, [&](int row, int first, int cnt, int len) {
            const int32_t* bt = p.block_table + row * p.bt_stride + first;
            for (int base = 0; base < cnt; base += 32) {
                const int k = min(32, cnt - base);
                int32_t pid_l = -1;
                if (lane < k) {
                    const int32_t v = ld_i32(bt + base + lane);
                    pid_l = (v >= 0 && v < p.num_pages) ? v : -1;
                }
                for (int j = 0; j < k; ++j) {
                    const int32_t pid = __shfl_sync(0xffffffffu, pid_l, j);
                    if (round > 0) sm90::mbar_wait(empty_bar(sm, s), (round - 1) & 1);
                    if (lane == 0) {
                        E1StageInfo inf;
                        inf.pid = pid;
                        inf.row = row;
                        inf.col0 = (first + base + j) * kPageTokens;
                        inf.len = len;
                        info(sm)[s] = inf;
                        if (pid >= 0) {
                            sm90::mbar_arrive_expect_tx(full_bar(sm, s), kPageBytes);
                            e1_sm90::bulk_copy_g2s_hint(stages0 + s * kPageBytes,
                                                        p.cache + static_cast<int64_t>(pid) * kPageBytes, kPageBytes,
                                                        full_bar(sm, s), policy);
                        } else {
                            sm90::mbar_arrive(full_bar(sm, s));  // nothing copied: the consumer writes NaN
                        }
                    }
                    __syncwarp();
                    if (++s == kStages) {
                        s = 0;
                        ++round;
                    }
                }
            }
        });
        // Every page of this CTA is in flight: let the next kernel's CTAs take the free slots now
        // (its own griddepcontrol.wait still waits for our completion).
        if (lane == 0) ptx::griddep_launch_dependents();
    }

    // ---- consumer warpgroup -------------------------------------------------------------------------

    // q of one row: this thread's e4m3 chunks (kQChunks over 128 threads) and head weights.
    static constexpr int kQPerThread = (kQChunks + kConsumerThreads - 1) / kConsumerThreads;
    struct QRegs {
        ptx::u32x4 c[kQPerThread];
    };

    static GLM5_DEVICE QRegs fetch_q(const E1Problem& p, int row, int tid) {
        QRegs r;
#pragma unroll
        for (int i = 0; i < kQPerThread; ++i) {
            const int c = tid + i * kConsumerThreads;
            const int n = c / (kDim / 16), k = c % (kDim / 16);
            r.c[i] = ptx::u32x4{0u, 0u, 0u, 0u};
            if (c < kQChunks && n < kHeads)
                r.c[i] = ptx::ld_global_v4(p.q + (static_cast<int64_t>(row) * kHeads + n) * kDim + k * 16);
        }
        return r;
    }

    // Byte offset in B of logical f16 pair kp of head n (128B swizzle: chunk ^= n % 8).
    static GLM5_DEVICE int b_offset(int n, int kp) {
        return (kp >> 5) * kQBlockBytes + n * 128 + ((((kp & 31) >> 2) ^ (n & 7)) << 4) + ((kp & 3) << 2);
    }

    // Physical byte pair pp of a q row -> the logical pair kp of the K permutation (see the header).
    static GLM5_DEVICE int logical_pair(int pp) {
        const int t = pp / kPairsPerThread, r = pp % kPairsPerThread;
        return 8 * (r >> 1) + 4 * (r & 1) + t;
    }

    // Convert and store q (all 128 consumer threads), then make it visible to wgmma.
    static GLM5_DEVICE void store_q(const QRegs& r, uint8_t* sm, int tid) {
        uint8_t* qs = q_smem(sm);
#pragma unroll
        for (int i = 0; i < kQPerThread; ++i) {
            const int c = tid + i * kConsumerThreads;
            if (c < kQChunks) {
                const int n = c / (kDim / 16), k = c % (kDim / 16);
#pragma unroll
                for (int wi = 0; wi < 4; ++wi) {
                    const uint32_t w = word(r.c[i], wi);
                    const int pp = k * 8 + wi * 2;  // physical pair of the word's low half
                    sts_u32(qs + b_offset(n, logical_pair(pp)), cvt_lo(w));
                    sts_u32(qs + b_offset(n, logical_pair(pp + 1)), cvt_hi(w));
                }
            }
        }
        sm90::fence_proxy_async_smem();  // st.shared (generic proxy) -> wgmma operand reads (async proxy)
    }

    // Head weights this thread's accumulator columns need: heads 8j + 2t + b (0 past kHeads).
    static GLM5_DEVICE void fetch_w(const E1Problem& p, int row, int t4, float (&wv)[kN / 4]) {
        const float* src = p.head_w + static_cast<int64_t>(row) * kHeads;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                const int h = 8 * j + 2 * t4 + b;
                wv[2 * j + b] = h < kHeads ? ld_f32(src + h) : 0.0f;
            }
        }
    }

    // One page in registers: stage record, raw e4m3 words of rows g / g + 8, this lane's s_k.
    struct Page {
        E1StageInfo inf;
        ptx::u32x4 raw[2][kChunks];
        float sk;
    };

    // Wait for page i's stage, copy what the MMA and epilogue need into registers, release the stage.
    static GLM5_DEVICE void take_page(uint8_t* sm, int s, uint32_t parity, int warp, int g, int t4, Page& pg) {
        sm90::mbar_wait(full_bar(sm, s), parity);
        const ptx::u32x4 iv = lds128(&info(sm)[s]);
        pg.inf.pid = static_cast<int32_t>(iv.x);
        pg.inf.row = static_cast<int32_t>(iv.y);
        pg.inf.col0 = static_cast<int32_t>(iv.z);
        pg.inf.len = static_cast<int32_t>(iv.w);
        if (pg.inf.pid >= 0) {  // uniform over the warpgroup
            const uint8_t* st = stage(sm, s);
#pragma unroll
            for (int h = 0; h < 2; ++h) {
                const uint8_t* rowp = st + (16 * warp + g + 8 * h) * kDim + t4 * (kDim / 4);
                if constexpr (kChunks == 2) {
                    const int odd = g & 1;
                    const ptx::u32x4 x = lds128(rowp + 16 * odd);
                    const ptx::u32x4 y = lds128(rowp + 16 * (odd ^ 1));
                    pg.raw[h][0] = odd ? y : x;
                    pg.raw[h][1] = odd ? x : y;
                } else {
                    pg.raw[h][0] = lds128(rowp);
                }
            }
            pg.sk = lds_f32(st + kKBytes + (16 * warp + g + 8 * (t4 & 1)) * 4);
        } else {  // nothing was copied: defined (unused) MMA inputs
#pragma unroll
            for (int h = 0; h < 2; ++h)
#pragma unroll
                for (int c = 0; c < kChunks; ++c) pg.raw[h][c] = ptx::u32x4{0u, 0u, 0u, 0u};
            pg.sk = 0.0f;
        }
        sm90::mbar_arrive(empty_bar(sm, s));  // the page is in registers: the producer may refill
    }

    static GLM5_DEVICE void issue_mma(const Page& pg, uint32_t q_base, float (&acc)[kN / 2]) {
        uint32_t a[kSteps][4];
#pragma unroll
        for (int st = 0; st < kSteps; ++st) {
            const uint32_t w0 = word(pg.raw[0][st / 4], st % 4), w1 = word(pg.raw[1][st / 4], st % 4);
            a[st][0] = cvt_lo(w0);
            a[st][1] = cvt_lo(w1);
            a[st][2] = cvt_hi(w0);
            a[st][3] = cvt_hi(w1);
        }
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) sm90::fence_operand(acc[i]);
        sm90::wgmma_fence();
#pragma unroll
        for (int st = 0; st < kSteps; ++st) {
            const uint64_t desc = sm90::smem_desc_k128sw(q_base + (st >> 2) * kQBlockBytes + (st & 3) * 32);
            e1_sm90::wgmma_m64k16_f16_rs<kN>(acc, a[st][0], a[st][1], a[st][2], a[st][3], desc, st > 0 ? 1 : 0);
        }
        sm90::wgmma_commit();
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) sm90::fence_operand(acc[i]);
    }

    static GLM5_DEVICE void store_logit(const E1Problem& p, const E1StageInfo& inf, int tok, float v, int t4) {
        const int col = inf.col0 + tok;
        if (t4 < 2 && col < p.max_ctx)
            ptx::st_global_f32(p.logits + static_cast<int64_t>(inf.row) * p.max_ctx + col,
                               col < inf.len ? v : __int_as_float(0xff800000));
    }

    static GLM5_DEVICE void epilogue(const E1Problem& p, const Page& pg, const float (&acc)[kN / 2],
                                     const float (&wv)[kN / 4], int warp, int g, int t4) {
        float p0 = 0.0f, p1 = 0.0f;
#pragma unroll
        for (int j = 0; j < kN / 8; ++j) {
#pragma unroll
            for (int b = 0; b < 2; ++b) {
                p0 = fmaf(wv[2 * j + b], ptx::relu_nan(acc[4 * j + b]), p0);
                p1 = fmaf(wv[2 * j + b], ptx::relu_nan(acc[4 * j + 2 + b]), p1);
            }
        }
        p0 += __shfl_xor_sync(0xffffffffu, p0, 1);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 1);
        p0 += __shfl_xor_sync(0xffffffffu, p0, 2);
        p1 += __shfl_xor_sync(0xffffffffu, p1, 2);
        const int hi = t4 & 1;
        const float v = pg.inf.pid >= 0 ? (hi ? p1 : p0) * pg.sk : __int_as_float(0x7fffffff);
        store_logit(p, pg.inf, 16 * warp + g + 8 * hi, v, t4);
    }

    // -inf over the CTA's dead pages (all 4 consumer warps walk; each writes its share).
    static GLM5_DEVICE void fill_dead(const E1Problem& p, const E1Plan& pl, int tid) {
        const int lane = tid & 31;
        walk<false>(p, pl.dead_row, pl.dead_pg, pl.n_dead, lane, [&](int row, int first, int cnt, int) {
            float* out = p.logits + static_cast<int64_t>(row) * p.max_ctx;
            const int c1 = min((first + cnt) * kPageTokens, p.max_ctx);
            for (int c = first * kPageTokens + tid; c < c1; c += kConsumerThreads)
                ptx::st_global_f32(out + c, __int_as_float(0xff800000));
        });
    }

    // After griddep_wait. The 128 threads of warps 0..3.
    static GLM5_DEVICE void consumer_run(const E1Problem& p, uint8_t* sm, int tid) {
        const int warp = tid >> 5, lane = tid & 31, g = lane >> 2, t4 = lane & 3;
        const E1Plan pl = *plan_of(sm);
        const uint32_t q_base = ptx::cvta_shared(q_smem(sm));

        int q_row = -1;
        float wv[kN / 4];
        if (pl.n_live > 0) {  // the first row's q: loads in flight while the dead columns are written
            q_row = pl.live_row;
            const QRegs qr = fetch_q(p, q_row, tid);
            fetch_w(p, q_row, t4, wv);
            fill_dead(p, pl, tid);
            store_q(qr, sm, tid);
            ptx::named_barrier_sync<kConsumerBarrier, kConsumerThreads>();
        } else {
            fill_dead(p, pl, tid);
            return;
        }

        float acc[kN / 2];
#pragma unroll
        for (int i = 0; i < kN / 2; ++i) acc[i] = 0.0f;

        Page cur, nxt;
        int s = 0;
        uint32_t round = 0;
        take_page(sm, s, round & 1, warp, g, t4, cur);
        for (int i = 0; i < pl.n_live; ++i) {
            if (++s == kStages) {
                s = 0;
                ++round;
            }
            if (cur.inf.row != q_row) {  // a new row: every wgmma of the old q has completed (waited below)
                q_row = cur.inf.row;
                const QRegs qr = fetch_q(p, q_row, tid);
                fetch_w(p, q_row, t4, wv);
                ptx::named_barrier_sync<kConsumerBarrier, kConsumerThreads>();  // all done reading the old q
                store_q(qr, sm, tid);
                ptx::named_barrier_sync<kConsumerBarrier, kConsumerThreads>();
            }
            // An unreadable page (pid < 0) runs the MMA on stale registers too (keeping the wgmma
            // path free of data-dependent branches) and writes NaN instead of the result.
            issue_mma(cur, q_base, acc);
            if (i + 1 < pl.n_live) take_page(sm, s, round & 1, warp, g, t4, nxt);  // overlaps the MMA
            sm90::wgmma_wait<0>();
#pragma unroll
            for (int k = 0; k < kN / 2; ++k) sm90::fence_operand(acc[k]);
            epilogue(p, cur, acc, wv, warp, g, t4);
            cur = nxt;
        }
    }
};

}  // namespace attn_pre
}  // namespace glm5
