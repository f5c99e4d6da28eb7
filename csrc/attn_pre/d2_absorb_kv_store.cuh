// D2 tiles: W_UK absorption q_lat[m, h, :] = bf16(q_nope[m, h, :] . w_kc[h]) (bf16 operands, fp32
// accumulation), plus the MLA k_pe RoPE and latent KV-cache store of the same step.
//
// Framework-free (raw pointers, bf16 as uint16_t patterns): the standalone launcher
// (d2_absorb_kv_store.cu) runs one CTA per (head, 128-column latent tile); a persistent megakernel
// can hand the same 256-thread group one tile at a time and give the KV store to any spare warp.
//
// ---- D2AbsorbTile: one (head h, latent columns [128j, 128j+128)) tile ---------------------------------
// swapAB: q_lat^T[n, m] = sum_k w_kc[h][k, n] * q_nope[m, h, k]: the weight tile is the MMA's A
// (M side = 128 latent columns = 8 m16 tiles), the tokens are N (n8 tiles), K = kNope (192).
//
// Weights. The 192 x 128 bf16 tile (48 KB, rows 256 B apart in smem) is streamed with cp.async,
// one commit group per 32-row K block, all issued before griddepcontrol.wait. Each 16-byte chunk c
// of row k is stored at chunk c ^ swz(k), swz(k) = ((k >> 3) & 3) << 1 | (k & 1); with the row
// order below, the 8 row addresses of every ldmatrix matrix then hit 8 distinct 16-byte bank
// groups (conflict free). The A fragments come from ldmatrix.x4.trans (w_kc is n-contiguous, the
// MMA wants A row-major in k).
//
// Tokens. B fragments are read straight from global memory, 16 bytes per lane: lane (g, t) loads
// q_nope[token g][k0 + 8t .. k0 + 8t + 7] of the 32-column block k0. As in C0, the MMA's logical k
// is a permutation of the physical column: step s in {0, 1} uses columns 8t+4s+{0,1} as logical
// 2t+{0,1} (b0) and 8t+4s+2+{0,1} as logical 2t+8+{0,1} (b1); the ldmatrix row addresses apply the
// same permutation to the weight rows, so A and B agree and each step covers 16 distinct columns.
//
// Warps. 8 warps = kMGroups x kTGroups: warp w owns latent m16 tiles [(w % kMGroups) * kMT, +kMT)
// and every kTGroups-th chunk of kNT*8 tokens starting at chunk w / kMGroups. kMT = 1 (8 x 1) suits
// M <= 32 (every warp busy, one pass); kMT = 2 (4 x 2) halves the B fragment traffic for larger M.
// The first pass waits for the weight K blocks one by one (cp.async.wait_group + a named barrier
// over the 256 GEMM threads), so the MMAs of early blocks overlap the arrival of later ones.
//
// Epilogue: fp32 -> bf16 (round to nearest even) into a per-warp smem staging tile [token][latent],
// then 16-byte stores of whole token rows (kMT*32 contiguous bytes each).
//
// W8A16 (kW8 = true; the standalone launcher's GLM5_D2_W8=1 build, ops/d2_absorb.py d2_absorb_kv_store_w8).
// The weight is W_UK in the checkpoint's FP8 form: w_kc8 [heads][kNope][kKvLora] e4m3 and w_kc_scale
// [heads][kNope][kKvLora / 128] fp32 (one scale per weight row and 128-column block, so one per row within
// a tile); the bf16 weight of the kW8 = false build is exactly bf16_rn(fp32(e4m3) * s) (ref/fp8.py
// dequant_w_kc). The 192 x 128 e4m3 tile (24 KB, 128 B per row) is streamed with cp.async into a raw
// staging area behind the per-warp epilogue tiles (kW8Offset), with the same per-K-block commit groups,
// all issued before griddepcontrol.wait; thread tid copies the 16-byte chunk tid % 8 of row
// kb * 32 + tid / 8 of every K block kb, and that row's scale into its own 4-byte smem slot (kb, tid)
// (kW8ScaleOffset, 6 KB for GLM-5) in the same commit group. The scales live in smem, not registers:
// the kMT = 2 build sits at ptxas's 96-register limit under __launch_bounds__(288, 2), and six scale
// registers live through pass 0 spilled there. In pass 0, after the cp.async wait of K block kb, each
// GEMM thread converts the chunk it copied itself (its own completed cp.async writes are visible to it:
// no barrier needed before) with the scale it copied itself into the swizzled bf16 tile (two 16-byte
// chunks): e4m3 -> f16 (cvt.rn.f16x2.e4m3x2, exact) -> fp32 (exact), __fmul_rn by the scale,
// cvt.rn.bf16x2.f32 (round to nearest even); the existing named barrier of that K block then publishes
// the block to every warp, and the ldmatrix / MMA code reads the same bf16 bits as the kW8 = false build
// would have copied: q_lat is bitwise that build's.
//
// ---- D2KvStoreWarp: one token's KV row, by one warp --------------------------------------------------
// kv_cache[slot] = [c_kv (kKvLora bf16) | rope(k_pe) (kRope bf16)], slot = out_cache_loc[m]. RoPE is
// GPT-J interleaved: pair i = (k_pe[2i], k_pe[2i+1]), angle = double(pos) * inv_freq[i] (inv_freq is
// the float64 table of ref/rope.py, passed in), cos/sin computed in double and rounded to fp32, then
//   out[2i] = x0*c - x1*s, out[2i+1] = x1*c + x0*s
// in fp32 with every product and sum rounded separately (no FMA: the reference's torch ops) and the
// result rounded to bf16. A slot outside [0, num_slots) is skipped (nothing is written).
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/mma_f16.cuh"
#include "../common/pdl.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace attn_pre {

