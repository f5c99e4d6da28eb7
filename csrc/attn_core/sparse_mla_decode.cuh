// Split-KV sparse MLA decode (single latent KV head, DSA top-k slots), in two tiles:
//
//   SparseMlaSplitTile    one (token t, split s, head block of kHeads) CTA: gathers the split's KV rows,
//                         S = Q K^T, online softmax, O += P V, writes the partial (O / l, lse) to a workspace;
//   SparseMlaCombineTile  one (token t, head h, half of d_v) CTA: merges the splits' partials with
//                         log-sum-exp weights into o (bf16) and lse.
//
// Math (glm5_fastpath.ref.attn_core.sparse_mla_flat): over the valid slots j of token t (0 <= idx < S),
//   o[t, h] = sum_j softmax_j(sm_scale * q[t, h] . kv[idx[t, j]]) * kv[idx[t, j], :kDv]
// with zeros (and lse = -inf) for a token without a valid slot.
//
// Framework-free: raw pointers, bf16 as uint16_t bit patterns.
//
// ---- Split tile ---------------------------------------------------------------------------------------
// Head block kHeads = 16 (one m16 MMA tile), 4 warps. Why 16: the warp's O accumulator lives in registers
// for the whole split. 16 heads x 128 d_v columns per warp = 64 fp32, plus the warp's Q fragments (16 heads
// x 144 dims = 36 regs) and the 16-reg S tile: 178 registers (ptxas), no spills, 128 threads -> 2 CTAs per SM
// by registers and by shared memory. 32 heads would need 128 O registers per thread with 4 warps (spills
// with the Q fragments), or 8 warps at <= 128 registers (2 CTAs/SM) which does not fit the same live set;
// 64 heads only fits with wgmma-style warpgroup accumulators.
//
// Inner block kBlock = 32 slots in a ring of kStages stages of 32 rows x (1152 + 16) B. Rows are padded by
// 16 B so the 8 row addresses of every ldmatrix phase fall in 8 distinct 16-byte bank groups.
// kStages = 2 (SparseMlaSplitTile, the default): double buffering, 93.7 KB, 2 CTAs per SM, one gathered
// block in flight per CTA while the other is computed. kStages = 5 (SparseMlaSplitTileT<5>, 206 KB, 1 CTA per
// SM): four blocks in flight. Why: at 1-8 tokens the split is latency-bound (H200 sweep, 2026-11-29: 29 us at
// T = 8 for 8 blocks per split, ~3 us per block against ~0.5 us of MMA work), and what bounds the blocks in
// flight per SM is shared memory, not the CTA count: 2 CTAs x 1 in flight < 1 CTA x 4. Not yet measured.
//
// S = Q K^T is split over the warps by the 576-dim K axis (warp w owns dims [144w, 144w + 144), its Q
// fragments held in registers): each warp reads the K tile's B fragments once (2 ldmatrix.x4 -> 4 MMAs per
// k-step), then writes its fp32 partial S [16 x 32] to shared memory; after a barrier every warp sums the 4
// partials in the same order (so all warps hold bit-identical S and softmax state) and keeps the whole
// [16 x 32] P in registers: P's C-fragment layout is the A-fragment layout of the P V MMA, so P never goes
// through shared memory. O += P V is split over the warps by d_v columns (warp w owns [128w, 128w + 128),
// V B-fragments by ldmatrix.x4.trans from the same gathered rows).
//
// Online softmax in the log2 domain (x = s * sm_scale * log2 e, exp2 via ex2.approx): running max m and
// sum l per head row; a row whose running max is still -inf uses 0 as the subtrahend, so an all-invalid
// block or split yields p = 0, never exp2(-inf - -inf). P is rounded to bf16 for the MMA and l sums the
// ROUNDED p, so O / l is an exact convex combination of V rows with those weights.
//
// Gather: cp.async.cg 16-byte copies, 4 threads per row (18 copies each); a row whose slot is invalid
// (idx < 0, idx >= num_slots, or past K) is zero-filled (src-size 0), so masked P = 0 meets V = 0, never
// an old NaN left in shared memory. Its score is masked to -inf through the per-block bias row (0 / -inf).
// The next block's index is loaded one iteration ahead, so its latency hides behind the current MMAs.
//
// Per block i: wait for block i (cp.async group accounting: one group per block, committed in order), barrier
// A (block i landed for every thread; every warp is done with block i - 1, so its stage is free) -> issue
// block i + kStages - 1 into that stage, S partial, barrier B (partials visible), reduce + softmax + P V.
// The slot index of a block is loaded one block before its gather is issued, so its latency hides too.
//
// Partial output: o_part[t][s][h][0:kDv] = O / l (fp32, zeros when l = 0), lse_part[t][s][h] = natural-log
// log-sum-exp of the split's scaled scores (-inf when empty).
//
// ---- Combine tile -------------------------------------------------------------------------------------
// 256 threads = 4 split groups x 64 column lanes of float4 (256 columns, one half of d_v). lse of every
// split -> shared memory; M = max; w_i = exp(lse_i - M); each thread sums w_i * O_i over the splits
// i = group (mod 4) with w_i > 0, then the 4 groups are added in a fixed order: deterministic.
#pragma once

#include "../common/arch.cuh"
#include "../common/cluster.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/sm90_mbarrier.cuh"
#include "../common/sm90_tma.cuh"
#include "../common/sm90_wgmma.cuh"
#include "../common/sm90_wgmma_bf16.cuh"

namespace glm5 {
namespace attn_core {

// ldmatrix.x4 without .trans (the common header has only the transposed form): lane (g, t) receives
// M_i[g][2t..2t+1] of matrix i in register i.
GLM5_DEVICE void ldmatrix_x4(uint32_t (&r)[4], uint32_t smem_row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row_addr)
                 : "memory");
}

// 2^x, ~2 ulp; ex2(-inf) = +0. P is rounded to bf16 right after, so the approximation is invisible.
GLM5_DEVICE float ex2(float x) {
    float y;
    asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
    return y;
}

struct SparseMlaParams {
    const uint16_t* q;        // [T, H, kDqk] bf16, rows q_stride_h apart, tokens q_stride_t apart
    const uint16_t* kv;       // [num_slots, kDqk] bf16, rows kv_stride apart
    const int32_t* indices;   // [T, K] int32, rows idx_stride apart
    float* o_part;            // [T, num_splits, H, kDv] fp32
    float* lse_part;          // [T, num_splits, H] fp32
    int64_t q_stride_t, q_stride_h, kv_stride, idx_stride;  // elements
    int64_t num_slots;        // S
    int32_t topk;             // K
    int32_t num_splits;
    int32_t num_heads;        // H
    float scale_log2;         // sm_scale * log2(e)
    // wgmma tile only (SparseMlaSplitWgmmaTileT::cluster_epilogue): the splits of a token are merged in clusters of
    // `cluster` CTAs through distributed shared memory; when one cluster holds all of them the merged rows are the
    // final o / lse, else cluster s / cluster writes partial s / cluster of num_splits / cluster.
    uint16_t* o = nullptr;    // [T, H, kDv] bf16
    float* lse_out = nullptr; // [T, H] fp32 or null
    int32_t cluster = 1;
};

template <int kStages_>
struct SparseMlaSplitTileT {
    static constexpr int kStages = kStages_;                // gather ring depth (see the header)
    static constexpr int kDqk = 576;
    static constexpr int kDv = 512;
    static constexpr int kHeads = 16;                       // HB (see the header)
    static constexpr int kBlock = 32;                       // slots per inner iteration
    static constexpr int kWarps = 4;
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kMaxTopk = 2048;
    static constexpr int kMaxSplits = kMaxTopk / kBlock;    // 64: the combine's shared lse array
    static constexpr int kRowBytes = kDqk * 2 + 16;         // padded smem row (1168 B)
    static constexpr int kRowChunks = kDqk * 2 / 16;        // 72 16-byte pieces per row
    static constexpr int kKSteps = kDqk / 16;               // 36
    static constexpr int kKStepsPerWarp = kKSteps / kWarps; // 9
    static constexpr int kDvPerWarp = kDv / kWarps;         // 128
    static constexpr int kDvTiles = kDvPerWarp / 8;         // 16 n8 tiles
    static constexpr int kSTiles = kBlock / 8;              // 4 n8 tiles of S
    static constexpr int kRedStride = kBlock + 8;           // floats per partial-S row (bank spread)
    static constexpr int kStageBytes = kBlock * kRowBytes;  // 37376
    static constexpr int kQBytes = kHeads * kRowBytes;      // 18688
    static constexpr int kRedBytes = kWarps * kHeads * kRedStride * 4;  // 10240, aliases the Q area
    static constexpr int kSmemBytes = kStages * kStageBytes + kQBytes + kStages * kBlock * 4;  // 93696 at 2
    static constexpr int kMinBlocksPerSm = kSmemBytes <= 100 * 1024 ? 2 : 1;
    static constexpr int kGatherThreadsPerRow = kThreads / kBlock;               // 4
    static constexpr int kGatherPerThread = kRowChunks / kGatherThreadsPerRow;  // 18
    static constexpr int kQThreadsPerRow = kThreads / kHeads;                    // 8
    static constexpr int kQPerThread = kRowChunks / kQThreadsPerRow;             // 9

