// MLA's V up-projection (W_UV) of one head fused with the 1x128 FP8 quant of its output (o_proj's input):
//
//   y[t, h, v]      = bf16( sum_l o[t, h, l] * w_vc[h, l, v] )   fp32 accumulation of exact bf16 products
//   y8, ys[t, g]    = act_quant of y[t, 128 g : 128 g + 128]      (ActQuantGroupTile: bitwise act_quant_fp8(y))
//
// L = 512 (kv_lora_rank), V = v_head_dim a multiple of 128 (GLM-5: 256). Framework-free (raw pointers, bf16 as
// uint16_t). One tile = 128 output columns of one head (one FP8 group per token) for all tokens of the call, 8 warps
// (256 threads); tile index = head * (V / 128) + column block. The standalone launcher is mla_v_up.cu.
//
// Work split. The tile's 128 x 512 bf16 slice of W_UV (128 KB: one contiguous row of L per output column) is
// brought into shared memory by 128 one-row bulk copies (TMA engine, L2 evict-first: nothing reads it again this
// step), issued BEFORE the caller's griddepcontrol.wait, so the weights stream in while the previous kernel (the
// sparse-MLA combine) runs; rows are padded to 1088 B so the two rows a quarter-warp reads fall in different banks.
// (A first version held the slice in registers, loaded with ld.global: 8 us for 16.8 MB, 2x the floor: the loads an
// SM keeps in flight were the limit, not the bandwidth; H200, session 34 call 1.) After the wait the head's latent
// rows (T x 1 KB) are staged the same way with cp.async. Warp w owns output rows [16w, 16w + 16) of the tile and
// runs mma.sync m16n8k16 with weights on M and tokens on N. Its A fragments come from 16-byte shared loads: in
// 32-wide K chunk j, lane (g, t) reads K [32j + 8t, 32j + 8t + 8) of rows g and g + 8 and uses elements 0-3 for
// k-step 2j and 4-7 for k-step 2j + 1. That permutes K inside each chunk; the B fragments (tokens) are read with
// the same permutation, so the dot products are unchanged:
//   k-step 2j    : a = {W[g][e0 e1], W[g+8][e0 e1], W[g][e2 e3], W[g+8][e2 e3]},  b = {X[tok g][e0 e1], X[tok g][e2 e3]}
//   k-step 2j + 1: a = {W[g][e4 e5], W[g+8][e4 e5], W[g][e6 e7], W[g+8][e6 e7]},  b = {X[tok g][e4 e5], X[tok g][e6 e7]}
// with e_i = K index 32j + 8t + i. The fp32 accumulators are rounded to bf16 into a [T][136] staging array, and one
// half-warp per token quantises the tile's 128 values and stores y (16 B per lane), y8 (8 B) and the scale.
#pragma once

#include "../common/arch.cuh"
#include "../common/bulk_copy.cuh"
#include "../common/convert.cuh"
#include "../common/mma_bf16_sm80.cuh"
#include "../common/mma_f16.cuh"
#include "../common/ptx_cp_async.cuh"
#include "../common/vec_io.cuh"
#include "../moe/act_quant.cuh"

