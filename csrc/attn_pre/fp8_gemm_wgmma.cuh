// Hopper-native mainloop of the skinny block-scaled FP8 GEMM family (fp8_gemm_skinny.cuh): TMA weight
// and activation loads into a deep mbarrier ring, wgmma m64nNk32 e4m3 from shared memory, promotion
// in registers, then the SAME split-K finish and epilogues as the mma.sync mainloop (SkinnyFinish).
//
//   y[m, n] = sum_g xs[m, g] * S[n / 128, g] * sum_{k in group g} x8[m, k] * W8[n, k]
//
// ---- Decomposition (as the mma.sync kernel) ----------------------------------------------------
// swapAB: weight rows on the wgmma M side, tokens on N (N = kTM = 8/16/32/64/128). A CTA owns (n
// tile of 128 weight rows = one weight-scale block row, K split, token block): grid = (tiles_n,
// splits, tiles_m). 288 threads:
//   warps 0-7  two math warpgroups; warpgroup w multiplies weight rows 64w .. 64w+63 of the tile
//              (the A operand starts 64*128 bytes into the stage) with all kTM tokens;
//   warp 8     the TMA producer (one elected thread issues everything; the other lanes exit).
// No setmaxnreg: it needs whole warpgroups, and with one 288-thread CTA per SM (__launch_bounds__
// (288, 1)) every thread may already use 224 registers, more than the math warps need
// (kTM = 128: 64 accumulator + 64 partial floats).
//
// ---- Ring (kStages x (16 KB weights + kTM x 128 B activations)) ---------------------------------
// Stage i holds K group g_begin + i: the weight box [128 rows, 128 K-bytes] of the W tensor map and
// the activation box [kTM tokens, 128 K-bytes] of the x tensor map, both written by TMA with
// SWIZZLE_128B (rows past N / past M are zero-filled by TMA and still count as transaction bytes).
// full[s]  (count 1): the producer's arrive.expect_tx(16384 + kTM*128) + the TMA bytes.
// empty[s] (count 8): lane 0 of each math warp after its wgmma of the stage completed.
// Before griddepcontrol.wait the producer arms full[s] for the first min(kStages, nk) stages and
// issues their WEIGHT boxes (and the math warps load the weight scales); after the wait it issues
// the activation boxes of those stages on the same (already armed) barriers, then streams the rest
// of the split through the ring. Activations come by TMA rather than cp.async because (1) TMA and
// wgmma both use the async proxy, so no generic->async proxy fence is needed between the fill and
// the MMA, (2) one instruction per stage instead of kTM*8 16-byte copies by the producer warp,
// (3) tokens past M are zero-filled for free. The host caches the activation tensor map per
// (pointer, shape), so steady-state and CUDA-graph launches do not re-encode it.
//
// ---- Math ---------------------------------------------------------------------------------------
// Per stage each math warpgroup issues 4 wgmma m64nkTMk32 (the 4 32-byte K slices of the 128-byte
// swizzled rows: descriptor start address + 32*k) into a fresh fp32 partial (scale-d = 0 on the
// first), commits, waits, releases the stage, and promotes: acc += partial * (xs[token] * S) with
// the scales from shared memory (the FP8 tensor-core accumulator is not a full fp32 sum over long
// K, hence the per-128-K promotion, as in the mma.sync kernel).
//
// ---- Hand-off to the shared finish -----------------------------------------------------------------
// The wgmma fragment gives warp w rows 16w + g and 16w + g + 8 (g = lane / 4); SkinnyFinish expects
// rows 16w + 2g and 16w + 2g + 1 (the mma.sync kernel's pairing, which the RoPE / bf16x2 epilogues
// rely on). A register permutation inside each warp (8 shuffles per 8-token block) converts one
// into the other; then the split-K publish / last-CTA reduce and every epilogue run unchanged.
#pragma once

#include <cuda.h>

#include "../common/cluster.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/sm90_tma.cuh"
#include "../common/sm90_wgmma.cuh"
#include "fp8_gemm_skinny.cuh"