    static_assert(kKSteps % kWarps == 0 && kDv % (kWarps * 16) == 0, "warp split of D and d_v");
    static_assert(kThreads % kBlock == 0 && kRowChunks % kGatherThreadsPerRow == 0, "gather split");
    static_assert(kThreads % kHeads == 0 && kRowChunks % kQThreadsPerRow == 0, "Q load split");
    static_assert(kRedBytes <= kQBytes, "partial-S buffer aliases the Q staging area");
    static_assert(kRowBytes % 128 == 16, "row pad: 8 consecutive rows in 8 distinct 16-byte bank groups");
    static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "ring depth: >= 2 stages, <= 227 KB per CTA");
    static_assert(kStages != 2 || kMinBlocksPerSm == 2, "double buffering keeps 2 CTAs per SM");

    // Shared memory: [stage 0 | ... | stage kStages-1 | Q staging, then the partial-S buffer |
    // bias kStages x kBlock fp32].
    // Stage addresses are computed, not taken from an array (a dynamically indexed array goes to the stack).
    static GLM5_DEVICE uint8_t* stage_ptr(uint8_t* smem, int st) { return smem + st * kStageBytes; }
    static GLM5_DEVICE uint8_t* q_ptr(uint8_t* smem) { return smem + kStages * kStageBytes; }
    static GLM5_DEVICE float* bias_ptr(uint8_t* smem, int st) {
        return reinterpret_cast<float*>(smem + kStages * kStageBytes + kQBytes) + st * kBlock;
    }

    // Slot id of this thread's gather row in block `blk`, -1 when that position is past the split / K.
    static GLM5_DEVICE int32_t load_index(const int32_t* idx_row, int blk, int blk_end, int row, int topk) {
        const int pos = blk * kBlock + row;
        if (blk >= blk_end || pos >= topk) return -1;
        return ptx::ld_global_s32(idx_row + pos);
    }

    // Gather block rows into `stage`: thread owns row tid / 4 and pieces (tid % 4) + 4i.
    static GLM5_DEVICE void issue_block(const SparseMlaParams& p, uint8_t* stage, float* bias, int32_t slot,
                                        int tid) {
        const int row = tid / kGatherThreadsPerRow;
        const int part = tid % kGatherThreadsPerRow;
        const bool valid = slot >= 0 && static_cast<int64_t>(slot) < p.num_slots;
        const uint16_t* src = valid ? p.kv + static_cast<int64_t>(slot) * p.kv_stride : p.kv;
        const uint32_t bytes = valid ? 16u : 0u;
        const uint32_t dst = ptx::smem_addr(stage + row * kRowBytes);
#pragma unroll
        for (int i = 0; i < kGatherPerThread; ++i) {
            const int c = part + kGatherThreadsPerRow * i;
            ptx::cp_async_16(dst + c * 16, src + (valid ? c * 8 : 0), bytes);
        }
        if (part == 0) bias[row] = valid ? 0.0f : -INFINITY;
    }

    // Call after griddepcontrol.wait. t / split / hblk: the CTA's coordinates.
    static GLM5_DEVICE void run(uint8_t* smem_raw, const SparseMlaParams& p, int t, int split, int hblk, int tid) {
        const int warp = tid / 32, lane = tid % 32;
        const int g = lane / 4, tq = lane % 4;
        const int nblocks = (p.topk + kBlock - 1) / kBlock;
        const int bps = (nblocks + p.num_splits - 1) / p.num_splits;
        const int blk_begin = min(split * bps, nblocks);
        const int blk_end = min(blk_begin + bps, nblocks);
        const int h0 = hblk * kHeads;
        const int32_t* idx_row = p.indices + static_cast<int64_t>(t) * p.idx_stride;
        const int grow = tid / kGatherThreadsPerRow;

        // Q rows (group 0), blocks 0 .. kStages-2 (groups 1 .. kStages-1), the next block's index in flight.
        {
            const int r = tid / kQThreadsPerRow, part = tid % kQThreadsPerRow;
            const uint16_t* src = p.q + static_cast<int64_t>(t) * p.q_stride_t + static_cast<int64_t>(h0 + r) * p.q_stride_h;
            const uint32_t dst = ptx::smem_addr(q_ptr(smem_raw) + r * kRowBytes);
#pragma unroll
            for (int i = 0; i < kQPerThread; ++i) {
                const int c = part + kQThreadsPerRow * i;
                ptx::cp_async_16(dst + c * 16, src + c * 8, 16u);
            }
            ptx::cp_async_commit();
        }
        // every prologue block's index first (independent loads in flight together), then the gathers
        int32_t slot_pro[kStages - 1];
#pragma unroll
        for (int j = 0; j < kStages - 1; ++j) slot_pro[j] = load_index(idx_row, blk_begin + j, blk_end, grow, p.topk);
#pragma unroll
        for (int j = 0; j < kStages - 1; ++j) {
            if (blk_begin + j < blk_end) issue_block(p, stage_ptr(smem_raw, j), bias_ptr(smem_raw, j), slot_pro[j], tid);
            ptx::cp_async_commit();  // one group per block, empty past the split: the accounting stays uniform
        }
        int32_t slot_next = load_index(idx_row, blk_begin + kStages - 1, blk_end, grow, p.topk);

        // Per-lane ldmatrix offsets (bytes). A (Q, row-major 16x16): matrices (rows 0-7 | 8-15) x (k 0-7 | 8-15).
        const uint32_t a_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + 16 * (lane >> 4);
        // B of S (K rows = slots): matrices (slots 0-7, k 0-7), (slots 0-7, k 8-15), (slots 8-15, ...).
        const uint32_t k_off = (8 * (lane >> 4) + (lane & 7)) * kRowBytes + 16 * ((lane >> 3) & 1);
        // B of P V (.trans; V rows = slots): (slots 0-7, cols 0-7), (slots 8-15, cols 0-7), (0-7, 8-15), ...
        const uint32_t v_off = ((lane & 7) + 8 * ((lane >> 3) & 1)) * kRowBytes + 16 * (lane >> 4) + warp * kDvPerWarp * 2;

        ptx::cp_async_wait<kStages - 1>();  // Q landed (the kStages - 1 block groups may still be in flight)
        __syncthreads();
        uint32_t qf[kKStepsPerWarp][4];
        {
            const uint32_t base = ptx::smem_addr(q_ptr(smem_raw)) + a_off + warp * kKStepsPerWarp * 32;
#pragma unroll
            for (int kk = 0; kk < kKStepsPerWarp; ++kk) ldmatrix_x4(qf[kk], base + kk * 32);
        }

        float o[kDvTiles][4];
#pragma unroll
        for (int n = 0; n < kDvTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY};
        float l[2] = {0.0f, 0.0f};  // this lane's share of the row sums (quad-reduced at the end)
        float* red = reinterpret_cast<float*>(q_ptr(smem_raw));

        for (int blk = blk_begin; blk < blk_end; ++blk) {
            const int i = blk - blk_begin;
            const int st = static_cast<int>(static_cast<unsigned>(i) % kStages);
            ptx::cp_async_wait<kStages - 2>();  // block blk landed (blocks blk+1 .. blk+kStages-2 may not have)
            __syncthreads();  // A: block blk visible; every warp is done with block blk - 1 and the partials
            {
                const int nst = static_cast<int>(static_cast<unsigned>(i + kStages - 1) % kStages);  // block blk - 1's stage, free after barrier A
                if (blk + kStages - 1 < blk_end)
                    issue_block(p, stage_ptr(smem_raw, nst), bias_ptr(smem_raw, nst), slot_next, tid);
                ptx::cp_async_commit();
                slot_next = load_index(idx_row, blk + kStages, blk_end, grow, p.topk);
            }

            // ---- partial S over this warp's 144 dims ----
            float s[kSTiles][4];
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
            const uint32_t kbase = ptx::smem_addr(stage_ptr(smem_raw, st)) + k_off + warp * kKStepsPerWarp * 32;
#pragma unroll
            for (int kk = 0; kk < kKStepsPerWarp; ++kk) {
                uint32_t b01[4], b23[4];
                ldmatrix_x4(b01, kbase + kk * 32);
                ldmatrix_x4(b23, kbase + 16 * kRowBytes + kk * 32);
                ptx::mma_m16n8k16_bf16(s[0], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b01[0], b01[1]);
                ptx::mma_m16n8k16_bf16(s[1], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b01[2], b01[3]);
                ptx::mma_m16n8k16_bf16(s[2], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b23[0], b23[1]);
                ptx::mma_m16n8k16_bf16(s[3], qf[kk][0], qf[kk][1], qf[kk][2], qf[kk][3], b23[2], b23[3]);
            }
            {
                float* mine = red + warp * kHeads * kRedStride;
#pragma unroll
                for (int j = 0; j < kSTiles; ++j) {
                    *reinterpret_cast<float2*>(mine + g * kRedStride + 8 * j + 2 * tq) = make_float2(s[j][0], s[j][1]);
                    *reinterpret_cast<float2*>(mine + (g + 8) * kRedStride + 8 * j + 2 * tq) = make_float2(s[j][2], s[j][3]);
                }
            }
            __syncthreads();  // B: every warp's partial S is visible

            // ---- full S (same order in every warp), masked, scaled to log2 units ----
            float x[kSTiles][4];
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) {
                float2 lo = *reinterpret_cast<const float2*>(red + g * kRedStride + 8 * j + 2 * tq);
                float2 hi = *reinterpret_cast<const float2*>(red + (g + 8) * kRedStride + 8 * j + 2 * tq);
#pragma unroll
                for (int w = 1; w < kWarps; ++w) {
                    const float* pw = red + w * kHeads * kRedStride;
                    const float2 a = *reinterpret_cast<const float2*>(pw + g * kRedStride + 8 * j + 2 * tq);
                    const float2 b = *reinterpret_cast<const float2*>(pw + (g + 8) * kRedStride + 8 * j + 2 * tq);
                    lo.x += a.x; lo.y += a.y; hi.x += b.x; hi.y += b.y;
                }
                const float2 bias = *reinterpret_cast<const float2*>(bias_ptr(smem_raw, st) + 8 * j + 2 * tq);
                x[j][0] = bias.x == 0.0f ? lo.x * p.scale_log2 : -INFINITY;
                x[j][1] = bias.y == 0.0f ? lo.y * p.scale_log2 : -INFINITY;
                x[j][2] = bias.x == 0.0f ? hi.x * p.scale_log2 : -INFINITY;
                x[j][3] = bias.y == 0.0f ? hi.y * p.scale_log2 : -INFINITY;
            }

            // ---- online softmax: rows g (r = 0) and g + 8 (r = 1) ----
            float alpha[2], muse[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < kSTiles; ++j) mx = fmaxf(mx, fmaxf(x[j][2 * r], x[j][2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[r], mx);
                muse[r] = mnew == -INFINITY ? 0.0f : mnew;  // all -inf so far: p = 0, not NaN
                alpha[r] = ex2(m[r] - muse[r]);
                m[r] = mnew;
            }
            uint32_t pk[kSTiles][2];  // bf16 pairs: [j][0] row g, [j][1] row g + 8
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < kSTiles; ++j) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t v = ptx::f32x2_to_bf16x2_rn(ex2(x[j][2 * r] - muse[r]), ex2(x[j][2 * r + 1] - muse[r]));
                    pk[j][r] = v;
                    rs[r] += ptx::bf16lo_to_f32(v) + ptx::bf16hi_to_f32(v);
                }
            }
            l[0] = l[0] * alpha[0] + rs[0];
            l[1] = l[1] * alpha[1] + rs[1];