struct D2Ptrs {
    const uint16_t* q_nope;  // [M, heads, kNope] bf16 (the producer's output)
    uint16_t* q_lat;         // [M, heads, q_lat_head_stride] bf16: columns [0, kKvLora) of each head row written
    int32_t num_tokens;      // M
    int32_t num_heads;       // heads (token stride of q_nope / q_lat, in head rows)
    // Elements from one head row of q_lat to the next (0: kKvLora, a packed q_lat). kKvLora + kRope: q_lat is the
    // first kKvLora columns of the sparse MLA's q = [q_lat | q_pe] (the QCAT build of the standalone kernel).
    int32_t q_lat_head_stride = 0;
};

template <int kNope, int kKvLora, int kMT, int kNT, int kBarrierId = 1, bool kW8 = false>
struct D2AbsorbTile {
    static constexpr int kThreads = 256;
    static constexpr int kWarps = kThreads / 32;
    static constexpr int kNTile = 128;                    // latent columns per tile
    static constexpr int kNTiles = kKvLora / kNTile;      // tiles per head
    static constexpr int kKBlocks = kNope / 32;           // 32-row K blocks (= cp.async groups)
    static constexpr int kRowBytes = kNTile * 2;          // 256
    static constexpr int kWBytes = kNope * kRowBytes;     // 48 KB for GLM-5
    static constexpr int kMGroups = 8 / kMT;
    static constexpr int kTGroups = kWarps / kMGroups;
    static constexpr int kChunkTok = kNT * 8;
    static constexpr int kStagePitch = kMT * 32 + 16;     // bytes per token row of the staging tile
    static constexpr int kStageBytes = kChunkTok * kStagePitch;
    static constexpr int kW8RowBytes = kNTile;            // W8: e4m3 staging row (128 B)
    static constexpr int kW8Offset = kWBytes + kWarps * kStageBytes;  // W8: the e4m3 staging tile
    static constexpr int kW8Bytes = kW8 ? kNope * kW8RowBytes : 0;    // 24 KB for GLM-5 (W8 only)
    static constexpr int kW8ScaleOffset = kW8Offset + kW8Bytes;       // W8: per-thread scale slots [kb][tid]
    static constexpr int kW8ScaleBytes = kW8 ? kKBlocks * kThreads * 4 : 0;  // 6 KB for GLM-5 (W8 only)
    static constexpr int kSmemBytes = kWBytes + kWarps * kStageBytes + kW8Bytes + kW8ScaleBytes;
    static constexpr int kCopiesPerThread = 32 * (kRowBytes / 16) / kThreads;  // per K block