// Phase marks (diagnostic builds only: fp8_gemm_wgmma.cu with GLM5_SKINNY_PHASES defines the macro to record
// %globaltimer per CTA; compiled out otherwise, so the tile code is unchanged for every other user).
#ifndef GLM5_SKINNY_MARK
#define GLM5_SKINNY_MARK(i) ((void)0)
#endif

namespace glm5 {
namespace attn_pre {
namespace skinny {

constexpr int kWgThreads = kThreads + 32;  // 8 math warps (2 warpgroups) + 1 TMA producer warp
constexpr int kWgSmemAlign = 1024;         // SWIZZLE_128B tiles need 1024-byte aligned bases

// Shared-memory carve-up (offsets from the 1024-aligned base; the launch adds kWgSmemAlign bytes
// of slack so the dynamic smem base can be rounded up). Mirrored by glm5_fastpath/ops/fp8_gemm.py.
template <int kTM, int kStages, int kEpi = 0>
struct WgmmaSmem {
    static constexpr int kXStageBytes = kTM * kBlockK;                 // >= 1024: aligned stages
    static constexpr int kOffW = 0;                                     // float8 [kStages][128][128]
    static constexpr int kOffX = kOffW + kStages * kWStageBytes;        // float8 [kStages][kTM][128]
    static constexpr int kOffBar = kOffX + kStages * kXStageBytes;      // uint64 full[kStages], empty[kStages]
    static constexpr int kOffScratch = kOffBar + 16 * kStages;          // SkinnyFinish scratch (red + flag)
    static constexpr int kOffWs = kOffScratch + finish_scratch_bytes(kTM, kEpi);  // float[gmax]
    __host__ __device__ static constexpr int off_xs(int gmax) { return kOffWs + (gmax * 4 + 15) / 16 * 16; }
    __host__ __device__ static constexpr int bytes(int gmax) { return off_xs(gmax) + gmax * kTM * 4; }
    __host__ __device__ static constexpr int launch_bytes(int gmax) { return bytes(gmax) + kWgSmemAlign; }
    static_assert(kXStageBytes % 1024 == 0 && kOffX % 1024 == 0, "TMA / wgmma tiles must stay 1024-byte aligned");
};

// Diagnostic variants (kDiag*, fp8_gemm_skinny.cuh) of this mainloop:
//   kDiagLoadsOnly  TMA ring + barriers; per stage one ld.shared word per math thread feeds acc
//                   (no wgmma, no promotion); no split-K reduce (split 0 stores).
//   kDiagNoReduce   full mainloop; split-K publish / reduce skipped (split 0 stores).
//   kDiagNoLoads    only the prologue's min(kStages, nk) stages are loaded; the K loop re-reads them
//                   (wgmma + promotion + barrier cost); split 0 stores.
//
// Consumer pipelining (kPipe, GLM5_SKINNY_PIPE): 0 = per stage issue 4 wgmma, wait_group 0, release,
// promote (the tensor cores idle during the promotion and the next stage's wait + issue); 1 = after
// wait_group 0 and the release, the partial is copied to plain registers, stage s+1's wgmmas are
// issued into it, and stage s is promoted from the copy while s+1 runs. (Two wgmma partials with
// wait_group 1 was tried: ptxas serialises all wgmmas when one partial is read while the other is in
// flight, C7514.) 2 = stages in pairs: issue stage s into partial A and stage s+1 into partial B (each after its
// own full-barrier wait), ONE wait_group 0, release and promote A then B: the two 4-wgmma chains are in flight
// together and the commit/wait round trip is paid once per two stages (at decode sizes the per-stage math is a
// latency chain of ~0.5 us, the same order as one stage's HBM time per SM). Same arithmetic in the same order
// in every mode: bitwise identical results.
//
// Split-K finish (kReduce, GLM5_SKINNY_REDUCE): 0 = global workspace + arrival counter
// (SkinnyFinish::reduce_splits); 1 = cluster: the `splits` CTAs of one (n tile, token block) are one
// thread-block cluster (grid (tiles_n, splits, tiles_m), cluster (1, splits, 1), splits <= 8); each
// CTA writes its fp32 tile (fragment order) into its own (now idle) ring, cluster barrier, rank 0
// sums ranks 0..S-1 in order through ld.shared::cluster (the same order and operations as the global
// path: bitwise identical) and runs the epilogue; a second cluster barrier keeps the peers' smem
// alive until rank 0 has read it. No workspace, no counters, no fences to L2.
//
// In-flight cap (kInflight, GLM5_SKINNY_INFLIGHT; 0 = off, the default): the producer issues only the first
// kInflight stages of the ring fill at once and each later fill stage once the stage kInflight before it has
// landed. Why (session 24 experiment): a CTA that issues its whole ring at once gets its first box only when the
// whole grid's burst has drained (the DRAM serves every CTA's boxes interleaved; bench gemm-phases, session 17:
// first byte 2.3 us after the wait for QKV-A, 4.6 us for q_b), while the wgmma chain sits idle; ~kInflight
// boxes per CTA in flight still cover the DRAM latency (Little's law: 128 CTAs x 2-3 x 16 KB = 4-6 MB). Same
// loads, same order of math: bitwise identical results. One CTA per unit only (the persistent producer assumes
// the whole prefill was issued by producer_prologue). Measured (H200, session 24 c4 / c5): bitwise equal, but no
// per-op gain at 2 or 3 stages (the first-byte wait is not the DRAM's interleaving of one big burst); off.
template <int kTM, int kStages, int kEpi, int kDiag = kDiagOff, int kPipe = 0, int kReduce = 0, int kWKb = 0,
          int kInflight = 0>
struct WgmmaGemmTile {
    static_assert(kWKb == 0 || kWKb == 1, "kWKb: 0 row-major weights, 1 k-block-major");
    static_assert(kPipe >= 0 && kPipe <= 2, "kPipe: 0, 1 or 2");
    static_assert(kPipe == 0 || kTM <= 64, "kPipe: two partials + the accumulator fit up to 64 tokens");
    static_assert(kReduce == 0 || kDiag == kDiagOff, "cluster reduce: no diagnostic variants");
    static_assert(kTM == 8 || kTM == 16 || kTM == 32 || kTM == 64 || kTM == 128, "token block: 8..128");
    static_assert(kStages >= 2 && kStages <= 16, "2..16 ring stages");
    static_assert(kInflight >= 0 && kInflight <= kStages, "in-flight cap: 0 (off) .. kStages");
    static_assert(kDiag == kDiagOff || kEpi == kEpiPlain, "diagnostic variants use the plain epilogue");
    static_assert(kDiag >= kDiagOff && kDiag <= kDiagNoLoads, "diagnostic mode 0..3");
    using Finish = SkinnyFinish<kTM, kEpi>;
    using Smem = WgmmaSmem<kTM, kStages, kEpi>;
    static constexpr int kNT = kTM / 8;
    static constexpr int kAcc = kTM / 2;  // fp32 accumulator registers of one m64 x kTM wgmma per thread
    static constexpr uint32_t kStageTx = kWStageBytes + Smem::kXStageBytes;
    static constexpr int kEmptyArrivals = kWarps;  // lane 0 of every math warp