#pragma unroll
            for (int n = 0; n < kDvTiles; ++n) {
                o[n][0] *= alpha[0]; o[n][1] *= alpha[0];
                o[n][2] *= alpha[1]; o[n][3] *= alpha[1];
            }

            // ---- O += P V over this warp's 128 columns ----
            const uint32_t vbase = ptx::smem_addr(stage_ptr(smem_raw, st)) + v_off;
#pragma unroll
            for (int kk = 0; kk < kBlock / 16; ++kk) {
                const uint32_t a0 = pk[2 * kk][0], a1 = pk[2 * kk][1], a2 = pk[2 * kk + 1][0], a3 = pk[2 * kk + 1][1];
#pragma unroll
                for (int pp = 0; pp < kDvTiles / 2; ++pp) {
                    uint32_t b[4];
                    ptx::ldmatrix_x4_trans(b, vbase + kk * 16 * kRowBytes + pp * 32);
                    ptx::mma_m16n8k16_bf16(o[2 * pp], a0, a1, a2, a3, b[0], b[1]);
                    ptx::mma_m16n8k16_bf16(o[2 * pp + 1], a0, a1, a2, a3, b[2], b[3]);
                }
            }
        }

        // ---- partial out: O / l and the split's lse ----
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        const float inv0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f;
        const float inv1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
        const int64_t row0 = (static_cast<int64_t>(t) * p.num_splits + split) * p.num_heads + h0;
        float* out0 = p.o_part + (row0 + g) * kDv + warp * kDvPerWarp + 2 * tq;
        float* out1 = out0 + 8 * kDv;
#pragma unroll
        for (int n = 0; n < kDvTiles; ++n) {
            *reinterpret_cast<float2*>(out0 + 8 * n) = make_float2(o[n][0] * inv0, o[n][1] * inv0);
            *reinterpret_cast<float2*>(out1 + 8 * n) = make_float2(o[n][2] * inv1, o[n][3] * inv1);
        }
        if (warp == 0 && tq == 0) {
            constexpr float kLn2 = 0.693147180559945309f;
            p.lse_part[row0 + g] = l[0] > 0.0f ? (m[0] + log2f(l[0])) * kLn2 : -INFINITY;
            p.lse_part[row0 + g + 8] = l[1] > 0.0f ? (m[1] + log2f(l[1])) * kLn2 : -INFINITY;
        }
    }
};

using SparseMlaSplitTile = SparseMlaSplitTileT<2>;

// ---- Split tile, 64 heads on wgmma (sm_90a) -----------------------------------------------------------
// The same (token, split) work and the same partial-output contract as SparseMlaSplitTileT (32-slot blocks,
// the same split boundaries, o_part / lse_part rows), for a head block of 64: one CTA gathers each KV row
// ONCE for all 64 heads (the m16 tile gathers it once per 16 heads, 4x the L2 -> SM traffic at H = 64) and
// runs both products on warpgroup MMAs instead of m16n8k16 chains.
//
// 256 threads = 2 warpgroups (WG w = tid / 128). Shared memory, 1024-byte aligned pieces:
//   Q      [64 heads x 576] bf16, K-major, 128B-swizzled, 9 chunks of [64 rows x 64 dims] (8 KB each)
//   ring   kStages x [32 slots x 576] bf16 in 9 chunks of [32 rows x 64 dims] (4 KB each), same layout
//   xchg   the two warpgroups' partial S tiles (2 x 4 float4 x 128 threads, 16 KB)
//   bias   kStages x 32 fp32 (0 or -inf per slot)
// Per 32-slot block:
//   S = Q K^T split over the 576-dim K axis: WG w issues k steps [18w, 18w + 18) (m64n32k16, A = Q and
//       B = the block, both from shared memory), writes its fp32 partial to xchg, and after one barrier
//       adds the other warpgroup's: own + other is the same IEEE sum in both warpgroups (a + b == b + a),
//       so both hold bit-identical S and run the identical online softmax (log2 domain, as above).
//   O += P V split over d_v: WG w owns columns [256w, 256w + 256) (m64n256k16, 128 fp32 accumulators per
//       thread), A = P straight from registers (the S accumulator layout is the m16n8k16 A layout), B = the
//       same gathered rows read MN-major: a 64-column chunk of the K-major ring tile is the 128B-swizzled
//       MN-major layout with LBO = one chunk (4 KB) and SBO = 8 rows (1 KB).
//   P V of block i is left in flight; the wgmma_wait<0> after block i + 1's S retires it, before O is
//   rescaled (skipped for a warp whose rows' maxima did not move: x 1.0 is exact). The gather of block
//   i + kStages - 1 (into block i - 1's stage) is issued only after the exchange barrier of block i, when
//   both warpgroups have retired block i - 1's P V.
// kStages = 4 (kXchgInStage): the 16 KB exchange buffer is dropped for a 4th ring stage (3 blocks in flight).
//   The partials go into block i - 1's stage instead: WG w writes its 8 KB into chunks [4w, 4w + 2), which only
//   WG w's own (retired) P V of block i - 1 read; a second barrier after the exchange reads keeps the
//   gather of block i + 3 into that stage behind them.
// cp.async writes are made visible to the async proxy (wgmma) by fence.proxy.async before the barrier.
template <int kStages_>
struct SparseMlaSplitWgmmaTileT {
    static constexpr int kStages = kStages_;
    static constexpr int kDqk = 576;
    static constexpr int kDv = 512;
    static constexpr int kHeads = 64;
    static constexpr int kBlock = 32;
    static constexpr int kThreads = 256;
    static constexpr int kWgThreads = 128;
    static constexpr int kMaxTopk = 2048;
    static constexpr int kMaxSplits = kMaxTopk / kBlock;
    static constexpr int kChunks = kDqk / 64;                  // 9 K-major 64-dim chunks
    static constexpr int kKSteps = kDqk / 16;                  // 36 (m64nNk16)
    static constexpr int kKStepsPerWg = kKSteps / 2;           // 18
    static constexpr int kDvPerWg = kDv / 2;                   // 256
    static constexpr int kSRegs = kBlock / 2;                  // 16 fp32 (m64n32)
    static constexpr int kORegs = kDvPerWg / 2;                // 128 fp32 (m64n256)
    static constexpr int kQChunkBytes = kHeads * 128;          // 8192
    static constexpr int kKvChunkBytes = kBlock * 128;         // 4096
    static constexpr int kQBytes = kChunks * kQChunkBytes;     // 73728
    static constexpr int kStageBytes = kChunks * kKvChunkBytes;  // 36864
    static constexpr bool kXchgInStage = kStages >= 4;
    static constexpr int kXchgBytes = kXchgInStage ? 0 : 2 * (kSRegs / 4) * kWgThreads * 16;  // 16384 at 3 stages
    static constexpr int kOffRing = kQBytes;
    static constexpr int kOffXchg = kOffRing + kStages * kStageBytes;
    static constexpr int kOffBias = kOffXchg + kXchgBytes;
    static constexpr int kSmemUsed = kOffBias + kStages * kBlock * 4;
    static constexpr int kSmemBytes = kSmemUsed + 1024;        // + slack to align the base to 1024 bytes
    static constexpr int kGatherThreadsPerRow = kThreads / kBlock;  // 8: thread part p copies piece p of each chunk
    static constexpr int kQThreadsPerRow = kThreads / kHeads;      // 4

    static_assert(kStages >= 2 && kSmemBytes <= 227 * 1024, "ring depth: >= 2 stages in 227 KB");
    static_assert(kGatherThreadsPerRow == 8, "one 16-byte piece of every chunk per gather thread");
    static_assert(kQBytes % 1024 == 0 && kStageBytes % 1024 == 0 && kXchgBytes % 1024 == 0, "1 KB aligned pieces");
    static_assert((kSRegs / 4) * kWgThreads * 16 <= 2 * kKvChunkBytes, "a warpgroup's partial fits in 2 chunks");

    static GLM5_DEVICE int32_t load_index(const int32_t* idx_row, int blk, int blk_end, int row, int topk) {
        const int pos = blk * kBlock + row;
        if (blk >= blk_end || pos >= topk) return -1;
        return ptx::ld_global_s32(idx_row + pos);
    }

    // Gather one block's rows into `stage` (K-major, swizzled): thread (row = tid / 8, part = tid % 8)
    // copies 16-byte piece `part` of each of the row's 9 chunks; invalid rows are zero-filled.
    static GLM5_DEVICE void issue_block(const SparseMlaParams& p, uint32_t stage, float* bias, int32_t slot, int tid) {
        const int row = tid / kGatherThreadsPerRow;
        const int part = tid % kGatherThreadsPerRow;
        const bool valid = slot >= 0 && static_cast<int64_t>(slot) < p.num_slots;
        const uint16_t* src = valid ? p.kv + static_cast<int64_t>(slot) * p.kv_stride + part * 8 : p.kv;
        const uint32_t bytes = valid ? 16u : 0u;
        const uint32_t dst = stage + row * 128 + ((part ^ (row & 7)) << 4);
#pragma unroll
        for (int c = 0; c < kChunks; ++c) ptx::cp_async_16(dst + c * kKvChunkBytes, src + (valid ? c * 64 : 0), bytes);
        if (part == 0) bias[row] = valid ? 0.0f : -INFINITY;
    }