namespace glm5 {
namespace attn_core {

struct VUpParams {
    const uint16_t* o;     // [T, H, L] bf16: row stride o_stride_t, head stride o_stride_h, L contiguous
    const uint16_t* w_vc;  // head h, output v, latent l at w_vc + h * w_stride_h + v * w_stride_v + l
    uint16_t* y;           // [T, H * V] bf16, contiguous
    uint8_t* y8;           // [T, H * V] e4m3, contiguous
    float* ys;             // [T, H * V / 128] fp32, contiguous
    int64_t o_stride_t, o_stride_h, w_stride_h, w_stride_v;  // elements; multiples of 8 (16-byte rows)
    int32_t num_tokens;    // T, 1 .. 8 * kNT
    int32_t num_heads;     // H
    int32_t v_blocks;      // V / 128
    float eps;             // ACT_QUANT_EPS
    // W8 builds (kW8): W_UV read from SGLang's kv_b_proj itself, e4m3 [H * head_rows, L] with fp32 128x128 block
    // scales; head h's output v is row h * head_rows + nope + v. Unused (null / 0) in the bf16 builds.
    const uint8_t* w8;      // rows w8_stride bytes apart (a multiple of 16)
    const float* w8_scale;  // [ceil(H * head_rows / 128), w8_scale_stride] fp32
    int64_t w8_stride;
    int32_t w8_scale_stride;
    int32_t head_rows;      // qk_nope_head_dim + v_head_dim
    int32_t nope;           // qk_nope_head_dim
};

// kW8: the tile's W_UV rows are e4m3 (SGLang's kv_b_proj) + block scales, dequantised while building the A fragments
// (half the weight bytes and half the shared memory; the same bf16 weights as SGLang's, see dequant_e4m3x2_bf16x2).
template <int kNT, bool kW8 = false>  // n-tiles of 8 tokens: T <= 8 * kNT
struct VUpTile {
    static constexpr int kL = 512;
    static constexpr int kV = 128;
    static constexpr int kWarps = kV / 16;  // one 16-row m-tile per warp
    static constexpr int kThreads = kWarps * 32;
    static constexpr int kChunks = kL / 32;   // 16 chunks of 32 K, two k-steps each
    static constexpr int kMaxT = 8 * kNT;
    static constexpr int kRowBytes = kL * 2 + 64;     // staged latent row (and bf16 W row): 1024 B + 64 B (banks)
    // staged W row: bf16 as the latent rows; e4m3 512 B + 32 B, so the four rows of one 8-byte-load phase
    // (16 lanes: rows g..g+3, 32 B each) fall in different banks
    static constexpr int kWRowBytes = kW8 ? kL + 32 : kRowBytes;
    static constexpr int kYRow = kV + 8;              // staged output row (bf16): 272 B, 16-byte aligned
    static constexpr int kWBytes = kV * kWRowBytes;   // 139264 (bf16) / 69632 (e4m3)
    static constexpr int kXOffset = kWBytes;
    static constexpr int kYOffset = kXOffset + kMaxT * kRowBytes;
    static constexpr int kBarOffset = kYOffset + kMaxT * kYRow * 2;
    static constexpr int kSmemBytes = kBarOffset + 16;
    static_assert(kNT >= 1 && kNT <= 8, "1..8 token tiles");
    static_assert(kRowBytes % 16 == 0 && kWRowBytes % 16 == 0 && (kYRow * 2) % 16 == 0 && kBarOffset % 8 == 0,
                  "aligned staging");

    // W8: the block scales of this thread's two rows (g, g + 8 of its warp's m-tile) for the four 128-wide K blocks,
    // loaded with the weights before the PDL wait. Empty use in the bf16 builds.
    struct Scales {
        float lo[kL / 128], hi[kL / 128];
    };
    static_assert(kSmemBytes <= 227 * 1024, "shared memory of one CTA");

    // Before the caller's griddepcontrol.wait: arm the weight barrier and issue the tile's 128 row copies (threads
    // 0..127, one row each). Weights: nothing writes them while the step runs.
    static GLM5_DEVICE void load_weights(const VUpParams& p, int tile, uint8_t* smem, Scales& sc) {
        uint64_t* bar = reinterpret_cast<uint64_t*>(smem + kBarOffset);
        const int tid = threadIdx.x;
        if (tid == 0) {
            ptx::mbarrier_init(bar, 1);
            ptx::fence_mbarrier_init();
        }
        __syncthreads();
        constexpr uint32_t kRowCopy = kW8 ? kL : kL * 2;  // bytes of one W row
        if (tid == 0) ptx::mbarrier_arrive_expect_tx(bar, kV * kRowCopy);
        const int head = tile / p.v_blocks, vb = tile - head * p.v_blocks;
        if (tid < kV) {
            const void* row;
            if constexpr (kW8) {
                row = p.w8 + (static_cast<int64_t>(head) * p.head_rows + p.nope + vb * kV + tid) * p.w8_stride;
            } else {
                row = p.w_vc + static_cast<int64_t>(head) * p.w_stride_h + static_cast<int64_t>(vb * kV + tid) * p.w_stride_v;
            }
            ptx::bulk_copy_g2s_hint(smem + tid * kWRowBytes, row, kRowCopy, bar, ptx::l2_policy_evict_first());
        }
        if constexpr (kW8) {
            const int warp = tid >> 5, g = (tid & 31) >> 2;
            const int64_t r = static_cast<int64_t>(head) * p.head_rows + p.nope + vb * kV + warp * 16 + g;
            const float* s_lo = p.w8_scale + (r / 128) * p.w8_scale_stride;
            const float* s_hi = p.w8_scale + ((r + 8) / 128) * p.w8_scale_stride;
#pragma unroll
            for (int kb = 0; kb < kL / 128; ++kb) sc.lo[kb] = __ldg(s_lo + kb), sc.hi[kb] = __ldg(s_hi + kb);
        }
    }