    static GLM5_DEVICE Coord coord(const SkinnyParams& p, int tile_n, int split, int tile_m) {
        return make_coord(p, tile_n, split, tile_m);
    }

    // The dynamic smem base rounded up to 1024 bytes (the launch reserves kWgSmemAlign of slack).
    static GLM5_DEVICE uint8_t* align_smem(uint8_t* raw) {
        const uint32_t a = ptx::smem_addr(raw);
        return raw + ((((a + (kWgSmemAlign - 1)) & ~static_cast<uint32_t>(kWgSmemAlign - 1))) - a);
    }
    static GLM5_DEVICE uint32_t full_bar(uint32_t base, int s) { return base + Smem::kOffBar + 8 * s; }
    static GLM5_DEVICE uint32_t empty_bar(uint32_t base, int s) { return base + Smem::kOffBar + 8 * (kStages + s); }
    static GLM5_DEVICE int prefill(const Coord& c) { return c.nk < kStages ? c.nk : kStages; }
    // The prefill stages issued at once (before griddepcontrol.wait): all of them, or kInflight.
    static GLM5_DEVICE int first_burst(const Coord& c) {
        const int n = prefill(c);
        return kInflight > 0 && kInflight < n ? kInflight : n;
    }

    // One stage's weight box: k group g (128 K-bytes) of the 128 rows from n0. Row-major W8 [N, K]: 128
    // rows of 128 bytes each K bytes apart; k-block-major W8 [K / 128][N][128] (kWKb): 16 KB in one piece.
    // The box lands in shared memory identically either way (same swizzle, same bytes).
    // Builds with GLM5_WEIGHTS_EVICT_FIRST=1 (ops/_device.py weights_hint_defines) load the row-major box
    // evict-first (ptx_cp_async.cuh cp_async_16_weights says why).
    static GLM5_DEVICE void load_w(const CUtensorMap* w_map, uint32_t dst, uint32_t bar, int g, int n0) {
        if constexpr (kWKb) {
            sm90::tma_load_3d(w_map, dst, bar, 0, n0, g);
        } else {
#if defined(GLM5_WEIGHTS_EVICT_FIRST) && GLM5_WEIGHTS_EVICT_FIRST
            sm90::tma_load_2d_hint(w_map, dst, bar, g * kBlockK, n0, ptx::l2_policy_evict_first());
#else
            sm90::tma_load_2d(w_map, dst, bar, g * kBlockK, n0);
#endif
        }
    }