    static_assert(kNope % 32 == 0 && kKBlocks >= 1 && kKBlocks <= 8, "nope dim: a multiple of 32, at most 256");
    static_assert(kKvLora % kNTile == 0, "kv_lora_rank must be a multiple of 128");
    static_assert(kMT == 1 || kMT == 2 || kMT == 4 || kMT == 8, "m16 tiles per warp must divide 8");
    static_assert(kNT >= 1 && kNT <= 8, "n8 tiles per chunk");
    static_assert(kCopiesPerThread * kThreads == 32 * (kRowBytes / 16), "K block copy must split evenly");
    static_assert(32 * (kW8RowBytes / 16) == kThreads, "W8: one 16-byte e4m3 chunk per thread per K block");
    static_assert(kW8Offset % 16 == 0, "W8: the staging tile must be 16-byte aligned");

    static GLM5_DEVICE int swz(int k) { return (((k >> 3) & 3) << 1) | (k & 1); }

    // Issue the cp.async copies of w_kc[head][:, 128*ntile : +128] into smem, one commit group per K
    // block. All 256 threads call this (before griddepcontrol.wait: weights are never written).
    static GLM5_DEVICE void issue_weight_copies(uint8_t* smem, const uint16_t* __restrict__ w_kc, int head, int ntile,
                                                int tid) {
        const uint32_t base = ptx::smem_addr(smem);
        const uint16_t* src0 = w_kc + static_cast<int64_t>(head) * kNope * kKvLora + ntile * kNTile;
#pragma unroll
        for (int kb = 0; kb < kKBlocks; ++kb) {
#pragma unroll
            for (int i = 0; i < kCopiesPerThread; ++i) {
                const int c = tid + i * kThreads;
                const int row = kb * 32 + (c >> 4), ch = c & 15;
                ptx::cp_async_16_weights(base + row * kRowBytes + ((ch ^ swz(row)) << 4),
                                         src0 + static_cast<int64_t>(row) * kKvLora + ch * 8);
            }
            ptx::cp_async_commit();
        }
    }

    // W8: issue the cp.async copies of w_kc8[head][:, 128*ntile : +128] (e4m3) into the raw staging tile
    // (row k at kW8Offset + k * 128, unswizzled) and of this thread's row scale of each K block into its
    // own slot (kW8ScaleOffset + (kb * 256 + tid) * 4), one commit group per K block. All 256 threads call
    // this before griddepcontrol.wait (static weights).
    static GLM5_DEVICE void issue_weight_copies_w8(uint8_t* smem, const uint8_t* __restrict__ w_kc8,
                                                   const float* __restrict__ w_kc_scale, int head, int ntile,
                                                   int tid) {
        const uint32_t base = ptx::smem_addr(smem + kW8Offset);
        const uint32_t sbase = ptx::smem_addr(smem + kW8ScaleOffset) + tid * 4;
        const int r = tid >> 3, ch = tid & 7;
        const uint8_t* src0 = w_kc8 + static_cast<int64_t>(head) * kNope * kKvLora + ntile * kNTile + ch * 16;
        const float* s0 = w_kc_scale + (static_cast<int64_t>(head) * kNope + r) * kNTiles + ntile;
#pragma unroll
        for (int kb = 0; kb < kKBlocks; ++kb) {
            const int row = kb * 32 + r;
            ptx::cp_async_16_weights(base + row * kW8RowBytes + ch * 16, src0 + static_cast<int64_t>(row) * kKvLora);
            ptx::cp_async_ca_4(sbase + kb * kThreads * 4, s0 + kb * 32 * kNTiles);
            ptx::cp_async_commit();
        }
    }

    // Four e4m3 (one 32-bit word, lowest byte first) -> two packed bf16 pairs, bf16_rn(fp32(e4m3) * s).
    static GLM5_DEVICE void dequant4(uint32_t w, float s, uint32_t& lo, uint32_t& hi) {
        ptx::e4m3x4_to_bf16x4_scaled(w, s, lo, hi);
    }