    // After the caller's griddepcontrol.wait: everything that reads o and writes the outputs. All threads call it.
    static GLM5_DEVICE void run(const VUpParams& p, int tile, uint8_t* smem, const Scales& sc) {
        const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31;
        const int g = lane >> 2, t = lane & 3;
        const int T = p.num_tokens;
        const int head = tile / p.v_blocks;

        // Stage the head's latent rows (the previous kernel's output: coherent L2 reads via cp.async.cg).
        const uint8_t* ws = smem;
        uint8_t* xs = smem + kXOffset;
        uint16_t* ys_stage = reinterpret_cast<uint16_t*>(smem + kYOffset);
        for (int i = tid; i < T * (kL / 8); i += kThreads) {
            const int tok = i / (kL / 8), c = i % (kL / 8);
            const uint16_t* src = p.o + static_cast<int64_t>(tok) * p.o_stride_t +
                                  static_cast<int64_t>(head) * p.o_stride_h + 8 * c;
            ptx::cp_async_16(ptx::smem_addr(xs + tok * kRowBytes + 16 * c), src, 16u);
        }
        asm volatile("cp.async.commit_group;\ncp.async.wait_group 0;" ::: "memory");
        while (!ptx::mbarrier_try_wait_parity(reinterpret_cast<uint64_t*>(smem + kBarOffset), 0)) {
        }
        __syncthreads();  // every thread's latent copies landed; the weights' barrier phase is complete

        float acc[kNT][4];
#pragma unroll
        for (int n = 0; n < kNT; ++n) acc[n][0] = acc[n][1] = acc[n][2] = acc[n][3] = 0.0f;
        const uint8_t* wrow = ws + (warp * 16 + g) * kWRowBytes + (kW8 ? 8 : 16) * t;
#pragma unroll 4
        for (int j = 0; j < kChunks; ++j) {
            ptx::u32x4 lo, hi;  // rows g and g + 8 of the warp's m-tile, K [32j + 8t, +8), as bf16 pairs
            if constexpr (kW8) {
                uint32_t l0, l1, h0, h1;  // 8 e4m3 of each row
                asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];" : "=r"(l0), "=r"(l1) : "r"(ptx::smem_addr(wrow + 32 * j)));
                asm volatile("ld.shared.v2.b32 {%0, %1}, [%2];"
                             : "=r"(h0), "=r"(h1)
                             : "r"(ptx::smem_addr(wrow + 8 * kWRowBytes + 32 * j)));
                // 4 chunks of 32 per 128-wide scale block; selects, not an indexed load (the array stays in registers)
                const int kb = j >> 2;
                const float sl = kb == 0 ? sc.lo[0] : kb == 1 ? sc.lo[1] : kb == 2 ? sc.lo[2] : sc.lo[3];
                const float sh = kb == 0 ? sc.hi[0] : kb == 1 ? sc.hi[1] : kb == 2 ? sc.hi[2] : sc.hi[3];
                // bf16(f32(e) * s): exactly SGLang's dequantisation of kv_b (block_quant_dequant), so the W8 build
                // multiplies by the very bf16 W_UV SGLang keeps
                ptx::e4m3x4_to_bf16x4_scaled(l0, sl, lo.x, lo.y);
                ptx::e4m3x4_to_bf16x4_scaled(l1, sl, lo.z, lo.w);
                ptx::e4m3x4_to_bf16x4_scaled(h0, sh, hi.x, hi.y);
                ptx::e4m3x4_to_bf16x4_scaled(h1, sh, hi.z, hi.w);
            } else {
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(lo.x), "=r"(lo.y), "=r"(lo.z), "=r"(lo.w)
                             : "r"(ptx::smem_addr(wrow + 64 * j)));
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(hi.x), "=r"(hi.y), "=r"(hi.z), "=r"(hi.w)
                             : "r"(ptx::smem_addr(wrow + 8 * kWRowBytes + 64 * j)));
            }
#pragma unroll
            for (int n = 0; n < kNT; ++n) {
                const int tok = 8 * n + g;
                ptx::u32x4 x{0u, 0u, 0u, 0u};
                if (tok < T) {
                    const uint32_t a = ptx::smem_addr(xs + tok * kRowBytes + 64 * j + 16 * t);
                    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                                 : "=r"(x.x), "=r"(x.y), "=r"(x.z), "=r"(x.w)
                                 : "r"(a));
                }
                ptx::mma_m16n8k16_bf16(acc[n], lo.x, hi.x, lo.y, hi.y, x.x, x.y);
                ptx::mma_m16n8k16_bf16(acc[n], lo.z, hi.z, lo.w, hi.w, x.z, x.w);
            }
        }

        // C fragment: acc[n] = {y[v][tok], y[v][tok + 1], y[v + 8][tok], y[v + 8][tok + 1]}, v = 16 warp + g,
        // tok = 8n + 2t. Round to bf16 (what SGLang's bmm stores) into the staging rows.
        const int v = warp * 16 + g;