    // One thread, before a CTA barrier that every thread passes before touching a barrier.
    static GLM5_DEVICE void init_barriers(uint8_t* smem) {
        const uint32_t base = ptx::smem_addr(smem);
#pragma unroll
        for (int s = 0; s < kStages; ++s) {
            sm90::mbar_init(full_bar(base, s), 1);
            sm90::mbar_init(empty_bar(base, s), kEmptyArrivals);
        }
        sm90::fence_barrier_init();
    }

    // ---- producer (one thread of warp 8) --------------------------------------------------------
    // Before griddepcontrol.wait (the generic prologue): both tensor-map descriptors into the cache.
    static GLM5_DEVICE void prefetch_descriptors(const CUtensorMap* w_map, const CUtensorMap* x_map) {
        sm90::tma_prefetch_desc(w_map);
        sm90::tma_prefetch_desc(x_map);
    }

    // Before griddepcontrol.wait: arm the first prefill stages for weights + activations and issue
    // their weight boxes (weights are not the previous kernel's output).
    static GLM5_DEVICE void producer_prologue(const SkinnyParams& p, const Coord& c, const CUtensorMap* w_map,
                                              const CUtensorMap* x_map, uint8_t* smem) {
        const uint32_t base = ptx::smem_addr(smem);
        const int n = first_burst(c);
        for (int s = 0; s < n; ++s) {
            sm90::mbar_arrive_expect_tx(full_bar(base, s), kStageTx);
            load_w(w_map, base + Smem::kOffW + s * kWStageBytes, full_bar(base, s), c.g_begin + s, c.tile_n * kBlockN);
        }
    }