    // Call after griddepcontrol.wait. t / split / hblk: the CTA's coordinates (hblk: 64-head block).
    static GLM5_DEVICE void run(uint8_t* smem_raw, const SparseMlaParams& p, int t, int split, int hblk, int tid) {
        uint8_t* smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
        const uint32_t sbase = ptx::smem_addr(smem);
        const uint32_t q_s = sbase;
        const uint32_t ring_s = sbase + kOffRing;
        float4* xchg = reinterpret_cast<float4*>(smem + kOffXchg);
        float* bias_all = reinterpret_cast<float*>(smem + kOffBias);

        const int wg = tid / kWgThreads, wtid = tid % kWgThreads;
        const int lane = tid % 32, warp4 = wtid / 32;
        const int g = lane / 4, tq = lane % 4;
        const int nblocks = (p.topk + kBlock - 1) / kBlock;
        const int bps = (nblocks + p.num_splits - 1) / p.num_splits;
        const int blk_begin = min(split * bps, nblocks);
        const int blk_end = min(blk_begin + bps, nblocks);
        const int h0 = hblk * kHeads;
        const int32_t* idx_row = p.indices + static_cast<int64_t>(t) * p.idx_stride;
        const int grow = tid / kGatherThreadsPerRow;

        // Q (group 0): row r = tid / 4 (a head), pieces c = part + 4i of its 72.
        {
            const int r = tid / kQThreadsPerRow, part = tid % kQThreadsPerRow;
            const uint16_t* src = p.q + static_cast<int64_t>(t) * p.q_stride_t + static_cast<int64_t>(h0 + r) * p.q_stride_h;
#pragma unroll
            for (int i = 0; i < kChunks * 8 / kQThreadsPerRow; ++i) {
                const int c = part + kQThreadsPerRow * i;
                const int kc = c / 8, c16 = c % 8;
                ptx::cp_async_16(q_s + kc * kQChunkBytes + r * 128 + ((c16 ^ (r & 7)) << 4), src + c * 8, 16u);
            }
            ptx::cp_async_commit();
        }
        int32_t slot_pro[kStages - 1];
#pragma unroll
        for (int j = 0; j < kStages - 1; ++j) slot_pro[j] = load_index(idx_row, blk_begin + j, blk_end, grow, p.topk);
#pragma unroll
        for (int j = 0; j < kStages - 1; ++j) {
            if (blk_begin + j < blk_end) issue_block(p, ring_s + j * kStageBytes, bias_all + j * kBlock, slot_pro[j], tid);
            ptx::cp_async_commit();
        }
        int32_t slot_next = load_index(idx_row, blk_begin + kStages - 1, blk_end, grow, p.topk);

        float o[kORegs];
#pragma unroll
        for (int i = 0; i < kORegs; ++i) o[i] = 0.0f;
        float m[2] = {-INFINITY, -INFINITY};
        float l[2] = {0.0f, 0.0f};

        for (int blk = blk_begin; blk < blk_end; ++blk) {
            const int i = blk - blk_begin;
            const int st = static_cast<int>(static_cast<unsigned>(i) % kStages);
            const uint32_t stage_s = ring_s + st * kStageBytes;
            ptx::cp_async_wait<kStages - 2>();  // Q and block blk landed (this thread's copies)
            sm90::fence_proxy_async_smem();     // ... and visible to wgmma after the barrier
            __syncthreads();                    // A

            // ---- partial S over this warpgroup's 18 k steps ----
            float s[kSRegs];
#pragma unroll
            for (int r = 0; r < kSRegs; ++r) s[r] = 0.0f;
            sm90::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kKStepsPerWg; ++kk) {
                const int ks = wg * kKStepsPerWg + kk;
                const uint32_t off_q = (ks / 4) * kQChunkBytes + (ks % 4) * 32;
                const uint32_t off_k = (ks / 4) * kKvChunkBytes + (ks % 4) * 32;
                sm90::wgmma_m64n32k16_bf16_ss(s, sm90::smem_desc_k128sw(q_s + off_q), sm90::smem_desc_k128sw(stage_s + off_k),
                                              kk > 0 ? 1 : 0);
            }
            sm90::wgmma_commit();
            sm90::wgmma_wait<0>();  // this S, and the previous block's P V
            sm90::fence_operands(s);
            sm90::fence_operands(o);
            const int nst = static_cast<int>(static_cast<unsigned>(i + kStages - 1) % kStages);  // block blk - 1's stage
            // partial slots: WG w's 8 KB at mine, the other's at theirs (see the header for the in-stage layout)
            float4* mine;
            const float4* theirs;
            if constexpr (kXchgInStage) {
                uint8_t* xs = smem + kOffRing + nst * kStageBytes;
                mine = reinterpret_cast<float4*>(xs + wg * 4 * kKvChunkBytes);
                theirs = reinterpret_cast<const float4*>(xs + (1 - wg) * 4 * kKvChunkBytes);
            } else {
                mine = xchg + wg * (kSRegs / 4) * kWgThreads;
                theirs = xchg + (1 - wg) * (kSRegs / 4) * kWgThreads;
            }
#pragma unroll
            for (int q4 = 0; q4 < kSRegs / 4; ++q4)
                mine[q4 * kWgThreads + wtid] = make_float4(s[4 * q4], s[4 * q4 + 1], s[4 * q4 + 2], s[4 * q4 + 3]);
            __syncthreads();  // X: both partials visible; both warpgroups retired block blk - 1's P V
            float4 other[kSRegs / 4];
#pragma unroll
            for (int q4 = 0; q4 < kSRegs / 4; ++q4) other[q4] = theirs[q4 * kWgThreads + wtid];
            if constexpr (kXchgInStage) __syncthreads();  // Y: every exchange read done before the stage is refilled

            {   // block blk + kStages - 1 into block blk - 1's stage
                if (blk + kStages - 1 < blk_end)
                    issue_block(p, ring_s + nst * kStageBytes, bias_all + nst * kBlock, slot_next, tid);
                ptx::cp_async_commit();
                slot_next = load_index(idx_row, blk + kStages, blk_end, grow, p.topk);
            }

            // ---- full S (own + other), masked, scaled to log2 units ----
            const float* bias = bias_all + st * kBlock;
            float x[kSRegs];
#pragma unroll
            for (int q4 = 0; q4 < kSRegs / 4; ++q4) {
                const float4 ot = other[q4];
                const float2 b = *reinterpret_cast<const float2*>(bias + 8 * q4 + 2 * tq);
                x[4 * q4 + 0] = b.x == 0.0f ? (s[4 * q4 + 0] + ot.x) * p.scale_log2 : -INFINITY;
                x[4 * q4 + 1] = b.y == 0.0f ? (s[4 * q4 + 1] + ot.y) * p.scale_log2 : -INFINITY;
                x[4 * q4 + 2] = b.x == 0.0f ? (s[4 * q4 + 2] + ot.z) * p.scale_log2 : -INFINITY;
                x[4 * q4 + 3] = b.y == 0.0f ? (s[4 * q4 + 3] + ot.w) * p.scale_log2 : -INFINITY;
            }

            // ---- online softmax: rows g (r = 0) and g + 8 (r = 1) of this warp's 16 ----
            float alpha[2], muse[2];
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                float mx = -INFINITY;
#pragma unroll
                for (int j = 0; j < kBlock / 8; ++j) mx = fmaxf(mx, fmaxf(x[4 * j + 2 * r], x[4 * j + 2 * r + 1]));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
                mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
                const float mnew = fmaxf(m[r], mx);
                muse[r] = mnew == -INFINITY ? 0.0f : mnew;
                alpha[r] = ex2(m[r] - muse[r]);
                m[r] = mnew;
            }
            uint32_t pk[kBlock / 8][2];
            float rs[2] = {0.0f, 0.0f};
#pragma unroll
            for (int j = 0; j < kBlock / 8; ++j) {
#pragma unroll
                for (int r = 0; r < 2; ++r) {
                    const uint32_t v = ptx::f32x2_to_bf16x2_rn(ex2(x[4 * j + 2 * r] - muse[r]), ex2(x[4 * j + 2 * r + 1] - muse[r]));
                    pk[j][r] = v;
                    rs[r] += ptx::bf16lo_to_f32(v) + ptx::bf16hi_to_f32(v);
                }
            }
            l[0] = l[0] * alpha[0] + rs[0];
            l[1] = l[1] * alpha[1] + rs[1];
            if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {  // warp-uniform; x 1.0 is exact
#pragma unroll
                for (int j = 0; j < kORegs / 4; ++j) {
                    o[4 * j + 0] *= alpha[0]; o[4 * j + 1] *= alpha[0];
                    o[4 * j + 2] *= alpha[1]; o[4 * j + 3] *= alpha[1];
                }
            }

            // ---- O += P V over this warpgroup's 256 columns (left in flight) ----
            sm90::wgmma_fence();
#pragma unroll
            for (int kk = 0; kk < kBlock / 16; ++kk) {
                const uint32_t a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
                const uint32_t vb = stage_s + (wg * (kDvPerWg / 64)) * kKvChunkBytes + kk * 16 * 128;
                sm90::wgmma_m64n256k16_bf16_rs_tb(o, a, sm90::smem_desc_mn128sw(vb, kKvChunkBytes, 1024), 1);
            }
            sm90::wgmma_commit();
        }
        sm90::wgmma_wait<0>();
        sm90::fence_operands(o);

        // ---- partial out: O / l (this warpgroup's 256 columns) and the split's lse ----
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
            l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        }
        if (p.cluster > 1) {
            cluster_epilogue(smem, p, o, m, l, t, split, h0, tid);
            return;
        }
        const float inv0 = l[0] > 0.0f ? 1.0f / l[0] : 0.0f;
        const float inv1 = l[1] > 0.0f ? 1.0f / l[1] : 0.0f;
        const int hrow = warp4 * 16 + g;
        const int64_t row0 = (static_cast<int64_t>(t) * p.num_splits + split) * p.num_heads + h0 + hrow;
        float* out0 = p.o_part + row0 * kDv + wg * kDvPerWg + 2 * tq;
        float* out1 = out0 + 8 * kDv;