    // W8, K block kb: convert the e4m3 chunk this thread copied (row kb * 32 + tid / 8, columns
    // 16 * (tid % 8) + [0, 16)) with the scale it copied into bf16 chunks 2c and 2c + 1 (c = tid % 8) of
    // the swizzled weight tile. Call after this thread's cp.async wait for block kb (its own copies are then
    // visible to it); a barrier must follow before any ldmatrix.
    // Store order: threads with c >= 4 store chunk 2c + 1 first, so each 8-thread phase of a 16-byte
    // store hits 8 distinct 16-byte bank groups ((2c + (c >> 2)) ^ swz(row) differ mod 8).
    static GLM5_DEVICE void convert_block_w8(uint8_t* smem, int kb, int tid) {
        const int row = kb * 32 + (tid >> 3), c = tid & 7;
        const float s = *reinterpret_cast<const float*>(smem + kW8ScaleOffset + (kb * kThreads + tid) * 4);
        const ptx::u32x4 v = *reinterpret_cast<const ptx::u32x4*>(smem + kW8Offset + row * kW8RowBytes + c * 16);
        ptx::u32x4 c0, c1;  // bf16 columns 16c + [0, 8) and 16c + [8, 16)
        dequant4(v.x, s, c0.x, c0.y);
        dequant4(v.y, s, c0.z, c0.w);
        dequant4(v.z, s, c1.x, c1.y);
        dequant4(v.w, s, c1.z, c1.w);
        const int up = c >> 2;  // 1: the upper chunk first
        const ptx::u32x4 f = up ? c1 : c0, l = up ? c0 : c1;
        uint8_t* dst = smem + row * kRowBytes;
        const int sw = swz(row);
        *reinterpret_cast<ptx::u32x4*>(dst + (((2 * c + up) ^ sw) << 4)) = f;
        *reinterpret_cast<ptx::u32x4*>(dst + (((2 * c + 1 - up) ^ sw) << 4)) = l;
    }

    static GLM5_DEVICE uint32_t word(const ptx::u32x4& v, int w) {
        return w == 0 ? v.x : w == 1 ? v.y : w == 2 ? v.z : v.w;
    }

    // Byte offset (inside the weight smem) of this lane's ldmatrix row for m16 tile `mtile`
    // (0..7 within the 128 columns), K block kb, MMA step s. Matrix i = lane / 8 (bit 0: upper 8
    // columns, bit 1: logical k + 8), row r = lane % 8 = logical k (mod 8) of the matrix.
    static GLM5_DEVICE int a_offset(int lane, int mtile, int kb, int s) {
        const int i = lane >> 3, r = lane & 7;
        const int kl = 8 * (r >> 1) + 4 * s + 2 * (i >> 1) + (r & 1);
        const int ch = 2 * mtile + (i & 1);
        return (kb * 32 + kl) * kRowBytes + ((ch ^ swz(kl)) << 4);
    }

    static GLM5_DEVICE void load_b(ptx::u32x4 (&b)[kNT], const uint16_t* q_lane, int64_t tok_stride, int tok0, int ntv,
                                   int num_tokens, int g, int kb) {
#pragma unroll
        for (int nt = 0; nt < kNT; ++nt) {
            const int tok = tok0 + nt * 8 + g;
            if (nt < ntv) {
                b[nt] = tok < num_tokens ? ptx::ld_global_v4(q_lane + tok * tok_stride + kb * 32) : ptx::u32x4{0u, 0u, 0u, 0u};
            }
        }
    }

    // The 256 GEMM threads (tid in [0, 256)) call this after issue_weight_copies (W8: issue_weight_copies_w8,
    // by the same tid) and griddepcontrol.wait.
    static GLM5_DEVICE void run(uint8_t* smem, const D2Ptrs& p, int head, int ntile, int tid) {
        const int lane = tid & 31, warp = tid >> 5, g = lane >> 2, t = lane & 3;
        const int mg = warp % kMGroups, tg = warp / kMGroups;
        const int m = p.num_tokens;
        const int nchunks = (m + kChunkTok - 1) / kChunkTok;
        const int npasses = (nchunks + kTGroups - 1) / kTGroups;
        const uint32_t wbase = ptx::smem_addr(smem);
        uint8_t* stage = smem + kWBytes + warp * kStageBytes;
        const int64_t tok_stride = static_cast<int64_t>(p.num_heads) * kNope;
        const uint16_t* q_lane = p.q_nope + static_cast<int64_t>(head) * kNope + 8 * t;

        int a_off[2][kMT];
#pragma unroll
        for (int s = 0; s < 2; ++s)
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) a_off[s][mt] = a_offset(lane, mg * kMT + mt, 0, s);