    // After griddepcontrol.wait: the prefill stages' activation boxes, then the rest of the split.
    static GLM5_DEVICE void producer_mainloop(const SkinnyParams& p, const Coord& c, const CUtensorMap* w_map,
                                              const CUtensorMap* x_map, uint8_t* smem) {
        const uint32_t base = ptx::smem_addr(smem);
        const int n = prefill(c), n0 = first_burst(c);
        const int row_x = c.tile_m * kTM;
        for (int s = 0; s < n0; ++s)
            sm90::tma_load_2d(x_map, base + Smem::kOffX + s * Smem::kXStageBytes, full_bar(base, s),
                              (c.g_begin + s) * kBlockK, row_x);
        for (int s = n0; s < n; ++s) {  // in-flight cap: stage s once stage s - kInflight has landed
            sm90::mbar_wait(full_bar(base, s - kInflight), 0u);
            const uint32_t full = full_bar(base, s);
            sm90::mbar_arrive_expect_tx(full, kStageTx);
            load_w(w_map, base + Smem::kOffW + s * kWStageBytes, full, c.g_begin + s, c.tile_n * kBlockN);
            sm90::tma_load_2d(x_map, base + Smem::kOffX + s * Smem::kXStageBytes, full, (c.g_begin + s) * kBlockK, row_x);
        }
        const int n_loop = kDiag == kDiagNoLoads ? 0 : c.nk;  // no-loads diagnostic: the prefill only
        for (int it = n; it < n_loop; ++it) {
            const int slot = it % kStages;
            const uint32_t round = static_cast<uint32_t>(it / kStages);  // >= 1
            sm90::mbar_wait(empty_bar(base, slot), (round - 1) & 1u);    // the math warps released round-1
            const uint32_t full = full_bar(base, slot);
            sm90::mbar_arrive_expect_tx(full, kStageTx);
            load_w(w_map, base + Smem::kOffW + slot * kWStageBytes, full, c.g_begin + it, c.tile_n * kBlockN);
            sm90::tma_load_2d(x_map, base + Smem::kOffX + slot * Smem::kXStageBytes, full, (c.g_begin + it) * kBlockK,
                              row_x);
        }
    }

    // Persistent launch (kPersist): this CTA's units u = blockIdx.x, + gridDim.x, ... stream through ONE ring:
    // stage q (counted over all of the CTA's units) uses slot q % kStages with parity (q / kStages) & 1, so the
    // next unit's weights are in flight while the math warps finish the previous unit (no per-CTA ramp-up).
    // The first unit's prefill was issued by producer_prologue (weights before griddepcontrol.wait).
    static GLM5_DEVICE void producer_persistent(const SkinnyParams& p, const CUtensorMap* w_map, const CUtensorMap* x_map,
                                                uint8_t* smem, int units) {
        const uint32_t base = ptx::smem_addr(smem);
        uint32_t q = 0;
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const Coord c = unit_coord(p, u);
            const int row_x = c.tile_m * kTM;
            int it = 0;
            if (u == static_cast<int>(blockIdx.x)) {  // the prefill: weights already issued and armed
                const int n = prefill(c);
                for (; it < n; ++it)
                    sm90::tma_load_2d(x_map, base + Smem::kOffX + it * Smem::kXStageBytes, full_bar(base, it),
                                      (c.g_begin + it) * kBlockK, row_x);
                q = static_cast<uint32_t>(n);
            }
            for (; it < c.nk; ++it, ++q) {
                const int slot = static_cast<int>(q % kStages);
                if (q >= static_cast<uint32_t>(kStages))
                    sm90::mbar_wait(empty_bar(base, slot), ((q / kStages) - 1) & 1u);  // round q/kStages - 1 released
                const uint32_t full = full_bar(base, slot);
                sm90::mbar_arrive_expect_tx(full, kStageTx);
                load_w(w_map, base + Smem::kOffW + slot * kWStageBytes, full, c.g_begin + it, c.tile_n * kBlockN);
                sm90::tma_load_2d(x_map, base + Smem::kOffX + slot * Smem::kXStageBytes, full, (c.g_begin + it) * kBlockK,
                                  row_x);
            }
        }
    }

    // Unit u of a persistent launch -> (n tile, split, token block), token block fastest (as the one-CTA-per-unit grid).
    static GLM5_DEVICE Coord unit_coord(const SkinnyParams& p, int u) {
        const int rest = u / p.tiles_m;
        return make_coord(p, rest % p.tiles_n, rest / p.tiles_n, u % p.tiles_m);
    }

    // ---- math warps (threads 0..255) --------------------------------------------------------------
    // Before griddepcontrol.wait: this split's weight scales.
    static GLM5_DEVICE void consumer_prologue(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid) {
        float* s_ws = reinterpret_cast<float*>(smem + Smem::kOffWs);
        const int G = p.K / kBlockK;
        for (int i = tid; i < c.nk; i += kThreads)
            s_ws[i] = __ldg(p.w_scale + static_cast<int64_t>(c.tile_n) * G + c.g_begin + i);
    }

