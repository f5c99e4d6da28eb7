// MLA V up-projection + 1x128 FP8 quant (mla_v_up.cuh), one launcher per token-tile build: glm5_mla_v_up_nt{1,2,4,8}
// for T <= 8, 16, 32, 64 tokens. T, H, V / 128 and the strides are kernel arguments.
// Launch: grid (H * V / 128, 1, 1), block (256, 1, 1), dynamic shared memory VUpTile<kNT>::kSmemBytes (the Python launcher
// computes the same: ops/mla_v_up.py smem_bytes).
// PDL: dependents may launch at entry (o_proj's GEMM then prefetches its weights while this runs); the tile's W_UV
// slice is copied into shared memory BEFORE griddepcontrol.wait (weights: nothing writes them), o only after it.
#include "mla_v_up.cuh"

#include "../common/pdl.cuh"

template <int kNT>
GLM5_DEVICE void mla_v_up_entry(const glm5::attn_core::VUpParams& p) {
    using Tile = glm5::attn_core::VUpTile<kNT>;
    extern __shared__ __align__(128) uint8_t smem[];
    glm5::ptx::griddep_launch_dependents();
    Tile::load_weights(p, blockIdx.x, smem);
    glm5::ptx::griddep_wait();  // o is the previous kernel's output; y / y8 / ys may still be read by it
    Tile::run(p, blockIdx.x, smem);
}

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/mla_v_up.py, _kernel_args).
#define GLM5_MLA_V_UP_KERNEL(NT)                                                                                     \
    extern "C" __global__ void __launch_bounds__(256, 1) glm5_mla_v_up_nt##NT(                                      \
        const uint16_t* __restrict__ o, const uint16_t* __restrict__ w_vc, uint16_t* __restrict__ y,                \
        uint8_t* __restrict__ y8, float* __restrict__ ys, int64_t o_stride_t, int64_t o_stride_h,                   \
        int64_t w_stride_h, int64_t w_stride_v, int32_t num_tokens, int32_t num_heads, int32_t v_blocks, float eps) { \
        const glm5::attn_core::VUpParams p{o, w_vc, y, y8, ys, o_stride_t, o_stride_h, w_stride_h, w_stride_v,      \
                                           num_tokens, num_heads, v_blocks, eps};                                   \
        mla_v_up_entry<NT>(p);                                                                                       \
    }

GLM5_MLA_V_UP_KERNEL(1)
GLM5_MLA_V_UP_KERNEL(2)
GLM5_MLA_V_UP_KERNEL(4)
GLM5_MLA_V_UP_KERNEL(8)

static_assert(glm5::attn_core::VUpTile<1>::kSmemBytes == 128 * 1088 + 8 * (1088 + 272) + 16 &&
                  glm5::attn_core::VUpTile<8>::kSmemBytes == 128 * 1088 + 64 * (1088 + 272) + 16,
              "shared memory: glm5_fastpath/ops/mla_v_up.py smem_bytes");