#pragma unroll
        for (int j = 0; j < kORegs / 4; ++j) {
            *reinterpret_cast<float2*>(out0 + 8 * j) = make_float2(o[4 * j + 0] * inv0, o[4 * j + 1] * inv0);
            *reinterpret_cast<float2*>(out1 + 8 * j) = make_float2(o[4 * j + 2] * inv1, o[4 * j + 3] * inv1);
        }
        if (wg == 0 && tq == 0) {
            constexpr float kLn2 = 0.693147180559945309f;
            p.lse_part[row0] = l[0] > 0.0f ? (m[0] + log2f(l[0])) * kLn2 : -INFINITY;
            p.lse_part[row0 + 8] = l[1] > 0.0f ? (m[1] + log2f(l[1])) * kLn2 : -INFINITY;
        }
    }

    // ---- cluster merge (p.cluster = C > 1 CTAs of consecutive splits per cluster) ----
    // 1. every CTA publishes its rows' running max m and sum l (log2 domain) in shared memory; cluster barrier;
    // 2. every thread computes, for its two rows, M = max_c m_c and L = sum_c l_c 2^(m_c - M) over ranks c = 0..C-1
    //    in order (the same bits in every CTA), scales its O by 2^(m - M) / L and stores it in shared memory
    //    ([64 rows][kObufStride] fp32 over the free Q / ring area); cluster barrier;
    // 3. rank r sums rows [r 64 / C, (r + 1) 64 / C) over the C CTAs' buffers (DSMEM, ranks in order) and writes
    //    them: the final bf16 o and lse when the cluster holds every split of the token, else the cluster's
    //    normalised partial (O / L, lse = (M + log2 L) ln 2) at partial index split / C of num_splits / C;
    //    a last cluster barrier keeps every buffer alive until its readers are done.
    // Replaces the fp32 partial round trip through global memory (T x splits x 64 x 2 KB) for the splits inside a
    // cluster. An all-empty cluster (M = -inf) gives zeros and lse = -inf, like the combine.
    static constexpr int kMaxCluster = 8;        // the portable cluster size limit (the launcher never asks more)
    static constexpr int kObufStride = kDv + 8;  // fp32 per buffered row: +8 floats, so a half-warp's float2 rows hit distinct banks
    static constexpr int kOffMl = kHeads * kObufStride * 4;  // [64][2] (m, l) after the buffer
    static_assert(kOffMl + kHeads * 2 * 4 <= kOffBias, "the O buffer and (m, l) fit in the Q / ring / exchange area");

    // M = max_c m_c and L = sum_c l_c 2^(m_c - M) of one row over the cluster's ranks 0..C-1 (in order): every rank's
    // (m, l) is loaded first (the loads are independent and stay in flight together; each ld.shared::cluster asm is
    // volatile with a memory clobber, so a load-add-load chain would pay the DSMEM latency C times), then reduced.
    static GLM5_DEVICE void cluster_row_stats(uint32_t ml_s, int row, int C, float& mx, float& sum) {
        uint32_t mc[kMaxCluster], lc[kMaxCluster];
#pragma unroll
        for (int c = 0; c < kMaxCluster; ++c)
            if (c < C) ptx::ld_shared_cluster_v2_u32(ptx::mapa_shared(ml_s + 8 * row, c), mc[c], lc[c]);
        mx = -INFINITY;
#pragma unroll
        for (int c = 0; c < kMaxCluster; ++c)
            if (c < C) mx = fmaxf(mx, __uint_as_float(mc[c]));
        sum = 0.0f;
        if (mx != -INFINITY) {
#pragma unroll
            for (int c = 0; c < kMaxCluster; ++c)
                if (c < C) sum += __uint_as_float(lc[c]) * ex2(__uint_as_float(mc[c]) - mx);
        }
    }

    static GLM5_DEVICE void cluster_epilogue(uint8_t* smem, const SparseMlaParams& p, const float (&o)[kORegs],
                                             const float (&m)[2], const float (&l)[2], int t, int split, int h0, int tid) {
        const int wg = tid / kWgThreads, wtid = tid % kWgThreads;
        const int lane = tid % 32, warp4 = wtid / 32, g = lane / 4, tq = lane % 4;
        const int hrow = warp4 * 16 + g;
        const int C = p.cluster;
        const uint32_t rank = ptx::cluster_ctarank();
        float* obuf = reinterpret_cast<float*>(smem);
        float* ml = reinterpret_cast<float*>(smem + kOffMl);
        const uint32_t obuf_s = ptx::smem_addr(obuf), ml_s = ptx::smem_addr(ml);

        ptx::cp_async_wait_all();
        __syncthreads();  // both warpgroups are done with Q / the ring / the exchange buffer
        if (wg == 0 && tq == 0) {
            ml[2 * hrow] = m[0];
            ml[2 * hrow + 1] = l[0];
            ml[2 * (hrow + 8)] = m[1];
            ml[2 * (hrow + 8) + 1] = l[1];
        }
        ptx::cluster_sync();  // (1)

        float f[2];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx, sum;
            cluster_row_stats(ml_s, hrow + 8 * r, C, mx, sum);
            f[r] = (mx == -INFINITY || !(sum > 0.0f)) ? 0.0f : ex2(m[r] - mx) / sum;
        }
        {
            float* row0 = obuf + hrow * kObufStride + wg * kDvPerWg + 2 * tq;
            float* row1 = row0 + 8 * kObufStride;
#pragma unroll
            for (int j = 0; j < kORegs / 4; ++j) {
                *reinterpret_cast<float2*>(row0 + 8 * j) = make_float2(o[4 * j + 0] * f[0], o[4 * j + 1] * f[0]);
                *reinterpret_cast<float2*>(row1 + 8 * j) = make_float2(o[4 * j + 2] * f[1], o[4 * j + 3] * f[1]);
            }
        }
        ptx::cluster_sync();  // (2)

        const int R = kHeads / C;                    // rows this rank merges
        const bool final_out = C == p.num_splits;    // one cluster holds every split of the token
        const int ns2 = p.num_splits / C, part = split / C;
        for (int idx = tid; idx < R * (kDv / 4); idx += kThreads) {
            const int row = static_cast<int>(rank) * R + idx / (kDv / 4), c4 = idx % (kDv / 4);
            float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
            const uint32_t a = obuf_s + (row * kObufStride + 4 * c4) * 4;
            float4 v[kMaxCluster];  // every rank's float4 in flight, then summed in rank order
#pragma unroll
            for (int c = 0; c < kMaxCluster; ++c)
                if (c < C) v[c] = ptx::ld_shared_cluster_f32x4(ptx::mapa_shared(a, c));
#pragma unroll
            for (int c = 0; c < kMaxCluster; ++c)
                if (c < C) { acc.x += v[c].x; acc.y += v[c].y; acc.z += v[c].z; acc.w += v[c].w; }
            if (final_out) {
                ptx::st_global_v2(p.o + ((static_cast<int64_t>(t) * p.num_heads + h0 + row) * kDv + 4 * c4),
                                  ptx::f32x2_to_bf16x2_rn(acc.x, acc.y), ptx::f32x2_to_bf16x2_rn(acc.z, acc.w));
            } else {
                float* dst = p.o_part + ((static_cast<int64_t>(t) * ns2 + part) * p.num_heads + h0 + row) * kDv + 4 * c4;
                *reinterpret_cast<float4*>(dst) = acc;
            }
        }
        if (tid < R) {
            const int row = static_cast<int>(rank) * R + tid;
            float mx, sum;
            cluster_row_stats(ml_s, row, C, mx, sum);
            constexpr float kLn2 = 0.693147180559945309f;
            const float lse = (mx != -INFINITY && sum > 0.0f) ? (mx + log2f(sum)) * kLn2 : -INFINITY;
            if (final_out) {
                if (p.lse_out != nullptr) p.lse_out[static_cast<int64_t>(t) * p.num_heads + h0 + row] = lse;
            } else {
                p.lse_part[(static_cast<int64_t>(t) * ns2 + part) * p.num_heads + h0 + row] = lse;
            }
        }
        ptx::cluster_sync();  // (3) peers may still read this CTA's buffer
    }
};

#ifndef GLM5_SPARSE_MLA_WGMMA_STAGES
#define GLM5_SPARSE_MLA_WGMMA_STAGES 3
#endif
using SparseMlaSplitWgmmaTile = SparseMlaSplitWgmmaTileT<GLM5_SPARSE_MLA_WGMMA_STAGES>;

struct SparseMlaCombineTile {
    static constexpr int kDv = SparseMlaSplitTile::kDv;
    static constexpr int kMaxSplits = SparseMlaSplitTile::kMaxSplits;
    static constexpr int kGroups = 4;                // split groups
    static constexpr int kLanes = 64;                // float4 columns per CTA
    static constexpr int kThreads = kGroups * kLanes;
    static constexpr int kCols = kLanes * 4;         // 256: one half of d_v
    static constexpr int kParts = kDv / kCols;       // gridDim.z
    static_assert(kDv % kCols == 0, "d_v halves");

    // o: [T, H, kDv] bf16 contiguous; lse_out: [T, H] fp32 or null. Call after griddepcontrol.wait.
    static GLM5_DEVICE void run(const float* o_part, const float* lse_part, uint16_t* o, float* lse_out,
                                int num_splits, int num_heads, int t, int h, int part, int tid) {
        __shared__ float s_w[kMaxSplits];
        __shared__ float4 s_acc[kGroups][kLanes];
        const int lane = tid % kLanes, grp = tid / kLanes;
        const int64_t th = static_cast<int64_t>(t) * num_heads + h;
        for (int i = tid; i < num_splits; i += kThreads)
            s_w[i] = __ldcg(lse_part + (static_cast<int64_t>(t) * num_splits + i) * num_heads + h);  // L2, not .nc
        __syncthreads();
        float mx = -INFINITY;
        for (int i = 0; i < num_splits; ++i) mx = fmaxf(mx, s_w[i]);
        float wsum = 0.0f;
        if (mx != -INFINITY) {
            for (int i = 0; i < num_splits; ++i) wsum += expf(s_w[i] - mx);
        }
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        if (mx != -INFINITY) {
            const int col = part * kCols + 4 * lane;
            for (int i = grp; i < num_splits; i += kGroups) {
                const float w = expf(s_w[i] - mx);
                if (w == 0.0f) continue;  // empty split (lse = -inf): its O is never read
                const float4 v = ptx::ld_cg_f32x4(o_part + ((static_cast<int64_t>(t) * num_splits + i) * num_heads + h) * kDv + col);
                acc.x += w * v.x; acc.y += w * v.y; acc.z += w * v.z; acc.w += w * v.w;
            }
        }
        s_acc[grp][lane] = acc;
        __syncthreads();
        if (grp == 0) {
            float4 r = s_acc[0][lane];
#pragma unroll
            for (int k = 1; k < kGroups; ++k) {
                const float4 a = s_acc[k][lane];
                r.x += a.x; r.y += a.y; r.z += a.z; r.w += a.w;
            }
            const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
            const uint32_t lo = ptx::f32x2_to_bf16x2_rn(r.x * inv, r.y * inv);
            const uint32_t hi = ptx::f32x2_to_bf16x2_rn(r.z * inv, r.w * inv);
            ptx::st_global_v2(o + th * kDv + part * kCols + 4 * lane, lo, hi);
            if (lse_out != nullptr && part == 0 && lane == 0)
                lse_out[th] = wsum > 0.0f ? mx + logf(wsum) : -INFINITY;
        }
    }
};