    // After griddepcontrol.wait: activation scales, the K loop, the layout hand-off and the split-K
    // finish. Returns false when another CTA finishes this tile.
    // q0: stages this CTA consumed before this unit (persistent launches; 0 otherwise).
    static GLM5_DEVICE bool mainloop(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid,
                                     float (&acc)[kNT][4], uint32_t q0 = 0) {
        const int lane = tid & 31, warp = tid >> 5, wg = warp >> 2;
        const int g = lane >> 2, t = lane & 3;
        const uint32_t base = ptx::smem_addr(smem);
        const float* s_ws = reinterpret_cast<const float*>(smem + Smem::kOffWs);
        float* s_xs = reinterpret_cast<float*>(smem + Smem::off_xs(c.gmax));
        const int G = p.K / kBlockK;
        const int m0 = c.tile_m * kTM;
        for (int i = tid; i < c.nk * kTM; i += kThreads) {
            const int gi = i / kTM, r = i % kTM;
            const int tok = m0 + r;
            s_xs[i] = tok < p.M ? p.x_scale[static_cast<int64_t>(tok) * G + c.g_begin + gi] : 0.0f;
        }
        const Scratch sc = Finish::scratch(smem + Smem::kOffScratch);
        Finish::stage_pre(p, c, sc, tid);      // epilogue inputs (positions, slots, w_raw) -> smem
        consumer_sync();  // s_xs (and the pre-wait s_ws) visible to every math warp
        Finish::stage_tables(p, c, sc, tid);   // (cos, sin) by cp.async, waited for at the epilogue

        float d[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) d[i] = 0.0f;
        float part[kAcc];
#pragma unroll
        for (int i = 0; i < kAcc; ++i) part[i] = 0.0f;

        const int n_pre = prefill(c);
        const uint32_t a_off = Smem::kOffW + static_cast<uint32_t>(wg) * (64 * kBlockK);
        auto slot_of = [&](int it) {
            return kDiag == kDiagNoLoads ? it % n_pre : static_cast<int>((q0 + static_cast<uint32_t>(it)) % kStages);
        };
        // Wait for stage `it` and issue its 4 wgmmas into pt (one commit group).
        auto issue = [&](float (&pt)[kAcc], int it) {
            const int slot = slot_of(it);
            const uint32_t parity = kDiag == kDiagNoLoads ? 0u : ((q0 + static_cast<uint32_t>(it)) / kStages) & 1u;
            sm90::mbar_wait(full_bar(base, slot), parity);
            if (it == 0) GLM5_SKINNY_MARK(2);  // the first stage has landed (weights + activations)
            const uint32_t a_st = base + a_off + slot * kWStageBytes;
            const uint32_t b_st = base + Smem::kOffX + slot * Smem::kXStageBytes;
            sm90::fence_operands(pt);
            sm90::wgmma_fence();  // pt was read by the previous promotion
#pragma unroll
            for (int kk = 0; kk < 4; ++kk)
                sm90::wgmma_m64k32_e4m3<kTM>(pt, sm90::smem_desc_k128sw(a_st + 32 * kk),
                                             sm90::smem_desc_k128sw(b_st + 32 * kk), kk > 0 ? 1 : 0);
            sm90::wgmma_commit();
        };
        // acc += partial * (xs[token, g] * S[tile, g]); pt[4j + e] is token 8j + 2t + (e & 1).
        auto promote = [&](const float (&pt)[kAcc], int it) {
            const float ws = s_ws[it];
            const float* xs_it = s_xs + it * kTM + 2 * t;
#pragma unroll
            for (int j = 0; j < kNT; ++j) {
                const float2 sx = *reinterpret_cast<const float2*>(xs_it + 8 * j);
                const float s0 = sx.x * ws, s1 = sx.y * ws;
                d[4 * j + 0] = fmaf(pt[4 * j + 0], s0, d[4 * j + 0]);
                d[4 * j + 1] = fmaf(pt[4 * j + 1], s1, d[4 * j + 1]);
                d[4 * j + 2] = fmaf(pt[4 * j + 2], s0, d[4 * j + 2]);
                d[4 * j + 3] = fmaf(pt[4 * j + 3], s1, d[4 * j + 3]);
            }
        };
        // After stage `it`'s group completed: release the stage (this warp's reads are done), promote.
        auto finish = [&](float (&pt)[kAcc], int it) {
            sm90::fence_operands(pt);
            if constexpr (kDiag != kDiagNoLoads) {
                if (lane == 0) sm90::mbar_arrive(empty_bar(base, slot_of(it)));
            }
            promote(pt, it);
        };
        if constexpr (kDiag == kDiagLoadsOnly) {
            for (int it = 0; it < c.nk; ++it) {
                const int slot = it % kStages;
                sm90::mbar_wait(full_bar(base, slot), static_cast<uint32_t>(it / kStages) & 1u);
                const uint32_t wv = *reinterpret_cast<const uint32_t*>(smem + Smem::kOffW + slot * kWStageBytes + tid * 16);
                const uint32_t xv = *reinterpret_cast<const uint32_t*>(
                    smem + Smem::kOffX + slot * Smem::kXStageBytes + (tid % (kTM * 32)) * 4);
                d[0] += __uint_as_float(wv & 0x3f7fffffu);
                d[1] += __uint_as_float(xv & 0x3f7fffffu);
                __syncwarp();
                if (lane == 0) sm90::mbar_arrive(empty_bar(base, slot));
            }
        } else if constexpr (kPipe == 2) {
            float part_b[kAcc];
#pragma unroll
            for (int i = 0; i < kAcc; ++i) part_b[i] = 0.0f;
            for (int it = 0; it < c.nk; it += 2) {
                const bool pair = it + 1 < c.nk;
                issue(part, it);
                if (pair) issue(part_b, it + 1);
                sm90::wgmma_wait<0>();
                finish(part, it);
                if (pair) finish(part_b, it + 1);
            }
        } else if constexpr (kPipe == 0) {
            for (int it = 0; it < c.nk; ++it) {
                issue(part, it);
                sm90::wgmma_wait<0>();
                finish(part, it);
            }
        } else {
            // Stage it+1's wgmmas run while stage it is promoted: after wait_group 0 the partial is
            // copied to plain registers (no wgmma in flight), the next stage is issued into the same
            // partial, and the promotion reads the copy. (Promoting one wgmma partial while another
            // is in flight makes ptxas serialise every wgmma: C7514/C7515.)
            if (c.nk > 0) issue(part, 0);
            for (int it = 0; it < c.nk; ++it) {
                sm90::wgmma_wait<0>();
                sm90::fence_operands(part);
                if constexpr (kDiag != kDiagNoLoads) {
                    if (lane == 0) sm90::mbar_arrive(empty_bar(base, slot_of(it)));
                }
                float cp[kAcc];
#pragma unroll
                for (int i = 0; i < kAcc; ++i) cp[i] = part[i];
                if (it + 1 < c.nk) issue(part, it + 1);
                promote(cp, it);
            }
        }

        GLM5_SKINNY_MARK(3);  // the K loop is done (every stage consumed and promoted)
        to_mma_layout(d, acc, g, t);
        if constexpr (Finish::kRope) ptx::cp_async_wait<0>();  // no copy in flight when a split CTA exits

        if (p.splits == 1) return true;
        if constexpr (kDiag != kDiagOff) return c.split == 0 || acc[0][0] == 1234.5f;  // keep the work alive
        if constexpr (kReduce == 1) return cluster_reduce(smem, tid, acc);
        return Finish::reduce_splits(p, c, Finish::scratch(smem + Smem::kOffScratch), tid, acc);
    }

