// Standalone D2 kernel: W_UK absorption + k_pe RoPE + MLA latent KV store.
// One CTA per (head, 128-column latent tile): 8 GEMM warps (D2AbsorbTile) + 1 KV warp
// (D2KvStoreWarp, tokens blockIdx.x, blockIdx.x + gridDim.x, ...). Compile-time configuration
// (in the JIT cache key):
//   GLM5_D2_NOPE     qk_nope_head_dim (multiple of 32, <= 256; 192 for GLM-5, 64 small preset)
//   GLM5_D2_KV_LORA  kv_lora_rank (multiple of 128; 512 for GLM-5, 128 small preset)
//   GLM5_D2_ROPE     qk_rope_head_dim (even, <= 64; 64 for GLM-5, 32 small preset)
//   GLM5_D2_MT       m16 latent tiles per warp (1: M <= 32, 2: larger M)
//   GLM5_D2_NT       n8 token tiles per warp pass
//   GLM5_D2_W8       1: the W8A16 build, kernel glm5_d2_absorb_kv_store_w8, whose weight is W_UK in FP8 form
//                    (w_kc8 e4m3 + w_kc_scale fp32 per row and 128-column block, rebuilt in smem to the bf16
//                    bits bf16_rn(fp32(e4m3) * s): D2AbsorbTile<..., kW8 = true>); unset / 0: the bf16 build
//                    (the define is only passed for W8, so the bf16 build's defines are those of before)
//   GLM5_D2_QCAT     1: the QCAT build (kernel name + "_qcat"): q_lat is written as the first KV_LORA columns of
//                    q_cat [M, heads, KV_LORA + ROPE] (the sparse MLA's query rows), each head-0..heads-1 CTA of the
//                    last latent tile copies q_pe [M, heads, ROPE] into the last ROPE columns, and the KV warp
//                    also stores each token's latent-KV row into kv_pool[pool_loc[m]] (SGLang's bf16 MLA pool, in
//                    place; pool_loc int64). Four parameters follow num_heads / idx64 (below). Unset / 0: the
//                    builds of before (same defines, same parameters).
// Launch: grid (heads * KV_LORA / 128, 1, 1), block (288, 1, 1), dynamic shared memory
// D2Tile::kSmemBytes (needs the >48 KB opt-in; W8: + NOPE * 160 B, the e4m3 tile and the scale slots); PDL-ready.
#include "d2_absorb_kv_store.cuh"

#ifndef GLM5_D2_NOPE
#define GLM5_D2_NOPE 192
#endif
#ifndef GLM5_D2_KV_LORA
#define GLM5_D2_KV_LORA 512
#endif
#ifndef GLM5_D2_ROPE
#define GLM5_D2_ROPE 64
#endif
#ifndef GLM5_D2_MT
#define GLM5_D2_MT 1
#endif
#ifndef GLM5_D2_NT
#define GLM5_D2_NT 4
#endif
#ifndef GLM5_D2_W8
#define GLM5_D2_W8 0
#endif
#ifndef GLM5_D2_QCAT
#define GLM5_D2_QCAT 0
#endif
static_assert(!GLM5_D2_QCAT || GLM5_D2_ROPE % 8 == 0, "QCAT: q_pe rows are copied in 16-byte pieces");

using D2Tile = glm5::attn_pre::D2AbsorbTile<GLM5_D2_NOPE, GLM5_D2_KV_LORA, GLM5_D2_MT, GLM5_D2_NT, /*barrier*/ 1,
                                            /*kW8*/ GLM5_D2_W8 != 0>;
using D2Kv = glm5::attn_pre::D2KvStoreWarp<GLM5_D2_KV_LORA, GLM5_D2_ROPE>;
constexpr int kD2Threads = D2Tile::kThreads + 32;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/d2_absorb.py,
// _kernel_args; W8: the weight pointer is replaced by w_kc8, w_kc_scale); the runtime checks sizes against
// the cubin at load.
#if GLM5_D2_QCAT && GLM5_D2_W8
#define GLM5_D2_KERNEL glm5_d2_absorb_kv_store_w8_qcat
#elif GLM5_D2_QCAT
#define GLM5_D2_KERNEL glm5_d2_absorb_kv_store_qcat
#elif GLM5_D2_W8
#define GLM5_D2_KERNEL glm5_d2_absorb_kv_store_w8
#else
#define GLM5_D2_KERNEL glm5_d2_absorb_kv_store
#endif