// ---- Split tile, 64 heads, warpgroup ping-pong (sm_90a) --------------------------------------------------------
// The same (token, split) work, split boundaries and partial-output contract as SparseMlaSplitWgmmaTileT, scheduled
// the way the warpgroups of a flash-attention decode kernel alternate: warpgroup w OWNS the blocks j with j % 2 == w
// (S = Q K^T over all 576 dims, 36 m64n32k16, and that block's online-softmax step), while BOTH warpgroups run
// O += P V of EVERY block on their own d_v half (m64n256k16, P from registers). Why: in SparseMlaSplitWgmmaTileT both
// warpgroups wait for each block's S, exchange, softmax and P V in lockstep (~1.6 us per 32-slot block for ~0.6 us of
// tensor work, session 25); here the S of block j + 1 runs on the tensor cores while the owner of block j does its
// softmax, and P V of block j overlaps the next S.
//
// 384 threads: warpgroup 0's warp 0 is the producer (warps 1-3 idle; the warpgroup gives registers back with
// setmaxnreg), warpgroups 1 / 2 are the consumers ("warpgroup w" below: w = 0 / 1). The producer gathers every block (lane = slot row,
// 72 16-byte cp.async per row + the row's 0 / -inf bias by a 4-byte cp.async from kPpBias) into a kStages ring and
// signals full[stage] with cp.async.mbarrier.arrive.noinc (32 arrivals); a consumer reads a stage after mbar_wait +
// fence.proxy.async (cp.async writes through the generic proxy, wgmma reads through the async one) and every consumer
// thread arrives on empty[stage] (256 arrivals) once its warpgroup's wgmma reading that stage have retired.
// The softmax chain runs across the warpgroups: the owner of block j starts from the running max after block j - 1
// (the other warpgroup's step, received with its P), publishes in slot j % 2 of shared memory its P fragments (the
// m16n8k16 A layout: thread t of either warpgroup holds the same rows and columns, so the other warpgroup's thread t
// reads exactly its own fragment back) and per thread (m_new[2], alpha[2], rs[2]), and arrives on named barrier
// 2 + j % 2 (256 threads: 128 arrive, the other warpgroup's 128 sync). Both warpgroups apply the same alpha and rs, so
// m and l are the same in both; l sums the bf16-rounded P per thread as in the other tiles.
// wgmma groups of warpgroup w, in commit order: S(w) (prologue), then per own block j: P V(j), S(j + 2); per other
// block j: P V(j) -- an S past the last block is a stand-in over a landed stage. Every step waits for all of its
// warpgroup's groups (wait<0>): one left in flight would overlap P V(j - 1) with the next step, but ptxas cannot see
// which group a wait<1> retires and serialises every wgmma instead (C7514 / C7515); the overlap that matters, one
// warpgroup's S on the tensor cores during the other's softmax, is across warpgroups. Deterministic: fixed orders
// everywhere (S is one m64n32 accumulation chain over k steps 0..35).
// Measured (session 26, H200): correct (all GPU tests pass) but SLOWER than SparseMlaSplitWgmmaTileT: 3.5 against
// 2.0 us per 32-slot block (T = 64: split kernel 111.7 against 64.6 us; T = 8: 22.8 against 17.8). The softmax chain
// runs through both warpgroups serially (block j + 1's step needs block j's max), so the cross-warpgroup overlap it
// was built for does not happen, and the single producer warp adds a hop. Kept opt-in (`tile="wgmma_pp"`) as the
// measured record of that schedule; `auto` never picks it.
static __device__ __align__(16) const float kPpBias[4] = {0.0f, -INFINITY, 0.0f, 0.0f};

template <int kStages_>
struct SparseMlaSplitPingPongTileT {
    static constexpr int kStages = kStages_;
    static constexpr int kDqk = 576;
    static constexpr int kDv = 512;
    static constexpr int kHeads = 64;
    static constexpr int kBlock = 32;
    static constexpr int kConsumerThreads = 256;
    static constexpr int kWgThreads = 128;
    static constexpr int kThreads = kConsumerThreads + 128;   // + the producer warpgroup (one active warp)
    // setmaxnreg split of the 168 x 384 launch allocation: 40 x 128 + 232 x 256 = 64512 (56 / 224 spilled 8-36 B).
    static constexpr int kProducerRegs = 40;
    static constexpr int kConsumerRegs = 232;
    static constexpr int kChunks = kDqk / 64;                  // 9
    static constexpr int kKSteps = kDqk / 16;                  // 36
    static constexpr int kDvPerWg = kDv / 2;                   // 256
    static constexpr int kSRegs = kBlock / 2;                  // 16
    static constexpr int kORegs = kDvPerWg / 2;                // 128
    static constexpr int kQChunkBytes = kHeads * 128;          // 8192
    static constexpr int kKvChunkBytes = kBlock * 128;         // 4096
    static constexpr int kQBytes = kChunks * kQChunkBytes;     // 73728
    static constexpr int kStageBytes = kChunks * kKvChunkBytes;  // 36864
    static constexpr int kSlotBytes = 8 * kWgThreads * 4;      // 4096: 8 words per consumer thread of one warpgroup
    static constexpr int kOffRing = kQBytes;
    static constexpr int kOffP = kOffRing + kStages * kStageBytes;   // P slots [2][8][128] u32
    static constexpr int kOffStats = kOffP + 2 * kSlotBytes;         // stats slots [2][8][128] fp32
    static constexpr int kOffBias = kOffStats + 2 * kSlotBytes;      // [kStages][32] fp32
    static constexpr int kOffBar = kOffBias + kStages * kBlock * 4;  // full[kStages], empty[kStages] (8 B each)
    static constexpr int kSmemUsed = kOffBar + 2 * kStages * 8;
    static constexpr int kSmemBytes = kSmemUsed + 1024;
    static constexpr int kBarHandoff = 2;                      // named barriers 2, 3 (1: the consumers' Q barrier)

    // >= 3 stages: an own step j waits for block j + 2 to land, whose stage is freed only by the steps for block j - 1
    // + kStages... i.e. block j + 2 - kStages must be released by step j - 1 at the latest (2 stages deadlock;
    // tests/ops/test_sparse_mla_pp_protocol.py replays the protocol).
    static_assert(kStages >= 3 && kSmemBytes <= 227 * 1024, "ring depth: >= 3 stages in 227 KB");
    static_assert(kOffBias % 16 == 0 && kOffBar % 8 == 0, "alignment of the bias rows and the mbarriers");

    static GLM5_DEVICE uint32_t full_bar(uint32_t sbase, int st) { return sbase + kOffBar + 8 * st; }
    static GLM5_DEVICE uint32_t empty_bar(uint32_t sbase, int st) { return sbase + kOffBar + 8 * (kStages + st); }

    template <int kId>
    static GLM5_DEVICE void bar_arrive() { asm volatile("bar.arrive %0, %1;" ::"n"(kId), "n"(kConsumerThreads) : "memory"); }
    template <int kId>
    static GLM5_DEVICE void bar_sync() { asm volatile("bar.sync %0, %1;" ::"n"(kId), "n"(kConsumerThreads) : "memory"); }

    // S(j) into s: one accumulation chain over the 36 k steps of Q (A) and the block's K rows (B), both K-major.
    // The accumulators are fenced around every issue (CUTLASS's warpgroup_fence_operand): otherwise the compiler may
    // move their initialisation / the O rescale past wgmma.fence, into the wgmma pipeline, and ptxas then serialises
    // every wgmma of the kernel (C7515).
    static GLM5_DEVICE void issue_qk(float (&s)[kSRegs], uint32_t q_s, uint32_t stage_s) {
        sm90::fence_operands(s);
        sm90::wgmma_fence();
#pragma unroll
        for (int ks = 0; ks < kKSteps; ++ks) {
            const uint32_t off_q = (ks / 4) * kQChunkBytes + (ks % 4) * 32;
            const uint32_t off_k = (ks / 4) * kKvChunkBytes + (ks % 4) * 32;
            sm90::wgmma_m64n32k16_bf16_ss(s, sm90::smem_desc_k128sw(q_s + off_q), sm90::smem_desc_k128sw(stage_s + off_k),
                                          ks > 0 ? 1 : 0);
        }
        sm90::wgmma_commit();
        sm90::fence_operands(s);
    }

    // O += P V over warpgroup wg's 256 columns of the block in stage_s; pk: the P fragments ([j][r], the S layout).
    static GLM5_DEVICE void issue_pv(float (&o)[kORegs], const uint32_t (&pk)[kBlock / 8][2], uint32_t stage_s, int wg) {
        sm90::fence_operands(o);
        sm90::wgmma_fence();
#pragma unroll
        for (int kk = 0; kk < kBlock / 16; ++kk) {
            const uint32_t a[4] = {pk[2 * kk][0], pk[2 * kk][1], pk[2 * kk + 1][0], pk[2 * kk + 1][1]};
            const uint32_t vb = stage_s + (wg * (kDvPerWg / 64)) * kKvChunkBytes + kk * 16 * 128;
            sm90::wgmma_m64n256k16_bf16_rs_tb(o, a, sm90::smem_desc_mn128sw(vb, kKvChunkBytes, 1024), 1);
        }
        sm90::wgmma_commit();
        sm90::fence_operands(o);
    }

    static GLM5_DEVICE void rescale(float (&o)[kORegs], const float (&alpha)[2]) {
        if (__any_sync(0xffffffffu, alpha[0] != 1.0f || alpha[1] != 1.0f)) {
#pragma unroll
            for (int j = 0; j < kORegs / 4; ++j) {
                o[4 * j + 0] *= alpha[0]; o[4 * j + 1] *= alpha[0];
                o[4 * j + 2] *= alpha[1]; o[4 * j + 3] *= alpha[1];
            }
        }
    }

    struct Ctx {
        uint8_t* smem;
        uint32_t sbase, q_s, ring_s, bias_s;
        int blk_begin, n, h0;
        const int32_t* idx_row;
    };

    static GLM5_DEVICE int tid_x() {
        int v;
        asm volatile("mov.u32 %0, %%tid.x;" : "=r"(v));
        return v;
    }

    static GLM5_DEVICE Ctx make_ctx(uint8_t* smem_raw, const SparseMlaParams& p, int t, int split, int hblk) {
        Ctx c;
        c.smem = reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
        c.sbase = ptx::smem_addr(c.smem);
        c.q_s = c.sbase;
        c.ring_s = c.sbase + kOffRing;
        c.bias_s = c.sbase + kOffBias;
        const int nblocks = (p.topk + kBlock - 1) / kBlock;
        const int bps = (nblocks + p.num_splits - 1) / p.num_splits;
        c.blk_begin = min(split * bps, nblocks);
        c.n = min(c.blk_begin + bps, nblocks) - c.blk_begin;
        c.h0 = hblk * kHeads;
        c.idx_row = p.indices + static_cast<int64_t>(t) * p.idx_stride;
        return c;
    }