    // ---- cluster split-K (kReduce == 1) ------------------------------------------------------------
    // Partial of thread (warp, lane), n8 tile j at ring offset ((warp * kNT + j) * 32 + lane) * 16:
    // 128 * kTM * 4 bytes <= the ring (kStages * (16 KB + kTM * 128 B), kStages >= 2, kTM <= 128).
    static_assert(kReduce == 0 || kBlockN * kTM * 4 <= kStages * (kWStageBytes + kTM * kBlockK), "ring too small");
    static GLM5_DEVICE uint32_t partial_addr(uint32_t base, int warp, int j, int lane) {
        return base + Smem::kOffW + static_cast<uint32_t>(((warp * kNT + j) * 32 + lane) * 16);
    }

    // Every consumer thread of every CTA of the cluster; the producer warp runs cluster_producer_sync
    // (the same two cluster barriers). Returns true in rank 0 only (it runs the epilogue).
    static GLM5_DEVICE bool cluster_reduce(uint8_t* smem, int tid, float (&acc)[kNT][4]) {
        const int lane = tid & 31, warp = tid >> 5;
        const uint32_t base = ptx::smem_addr(smem);
        consumer_sync();  // every math warp's wgmmas have read the ring: it may be overwritten
#pragma unroll
        for (int j = 0; j < kNT; ++j) {
            float4* dst = reinterpret_cast<float4*>(smem + (partial_addr(base, warp, j, lane) - base));
            *dst = make_float4(acc[j][0], acc[j][1], acc[j][2], acc[j][3]);
        }
        ptx::cluster_sync();  // 1: every rank's partial is written (release / acquire at cluster scope)
        const uint32_t rank = ptx::cluster_ctarank();
        if (rank == 0) {
#pragma unroll
            for (int j = 0; j < kNT; ++j)
#pragma unroll
                for (int e = 0; e < 4; ++e) acc[j][e] = 0.0f;
            const int splits = static_cast<int>(gridDim.y);  // cluster (1, splits, 1), grid y = splits
            for (int s = 0; s < splits; ++s) {  // fixed order: deterministic, = the global path's sums
#pragma unroll
                for (int j = 0; j < kNT; ++j) {
                    const float4 v = ptx::ld_shared_cluster_f32x4(ptx::mapa_shared(partial_addr(base, warp, j, lane), s));
                    acc[j][0] += v.x;
                    acc[j][1] += v.y;
                    acc[j][2] += v.z;
                    acc[j][3] += v.w;
                }
            }
        }
        ptx::cluster_sync();  // 2: rank 0 has read every peer's smem; the peers may exit
        return rank == 0;
    }