extern "C" __global__ void __launch_bounds__(kD2Threads, 2)
GLM5_D2_KERNEL(const uint16_t* __restrict__ q_nope,  // [M, heads, NOPE] bf16
#if GLM5_D2_W8
               const uint8_t* __restrict__ w_kc8,     // [heads, NOPE, KV_LORA] e4m3
               const float* __restrict__ w_kc_scale,  // [heads, NOPE, KV_LORA / 128] fp32
#else
               const uint16_t* __restrict__ w_kc,     // [heads, NOPE, KV_LORA] bf16
#endif
                        const uint16_t* __restrict__ c_kv,    // [M, KV_LORA] bf16
                        const uint16_t* __restrict__ k_pe,    // [M, ROPE] bf16
                        const void* positions,                // [M] int64 or int32 (idx64)
                        const void* out_cache_loc,            // [M] int64 or int32 (idx64)
                        const double* __restrict__ inv_freq,  // [ROPE / 2] float64
                        uint16_t* kv_cache,                   // [num_slots, KV_LORA + ROPE] bf16, rows written in place
                        uint16_t* __restrict__ q_lat,         // [M, heads, KV_LORA] bf16 (QCAT: q_cat, KV_LORA + ROPE)
                        int64_t num_slots, int32_t num_tokens, int32_t num_heads, int32_t idx64
#if GLM5_D2_QCAT
                        ,
                        const uint16_t* __restrict__ q_pe,     // [M, heads, ROPE] bf16 (D0's roped q_pe)
                        uint16_t* kv_pool,                     // [pool_slots, KV_LORA + ROPE] bf16, rows written in place
                        const int64_t* __restrict__ pool_loc,  // [M] int64
                        int64_t pool_slots
#endif
) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry"), both roles
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x;
    const int head = blockIdx.x / D2Tile::kNTiles, ntile = blockIdx.x % D2Tile::kNTiles;
    // GLM5_PDL_WAIT_AT=1: the generic prologue is only the tile coordinates; before the weight tile,
    // every thread (GEMM warps and the KV warp) before its role.
    glm5::ptx::griddep_wait_at<1>();

    // Prologue that does not depend on the previous kernel: stream this CTA's weight tile into smem.
#if GLM5_D2_W8
    if (tid < D2Tile::kThreads) D2Tile::issue_weight_copies_w8(smem, w_kc8, w_kc_scale, head, ntile, tid);
#else
    if (tid < D2Tile::kThreads) D2Tile::issue_weight_copies(smem, w_kc, head, ntile, tid);
#endif

    glm5::ptx::griddep_launch_dependents();
    glm5::ptx::griddep_wait();  // q_nope, c_kv, k_pe (and the cache rows) only after this

#if GLM5_D2_QCAT
    constexpr int kQRow = GLM5_D2_KV_LORA + GLM5_D2_ROPE;  // q_cat head row
    if (tid >= D2Tile::kThreads) {  // the KV warp: no barrier of the GEMM warps involves it
        const int lane = tid & 31;
        for (int tok = blockIdx.x; tok < num_tokens; tok += gridDim.x)
            D2Kv::run(c_kv, k_pe, positions, out_cache_loc, idx64, inv_freq, kv_cache, num_slots, tok, lane, kv_pool,
                      pool_loc, pool_slots);
        if (ntile == D2Tile::kNTiles - 1) {  // this head's q_pe rows -> q_cat[:, head, KV_LORA:] (the last tile's neighbours)
            constexpr int kChunks = GLM5_D2_ROPE / 8;
            for (int i = lane; i < num_tokens * kChunks; i += 32) {
                const int64_t row = static_cast<int64_t>(i / kChunks) * num_heads + head;
                const int c = i % kChunks;
                glm5::ptx::st_global_v4(q_lat + row * kQRow + GLM5_D2_KV_LORA + c * 8,
                                        glm5::ptx::ld_global_v4(q_pe + row * GLM5_D2_ROPE + c * 8));
            }
        }
        return;
    }
    const glm5::attn_pre::D2Ptrs p{q_nope, q_lat, num_tokens, num_heads, kQRow};
#else
    if (tid >= D2Tile::kThreads) {  // the KV warp: no barrier of the GEMM warps involves it
        for (int tok = blockIdx.x; tok < num_tokens; tok += gridDim.x)
            D2Kv::run(c_kv, k_pe, positions, out_cache_loc, idx64, inv_freq, kv_cache, num_slots, tok, tid & 31);
        return;
    }
    const glm5::attn_pre::D2Ptrs p{q_nope, q_lat, num_tokens, num_heads};
#endif
    D2Tile::run(smem, p, head, ntile, tid);
}