        for (int pass = 0; pass < npasses; ++pass) {
            const int tok0 = (pass * kTGroups + tg) * kChunkTok;
            const int ntv = tok0 < m ? min(kNT, (m - tok0 + 7) / 8) : 0;  // n8 tiles holding a token (warp-uniform)

            float acc[kMT][kNT][4];
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt)
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt)
#pragma unroll
                    for (int i = 0; i < 4; ++i) acc[mt][nt][i] = 0.0f;

            ptx::u32x4 bcur[kNT], bnext[kNT];
#pragma unroll
            for (int nt = 0; nt < kNT; ++nt) bcur[nt] = bnext[nt] = ptx::u32x4{0u, 0u, 0u, 0u};
            load_b(bcur, q_lane, tok_stride, tok0, ntv, m, g, 0);

#pragma unroll
            for (int kb = 0; kb < kKBlocks; ++kb) {
                if (pass == 0) {  // CTA-uniform: every warp runs pass 0
                    ptx::cp_async_wait_dyn(kKBlocks - 1 - kb);  // a constant once unrolled
                    if constexpr (kW8) convert_block_w8(smem, kb, tid);  // own chunk: no barrier before
                    ptx::named_barrier_sync<kBarrierId, kThreads>();
                }
                if (kb + 1 < kKBlocks) load_b(bnext, q_lane, tok_stride, tok0, ntv, m, g, kb + 1);
                if (ntv > 0) {
#pragma unroll
                    for (int s = 0; s < 2; ++s) {
#pragma unroll
                        for (int mt = 0; mt < kMT; ++mt) {
                            uint32_t a[4];
                            ptx::ldmatrix_x4_trans(a, wbase + a_off[s][mt] + kb * 32 * kRowBytes);
#pragma unroll
                            for (int nt = 0; nt < kNT; ++nt) {
                                if (nt < ntv)
                                    ptx::mma_m16n8k16_bf16(acc[mt][nt], a[0], a[1], a[2], a[3], word(bcur[nt], 2 * s),
                                                           word(bcur[nt], 2 * s + 1));
                            }
                        }
                    }
                }
                if (kb + 1 < kKBlocks) {
#pragma unroll
                    for (int nt = 0; nt < kNT; ++nt) bcur[nt] = bnext[nt];
                }
            }

            if (ntv == 0) continue;  // warp-uniform; no barrier below
            // epilogue: C fragments -> staging [token][latent] bf16 -> 16-byte rows of q_lat
            uint16_t* st = reinterpret_cast<uint16_t*>(stage);
#pragma unroll
            for (int mt = 0; mt < kMT; ++mt) {
#pragma unroll
                for (int nt = 0; nt < kNT; ++nt) {
                    const int n = mt * 16 + g, tk = nt * 8 + 2 * t;
                    const uint32_t lo = ptx::f32x2_to_bf16x2_rn(acc[mt][nt][0], acc[mt][nt][1]);  // (n, tk), (n, tk+1)
                    const uint32_t hi = ptx::f32x2_to_bf16x2_rn(acc[mt][nt][2], acc[mt][nt][3]);  // (n+8, tk), (n+8, tk+1)
                    constexpr int P = kStagePitch / 2;
                    st[tk * P + n] = static_cast<uint16_t>(lo & 0xffffu);
                    st[(tk + 1) * P + n] = static_cast<uint16_t>(lo >> 16);
                    st[tk * P + n + 8] = static_cast<uint16_t>(hi & 0xffffu);
                    st[(tk + 1) * P + n + 8] = static_cast<uint16_t>(hi >> 16);
                }
            }
            __syncwarp();
            constexpr int kChunksPerRow = kMT * 2;  // 16-byte chunks per staged token row
            const int64_t hs = p.q_lat_head_stride > 0 ? p.q_lat_head_stride : kKvLora;
            uint16_t* out_col = p.q_lat + static_cast<int64_t>(head) * hs + ntile * kNTile + mg * kMT * 16;
#pragma unroll
            for (int i = lane; i < kChunkTok * kChunksPerRow; i += 32) {
                const int tk = i / kChunksPerRow, c = i % kChunksPerRow;
                const int tok = tok0 + tk;
                if (tok < m) {
                    const ptx::u32x4 v = *reinterpret_cast<const ptx::u32x4*>(stage + tk * kStagePitch + c * 16);
                    ptx::st_global_v4(out_col + static_cast<int64_t>(tok) * p.num_heads * hs + c * 8, v);
                }
            }
            __syncwarp();
        }
    }
};