    // Call after griddepcontrol.wait, with every thread of the CTA (kThreads); the CTA is (token blockIdx.x, split
    // blockIdx.y, 64-head block blockIdx.z). Each role builds its context after setmaxnreg (values live across the
    // register reallocation spill).
    static GLM5_DEVICE void run(uint8_t* smem_raw, const SparseMlaParams& p, int tid) {
        if (tid == 0) {
            const uint32_t sbase = ptx::smem_addr(reinterpret_cast<uint8_t*>(
                (reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023)));
            for (int st = 0; st < kStages; ++st) {
                sm90::mbar_init(full_bar(sbase, st), 32);
                sm90::mbar_init(empty_bar(sbase, st), kConsumerThreads);
            }
            sm90::fence_barrier_init();
        }
        __syncthreads();
        // The thread index is read again after setmaxnreg with a volatile read the compiler cannot merge with the
        // one above (the value live across the reallocation was spilled to local memory).
        if (tid < kWgThreads) {
            sm90::setmaxnreg_dec<kProducerRegs>();
            const int ptid = tid_x();
            if (ptid < 32) producer(make_ctx(smem_raw, p, blockIdx.x, blockIdx.y, blockIdx.z), p, ptid);
            return;
        }
        sm90::setmaxnreg_inc<kConsumerRegs>();
        const int ctid = tid_x() - kWgThreads;
        const int bt = blockIdx.x, bs = blockIdx.y;
        if (ctid < kWgThreads) consumer<0>(make_ctx(smem_raw, p, bt, bs, blockIdx.z), p, bt, bs, ctid);
        else consumer<1>(make_ctx(smem_raw, p, bt, bs, blockIdx.z), p, bt, bs, ctid);
    }

    // ---- producer warp: lane r = slot row r of every block ----
    static GLM5_DEVICE void producer(const Ctx& c, const SparseMlaParams& p, int r) {
        const int n = c.n;
        const int32_t* ip = c.idx_row + static_cast<int64_t>(c.blk_begin) * kBlock + r;
        int32_t slot = (n > 0 && c.blk_begin * kBlock + r < p.topk) ? ptx::ld_global_s32(ip) : -1;
        for (int j = 0; j < n; ++j) {
            const int st = j % kStages;
            const int32_t next = (j + 1 < n && (c.blk_begin + j + 1) * kBlock + r < p.topk)
                                     ? ptx::ld_global_s32(ip + (j + 1) * kBlock) : -1;  // one block ahead
            sm90::mbar_wait(empty_bar(c.sbase, st), ((j / kStages) & 1) ^ 1);
            const bool valid = slot >= 0 && static_cast<int64_t>(slot) < p.num_slots;
            const uint16_t* src = valid ? p.kv + static_cast<int64_t>(slot) * p.kv_stride : p.kv;
            const uint32_t bytes = valid ? 16u : 0u;
            const uint32_t dst = c.ring_s + st * kStageBytes + r * 128;
#pragma unroll
            for (int kc = 0; kc < kChunks; ++kc)
#pragma unroll
                for (int c16 = 0; c16 < 8; ++c16)
                    ptx::cp_async_16(dst + kc * kKvChunkBytes + ((c16 ^ (r & 7)) << 4), src + (valid ? kc * 64 + c16 * 8 : 0),
                                     bytes);
            ptx::cp_async_ca_4(c.bias_s + (st * kBlock + r) * 4, &kPpBias[valid ? 0 : 1]);
            sm90::cp_async_16_mbar_arrive(full_bar(c.sbase, st));
            slot = next;
        }
        ptx::cp_async_wait_all();
    }

    // Per-thread consumer state, carried through the steps.
    struct CState {
        float o[kORegs];
        float s[kSRegs];
        float m[2], l[2];
    };

    // The stage a block reads: its own, or block n - 1's for the virtual block n that pads an odd n to whole pairs.
    static GLM5_DEVICE int stage_of(int j, int n) { return (j < n ? j : n - 1) % kStages; }