    // The producer warp's side of cluster_reduce (all 32 lanes, after the leader's mainloop).
    static GLM5_DEVICE void cluster_producer_sync() {
        __syncwarp();
        ptx::cluster_sync();
        ptx::cluster_sync();
    }

    // wgmma fragment (rows g, g+8 of the warp's 16) -> mma.sync pairing (rows 2g, 2g+1): row r of the
    // warp lives in lane ((r & 7) << 2 | t) as element 2 * (r >> 3) + (token parity). For rows 2g + h,
    // r >> 3 = g >> 2, so a lane takes element (g >= 4 ? 2 : 0) + q of lane ((2g + h) & 7) << 2 | t.
    static GLM5_DEVICE void to_mma_layout(const float (&d)[kAcc], float (&acc)[kNT][4], int g, int t) {
        const int src0 = (((2 * g) & 7) << 2) | t;
        const int src1 = (((2 * g + 1) & 7) << 2) | t;
        const bool hi = g >= 4;
#pragma unroll
        for (int j = 0; j < kNT; ++j)
#pragma unroll
            for (int q = 0; q < 2; ++q) {
                const float lo0 = __shfl_sync(0xffffffffu, d[4 * j + q], src0);
                const float hi0 = __shfl_sync(0xffffffffu, d[4 * j + 2 + q], src0);
                const float lo1 = __shfl_sync(0xffffffffu, d[4 * j + q], src1);
                const float hi1 = __shfl_sync(0xffffffffu, d[4 * j + 2 + q], src1);
                acc[j][q] = hi ? hi0 : lo0;      // weight row 2g
                acc[j][2 + q] = hi ? hi1 : lo1;  // weight row 2g + 1
            }
    }

    static GLM5_DEVICE void epilogue(const SkinnyParams& p, const Coord& c, uint8_t* smem, int tid,
                                     float (&acc)[kNT][4]) {
        Finish::epilogue(p, c, Finish::scratch(smem + Smem::kOffScratch), tid, acc);
    }
};

}  // namespace skinny
}  // namespace attn_pre
}  // namespace glm5