#pragma unroll
        for (int n = 0; n < kNT; ++n) {
            const int tok = 8 * n + 2 * t;
            const uint32_t lo = ptx::f32x2_to_bf16x2_rn(acc[n][0], acc[n][2]);  // (v, tok), (v + 8, tok)
            const uint32_t hi = ptx::f32x2_to_bf16x2_rn(acc[n][1], acc[n][3]);  // (v, tok + 1), (v + 8, tok + 1)
            if (tok < T) {
                ys_stage[tok * kYRow + v] = static_cast<uint16_t>(lo & 0xffffu);
                ys_stage[tok * kYRow + v + 8] = static_cast<uint16_t>(lo >> 16);
            }
            if (tok + 1 < T) {
                ys_stage[(tok + 1) * kYRow + v] = static_cast<uint16_t>(hi & 0xffffu);
                ys_stage[(tok + 1) * kYRow + v + 8] = static_cast<uint16_t>(hi >> 16);
            }
        }
        __syncthreads();

        // One aligned half-warp per token: quantise the tile's 128 values (act_quant_fp8's group math) and store.
        using Quant = moe::ActQuantGroupTile;
        const int half = tid >> 4, sub = tid & 15;
        const int64_t groups = static_cast<int64_t>(p.num_heads) * p.v_blocks;  // FP8 groups per token row
        for (int t0 = 0; t0 < T; t0 += kThreads / 16) {  // the same trip count in every thread (whole warps shuffle)
            const int tok = t0 + half;
            const bool valid = tok < T;
            ptx::u32x4 val{0u, 0u, 0u, 0u};
            if (valid) {
                const uint32_t a = ptx::smem_addr(ys_stage + tok * kYRow + 8 * sub);
                asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];"
                             : "=r"(val.x), "=r"(val.y), "=r"(val.z), "=r"(val.w)
                             : "r"(a));
            }
            uint32_t q_lo, q_hi;
            const float s = Quant::quantize(val, p.eps, q_lo, q_hi);
            if (valid) {
                const int64_t gi = static_cast<int64_t>(tok) * groups + tile;  // tile = this token's group index
                const int64_t off = gi * kV + 8 * sub;
                ptx::st_global_v4(p.y + off, val);
                ptx::st_global_v2(p.y8 + off, q_lo, q_hi);
                if (sub == 0) ptx::st_global_f32(p.ys + gi, s);
            }
        }
    }
};

}  // namespace attn_core
}  // namespace glm5