    // Own block j (j == n: the virtual pad block, every slot masked: P = 0, alpha = 1, rs = 0).
    template <int kWg>
    static GLM5_DEVICE void own_step(CState& cs, const Ctx& c, const SparseMlaParams& p, int j, int wtid, int tq) {
        const int n = c.n;
        const int st = stage_of(j, n);
        const uint32_t stage_s = c.ring_s + st * kStageBytes;
        sm90::wgmma_wait<0>();  // S(j) retired, and P V(j - 1) before the rescale below
        sm90::fence_operands(cs.s);
        sm90::fence_operands(cs.o);
        const float* bias = reinterpret_cast<const float*>(c.smem + kOffBias) + st * kBlock;
        const bool virt = j >= n;
        float x[kSRegs];
#pragma unroll
        for (int q4 = 0; q4 < kSRegs / 4; ++q4) {
            const float2 b = *reinterpret_cast<const float2*>(bias + 8 * q4 + 2 * tq);
            const bool v0 = !virt && b.x == 0.0f, v1 = !virt && b.y == 0.0f;
            x[4 * q4 + 0] = v0 ? cs.s[4 * q4 + 0] * p.scale_log2 : -INFINITY;
            x[4 * q4 + 1] = v1 ? cs.s[4 * q4 + 1] * p.scale_log2 : -INFINITY;
            x[4 * q4 + 2] = v0 ? cs.s[4 * q4 + 2] * p.scale_log2 : -INFINITY;
            x[4 * q4 + 3] = v1 ? cs.s[4 * q4 + 3] * p.scale_log2 : -INFINITY;
        }
        float muse[2], alpha[2], rs[2] = {0.0f, 0.0f};
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            float mx = -INFINITY;
#pragma unroll
            for (int jj = 0; jj < kBlock / 8; ++jj) mx = fmaxf(mx, fmaxf(x[4 * jj + 2 * r], x[4 * jj + 2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            const float mnew = fmaxf(cs.m[r], mx);
            muse[r] = mnew == -INFINITY ? 0.0f : mnew;
            alpha[r] = ex2(cs.m[r] - muse[r]);
            cs.m[r] = mnew;
        }
        uint32_t pk[kBlock / 8][2];
#pragma unroll
        for (int jj = 0; jj < kBlock / 8; ++jj) {
#pragma unroll
            for (int r = 0; r < 2; ++r) {
                const uint32_t v = ptx::f32x2_to_bf16x2_rn(ex2(x[4 * jj + 2 * r] - muse[r]), ex2(x[4 * jj + 2 * r + 1] - muse[r]));
                pk[jj][r] = v;
                rs[r] += ptx::bf16lo_to_f32(v) + ptx::bf16hi_to_f32(v);
            }
        }
        uint32_t* pw = reinterpret_cast<uint32_t*>(c.smem + kOffP) + kWg * (8 * kWgThreads);  // slot j % 2 == kWg
        float* sw = reinterpret_cast<float*>(c.smem + kOffStats) + kWg * (8 * kWgThreads);
#pragma unroll
        for (int jj = 0; jj < kBlock / 8; ++jj) {
            pw[(2 * jj) * kWgThreads + wtid] = pk[jj][0];
            pw[(2 * jj + 1) * kWgThreads + wtid] = pk[jj][1];
        }
        sw[0 * kWgThreads + wtid] = cs.m[0];
        sw[1 * kWgThreads + wtid] = cs.m[1];
        sw[2 * kWgThreads + wtid] = alpha[0];
        sw[3 * kWgThreads + wtid] = alpha[1];
        sw[4 * kWgThreads + wtid] = rs[0];
        sw[5 * kWgThreads + wtid] = rs[1];
        bar_arrive<kBarHandoff + kWg>();
        cs.l[0] = cs.l[0] * alpha[0] + rs[0];
        cs.l[1] = cs.l[1] * alpha[1] + rs[1];
        rescale(cs.o, alpha);
        if (j >= 1) sm90::mbar_arrive(empty_bar(c.sbase, stage_of(j - 1, n)));
        issue_pv(cs.o, pk, stage_s, kWg);
        // S(j + 2), or past the last block a stand-in S over block j's landed stage (its result is never used): the same
        // wgmma on every path, since two paths defining cs.s differently while it is in flight make ptxas serialise
        // every wgmma of the kernel (C7515: the join copies the accumulators)
        const bool real = j + 2 < n;
        if (real) sm90::mbar_wait<true>(full_bar(c.sbase, (j + 2) % kStages), ((j + 2) / kStages) & 1);
        sm90::fence_proxy_async_smem();
        issue_qk(cs.s, c.q_s, real ? c.ring_s + ((j + 2) % kStages) * kStageBytes : stage_s);
    }

    // The other warpgroup's block j (j == n: its virtual pad block): its P and softmax step, our d_v half.
    template <int kWg>
    static GLM5_DEVICE void other_step(CState& cs, const Ctx& c, int j, int wtid) {
        const int n = c.n;
        const int st = stage_of(j, n);
        bar_sync<kBarHandoff + (1 - kWg)>();
        const uint32_t* pr = reinterpret_cast<const uint32_t*>(c.smem + kOffP) + (1 - kWg) * (8 * kWgThreads);
        const float* sr = reinterpret_cast<const float*>(c.smem + kOffStats) + (1 - kWg) * (8 * kWgThreads);
        uint32_t pk[kBlock / 8][2];
#pragma unroll
        for (int jj = 0; jj < kBlock / 8; ++jj) {
            pk[jj][0] = pr[(2 * jj) * kWgThreads + wtid];
            pk[jj][1] = pr[(2 * jj + 1) * kWgThreads + wtid];
        }
        float alpha[2];
        cs.m[0] = sr[0 * kWgThreads + wtid];
        cs.m[1] = sr[1 * kWgThreads + wtid];
        alpha[0] = sr[2 * kWgThreads + wtid];
        alpha[1] = sr[3 * kWgThreads + wtid];
        cs.l[0] = cs.l[0] * alpha[0] + sr[4 * kWgThreads + wtid];
        cs.l[1] = cs.l[1] * alpha[1] + sr[5 * kWgThreads + wtid];
        sm90::wgmma_wait<0>();  // P V(j - 1) retired
        sm90::fence_operands(cs.s);
        sm90::fence_operands(cs.o);
        rescale(cs.o, alpha);
        if (j >= 1) sm90::mbar_arrive(empty_bar(c.sbase, stage_of(j - 1, n)));
        if (j < n) {
            sm90::mbar_wait<true>(full_bar(c.sbase, st), (j / kStages) & 1);
            sm90::fence_proxy_async_smem();
        }
        issue_pv(cs.o, pk, c.ring_s + st * kStageBytes, kWg);
    }

    // ---- consumer warpgroup kWg (0 / 1); ctid = thread index among the 256 consumers ----
    // Blocks go in pairs (j, j + 1), an odd n padded with the virtual block n, so each warpgroup runs the same
    // straight-line pair of steps every iteration (warpgroup 0: own(j), other(j + 1); warpgroup 1: other(j), own(j + 1))
    // and its accumulators never meet at a branch join while their wgmma are in flight.
    template <int kWg>
    static GLM5_DEVICE void consumer(const Ctx& c, const SparseMlaParams& p, int t, int split, int ctid) {
        const int n = c.n, h0 = c.h0;
        const int wtid = ctid % kWgThreads;
        const int lane = ctid % 32, warp4 = wtid / 32;
        const int g = lane / 4, tq = lane % 4;
        if (n == 0) {  // an empty split (past the last block): zeros and lse = -inf, as the other tiles write
            const int64_t row0 = (static_cast<int64_t>(t) * p.num_splits + split) * p.num_heads + h0 + warp4 * 16 + g;
            float* out0 = p.o_part + row0 * kDv + kWg * kDvPerWg + 2 * tq;
#pragma unroll 4
            for (int j = 0; j < kORegs / 4; ++j) {
                *reinterpret_cast<float2*>(out0 + 8 * j) = make_float2(0.0f, 0.0f);
                *reinterpret_cast<float2*>(out0 + 8 * kDv + 8 * j) = make_float2(0.0f, 0.0f);
            }
            if (kWg == 0 && tq == 0) p.lse_part[row0] = p.lse_part[row0 + 8] = -INFINITY;
            return;
        }
        {   // Q: row = ctid / 4 (a head), pieces part + 4i of its 72
            const int r = ctid / 4, part = ctid % 4;
            const uint16_t* src = p.q + static_cast<int64_t>(t) * p.q_stride_t + static_cast<int64_t>(h0 + r) * p.q_stride_h;
#pragma unroll
            for (int i = 0; i < kChunks * 8 / 4; ++i) {
                const int cc = part + 4 * i;
                const int kc = cc / 8, c16 = cc % 8;
                ptx::cp_async_16(c.q_s + kc * kQChunkBytes + r * 128 + ((c16 ^ (r & 7)) << 4), src + cc * 8, 16u);
            }
            ptx::cp_async_commit();
            ptx::cp_async_wait_all();
            sm90::fence_proxy_async_smem();
            asm volatile("bar.sync 1, %0;" ::"n"(kConsumerThreads) : "memory");
        }
        CState cs;
#pragma unroll
        for (int i = 0; i < kORegs; ++i) cs.o[i] = 0.0f;
#pragma unroll
        for (int i = 0; i < kSRegs; ++i) cs.s[i] = 0.0f;
        cs.m[0] = cs.m[1] = -INFINITY;
        cs.l[0] = cs.l[1] = 0.0f;
        sm90::fence_operands(cs.o);
        sm90::fence_operands(cs.s);

        // the first own block's S (n == 1, warpgroup 1: a stand-in over block 0's stage, as at the end of own_step)
        {
            const int jf = kWg < n ? kWg : 0;
            sm90::mbar_wait<true>(full_bar(c.sbase, jf % kStages), (jf / kStages) & 1);
            sm90::fence_proxy_async_smem();
            issue_qk(cs.s, c.q_s, c.ring_s + (jf % kStages) * kStageBytes);
        }
        int j = 0;
        do {  // n >= 1: at least one pair, so the prologue's S in flight never meets a zero-trip path (C7515)
            if constexpr (kWg == 0) {
                own_step<0>(cs, c, p, j, wtid, tq);
                other_step<0>(cs, c, j + 1, wtid);
            } else {
                other_step<1>(cs, c, j, wtid);
                own_step<1>(cs, c, p, j + 1, wtid, tq);
            }
            j += 2;
        } while (j < n);
        sm90::wgmma_wait<0>();
        sm90::fence_operands(cs.o);
        sm90::fence_operands(cs.s);

        // ---- partial out: O / l (this warpgroup's 256 columns) and the split's lse (as SparseMlaSplitWgmmaTileT) ----
#pragma unroll
        for (int r = 0; r < 2; ++r) {
            cs.l[r] += __shfl_xor_sync(0xffffffffu, cs.l[r], 1);
            cs.l[r] += __shfl_xor_sync(0xffffffffu, cs.l[r], 2);
        }
        const float inv0 = cs.l[0] > 0.0f ? 1.0f / cs.l[0] : 0.0f;
        const float inv1 = cs.l[1] > 0.0f ? 1.0f / cs.l[1] : 0.0f;
        const int hrow = warp4 * 16 + g;
        const int64_t row0 = (static_cast<int64_t>(t) * p.num_splits + split) * p.num_heads + h0 + hrow;
        float* out0 = p.o_part + row0 * kDv + kWg * kDvPerWg + 2 * tq;
        float* out1 = out0 + 8 * kDv;
#pragma unroll
        for (int j = 0; j < kORegs / 4; ++j) {
            *reinterpret_cast<float2*>(out0 + 8 * j) = make_float2(cs.o[4 * j + 0] * inv0, cs.o[4 * j + 1] * inv0);
            *reinterpret_cast<float2*>(out1 + 8 * j) = make_float2(cs.o[4 * j + 2] * inv1, cs.o[4 * j + 3] * inv1);
        }
        if (kWg == 0 && tq == 0) {
            constexpr float kLn2 = 0.693147180559945309f;
            p.lse_part[row0] = cs.l[0] > 0.0f ? (cs.m[0] + log2f(cs.l[0])) * kLn2 : -INFINITY;
            p.lse_part[row0 + 8] = cs.l[1] > 0.0f ? (cs.m[1] + log2f(cs.l[1])) * kLn2 : -INFINITY;
        }
    }
};

using SparseMlaSplitPingPongTile = SparseMlaSplitPingPongTileT<3>;

// ---- Combine tile, one warp per (token, head, 128-column slice) -------------------------------------------
// The same merge as SparseMlaCombineTile (log-sum-exp weights over the splits, o in bf16, lse), laid out for
// bandwidth: a warp owns 128 columns of one (t, h) (lane: one float4), reads the split lse values itself (lanes i and
// i + 32), and accumulates the splits in order i = 0, 1, ... with kUnroll loads in flight per lane; no shared memory,
// no block barrier. Why: the CTA-per-(t, h, half) tile ran 8192 tiny CTAs at T = 64 and took 14.9 us for 16.8 MB of
// partials (H200, session 25 c6), ~4x the bytes at the copy bandwidth. Every split's row is read (an empty split
// wrote zeros and lse = -inf: weight 0). Deterministic: fixed orders (butterfly for the max and the weight sum).
struct SparseMlaCombineWarpTile {
    static constexpr int kDv = 512;
    static constexpr int kCols = 128;                // per warp: 32 lanes x float4
    static constexpr int kSlices = kDv / kCols;      // 4
    static constexpr int kWarps = 8;                 // per CTA
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kUnroll = 8;                // partial-row loads in flight per lane
    static constexpr int kMaxSplits = 64;

    // o: [T, H, kDv] bf16 contiguous; lse_out: [T, H] fp32 or null. unit = (h, slice) of token t. After griddepcontrol.wait.
    static GLM5_DEVICE void run(const float* o_part, const float* lse_part, uint16_t* o, float* lse_out,
                                int num_splits, int num_heads, int t, int unit, int lane) {
        const int h = unit / kSlices, slice = unit % kSlices;
        const float* lse_row = lse_part + static_cast<int64_t>(t) * num_splits * num_heads + h;
        const float l0 = lane < num_splits ? __ldcg(lse_row + static_cast<int64_t>(lane) * num_heads) : -INFINITY;
        const float l1 = lane + 32 < num_splits ? __ldcg(lse_row + static_cast<int64_t>(lane + 32) * num_heads) : -INFINITY;
        float mx = fmaxf(l0, l1);
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, d));
        const float w0 = mx == -INFINITY ? 0.0f : expf(l0 - mx);
        const float w1 = mx == -INFINITY ? 0.0f : expf(l1 - mx);
        float wsum = w0 + w1;
#pragma unroll
        for (int d = 16; d >= 1; d >>= 1) wsum += __shfl_xor_sync(0xffffffffu, wsum, d);

        const int col = slice * kCols + 4 * lane;
        const float* src = o_part + (static_cast<int64_t>(t) * num_splits * num_heads + h) * kDv + col;
        const int64_t split_stride = static_cast<int64_t>(num_heads) * kDv;
        float4 acc = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
        for (int i0 = 0; i0 < num_splits; i0 += kUnroll) {
            float4 v[kUnroll];
#pragma unroll
            for (int j = 0; j < kUnroll; ++j)
                if (i0 + j < num_splits) v[j] = ptx::ld_cg_f32x4(src + (i0 + j) * split_stride);
#pragma unroll
            for (int j = 0; j < kUnroll; ++j) {
                const int i = i0 + j;
                const float w = __shfl_sync(0xffffffffu, i < 32 ? w0 : w1, i & 31);  // uniform i: every lane takes part
                if (i < num_splits && w != 0.0f) {  // an empty split (weight 0) is not read into the sum
                    acc.x += w * v[j].x; acc.y += w * v[j].y; acc.z += w * v[j].z; acc.w += w * v[j].w;
                }
            }
        }
        const float inv = wsum > 0.0f ? 1.0f / wsum : 0.0f;
        const uint32_t lo = ptx::f32x2_to_bf16x2_rn(acc.x * inv, acc.y * inv);
        const uint32_t hi = ptx::f32x2_to_bf16x2_rn(acc.z * inv, acc.w * inv);
        const int64_t th = static_cast<int64_t>(t) * num_heads + h;
        ptx::st_global_v2(o + th * kDv + col, lo, hi);
        if (lse_out != nullptr && slice == 0 && lane == 0) lse_out[th] = wsum > 0.0f ? mx + logf(wsum) : -INFINITY;
    }
};

}  // namespace attn_core
}  // namespace glm5
