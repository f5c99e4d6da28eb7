// MLA V up-projection + 1x128 FP8 quant (mla_v_up.cuh), one launcher per token-tile build: glm5_mla_v_up_nt{1,2,4,8}
// for T <= 8, 16, 32, 64 tokens. T, H, V / 128 and the strides are kernel arguments.
// Launch: grid (H * V / 128, 1, 1), block (256, 1, 1), dynamic shared memory VUpTile<kNT>::kSmemBytes (the Python launcher
// computes the same: ops/mla_v_up.py smem_bytes).
// PDL: dependents may launch at entry (o_proj's GEMM then prefetches its weights while this runs); the tile's W_UV
// slice is copied into shared memory BEFORE griddepcontrol.wait (weights: nothing writes them), o only after it.
#include "mla_v_up.cuh"

#include "../common/pdl.cuh"

template <int kNT, bool kW8>
GLM5_DEVICE void mla_v_up_entry(const glm5::attn_core::VUpParams& p) {
    using Tile = glm5::attn_core::VUpTile<kNT, kW8>;
    extern __shared__ __align__(128) uint8_t smem[];
    glm5::ptx::griddep_launch_dependents();
    typename Tile::Scales sc;
    Tile::load_weights(p, blockIdx.x, smem, sc);
    glm5::ptx::griddep_wait();  // o is the previous kernel's output; y / y8 / ys may still be read by it
    Tile::run(p, blockIdx.x, smem, sc);
}

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/mla_v_up.py, _kernel_args).
#define GLM5_MLA_V_UP_KERNEL(NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 1) glm5_mla_v_up_nt##NT(                                      \
        const uint16_t* __restrict__ o, const uint16_t* __restrict__ w_vc, uint16_t* __restrict__ y,                \
        uint8_t* __restrict__ y8, float* __restrict__ ys, int64_t o_stride_t, int64_t o_stride_h,                   \
        int64_t w_stride_h, int64_t w_stride_v, int32_t num_tokens, int32_t num_heads, int32_t v_blocks, float eps) { \
        const glm5::attn_core::VUpParams p{o, w_vc, y, y8, ys, o_stride_t, o_stride_h, w_stride_h, w_stride_v,      \
                                           num_tokens, num_heads, v_blocks, eps, nullptr, nullptr, 0, 0, 0, 0};     \
        mla_v_up_entry<NT, false>(p);                                                                                \
    }

GLM5_MLA_V_UP_KERNEL(1)
GLM5_MLA_V_UP_KERNEL(2)
GLM5_MLA_V_UP_KERNEL(4)
GLM5_MLA_V_UP_KERNEL(8)

// The W8 builds (glm5_mla_v_up_w8_nt*): W_UV read as SGLang's kv_b_proj rows (e4m3, [H * head_rows, L], rows
// w8_stride bytes apart) with their fp32 128x128 block scales ([ceil(H * head_rows / 128), w8_scale_stride]),
// dequantised to the bf16 SGLang's w_vc holds. Launch as above with VUpTile<kNT, true>::kSmemBytes.
#define GLM5_MLA_V_UP_W8_KERNEL(NT)                                                                                  \
    extern "C" __global__ void __launch_bounds__(256, 1) glm5_mla_v_up_w8_nt##NT(                                   \
        const uint16_t* __restrict__ o, const uint8_t* __restrict__ w8, const float* __restrict__ w8_scale,         \
        uint16_t* __restrict__ y, uint8_t* __restrict__ y8, float* __restrict__ ys, int64_t o_stride_t,             \
        int64_t o_stride_h, int64_t w8_stride, int32_t w8_scale_stride, int32_t head_rows, int32_t nope,            \
        int32_t num_tokens, int32_t num_heads, int32_t v_blocks, float eps) {                                       \
        const glm5::attn_core::VUpParams p{o, nullptr, y, y8, ys, o_stride_t, o_stride_h, 0, 0, num_tokens,         \
                                           num_heads, v_blocks, eps, w8, w8_scale, w8_stride, w8_scale_stride,      \
                                           head_rows, nope};                                                        \
        mla_v_up_entry<NT, true>(p);                                                                                 \
    }

GLM5_MLA_V_UP_W8_KERNEL(1)
GLM5_MLA_V_UP_W8_KERNEL(2)
GLM5_MLA_V_UP_W8_KERNEL(4)
GLM5_MLA_V_UP_W8_KERNEL(8)

static_assert(glm5::attn_core::VUpTile<1>::kSmemBytes == 128 * 1088 + 8 * (1088 + 272) + 16 &&
                  glm5::attn_core::VUpTile<8>::kSmemBytes == 128 * 1088 + 64 * (1088 + 272) + 16,
              "shared memory: glm5_fastpath/ops/mla_v_up.py smem_bytes");
static_assert(glm5::attn_core::VUpTile<1, true>::kSmemBytes == 128 * 544 + 8 * (1088 + 272) + 16 &&
                  glm5::attn_core::VUpTile<8, true>::kSmemBytes == 128 * 544 + 64 * (1088 + 272) + 16,
              "shared memory: glm5_fastpath/ops/mla_v_up.py smem_bytes(nt, w8=True)");