template <int kKvLora, int kRope>
struct D2KvStoreWarp {
    static constexpr int kRow = kKvLora + kRope;            // bf16 per cache row
    static constexpr int kCkvChunks = kKvLora * 2 / 16;     // 16-byte chunks of c_kv
    static constexpr int kCkvIters = (kCkvChunks + 31) / 32;
    static constexpr int kPairs = kRope / 2;

    static_assert(kKvLora % 8 == 0 && (kRow * 2) % 16 == 0, "rows must be whole 16-byte chunks");
    static_assert(kRope % 2 == 0 && kPairs <= 32, "rope dims: even, at most 64 (one pair per lane)");

    // One warp stores token `token`'s row. positions / out_cache_loc are int64 (idx64 != 0) or int32.
    // kv2 (optional): the same row also into kv2[loc2[token]] (int64 slots, skipped outside [0, num_slots2)): the QCAT
    // build writes SGLang's latent-KV pool in place next to the per-call scratch, so SGLang's own store can be skipped.
    static GLM5_DEVICE void run(const uint16_t* __restrict__ c_kv, const uint16_t* __restrict__ k_pe,
                                const void* positions, const void* out_cache_loc, int idx64,
                                const double* __restrict__ inv_freq, uint16_t* kv_cache, int64_t num_slots, int token,
                                int lane, uint16_t* kv2 = nullptr, const int64_t* loc2 = nullptr,
                                int64_t num_slots2 = 0) {
        int64_t pos, slot, slot2 = -1;
        if (idx64) {
            pos = ptx::ld_global_s64(static_cast<const int64_t*>(positions) + token);
            slot = ptx::ld_global_s64(static_cast<const int64_t*>(out_cache_loc) + token);
        } else {
            pos = ptx::ld_global_s32(static_cast<const int32_t*>(positions) + token);
            slot = ptx::ld_global_s32(static_cast<const int32_t*>(out_cache_loc) + token);
        }
        if (kv2 != nullptr) slot2 = ptx::ld_global_s64(loc2 + token);
        ptx::u32x4 ckv[kCkvIters];
#pragma unroll
        for (int j = 0; j < kCkvIters; ++j) {
            const int c = lane + 32 * j;
            if (c < kCkvChunks) ckv[j] = ptx::ld_global_v4(c_kv + static_cast<int64_t>(token) * kKvLora + c * 8);
        }
        uint32_t kp = 0;
        double freq = 0.0;
        if (lane < kPairs) {
            kp = ptx::ld_global_u32(k_pe + static_cast<int64_t>(token) * kRope + 2 * lane);
            freq = inv_freq[lane];
        }
        const bool ok1 = slot >= 0 && slot < num_slots;             // warp-uniform
        const bool ok2 = kv2 != nullptr && slot2 >= 0 && slot2 < num_slots2;
        if (!ok1 && !ok2) return;
        uint32_t roped = 0;
        if (lane < kPairs) {
            double sd, cd;
            sincos(static_cast<double>(pos) * freq, &sd, &cd);
            const float cs = static_cast<float>(cd), sn = static_cast<float>(sd);
            const float x0 = ptx::bf16lo_to_f32(kp), x1 = ptx::bf16hi_to_f32(kp);
            const float o0 = __fsub_rn(__fmul_rn(x0, cs), __fmul_rn(x1, sn));
            const float o1 = __fadd_rn(__fmul_rn(x1, cs), __fmul_rn(x0, sn));
            roped = ptx::f32x2_to_bf16x2_rn(o0, o1);
        }
        if (ok1) store_row(kv_cache + slot * kRow, ckv, roped, lane);
        if (ok2) store_row(kv2 + slot2 * kRow, ckv, roped, lane);
    }

    static GLM5_DEVICE void store_row(uint16_t* row, const ptx::u32x4 (&ckv)[kCkvIters], uint32_t roped, int lane) {
#pragma unroll
        for (int j = 0; j < kCkvIters; ++j) {
            const int c = lane + 32 * j;
            if (c < kCkvChunks) ptx::st_global_v4(row + c * 8, ckv[j]);
        }
        if (lane < kPairs) ptx::st_global_u32(row + kKvLora + 2 * lane, roped);
    }
};

}  // namespace attn_pre
}  // namespace glm5
