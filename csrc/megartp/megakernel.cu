// MegaRTP persistent megakernel (version 1), compiled per model config. Compile-time configuration
// (part of the JIT cache key; glm5_fastpath/attn_pre/megartp/device.py kernel_spec):
//   GLM5_MRTP_H      hidden_size       (6144 GLM-5, 512 small preset)
//   GLM5_MRTP_Q      q_lora_rank       (2048, 256)
//   GLM5_MRTP_KV     kv_lora_rank      (512, 128)
//   GLM5_MRTP_R      qk_rope_head_dim  (64, 32)
//   GLM5_MRTP_NOPE   qk_nope_head_dim  (192, 64)
//   GLM5_MRTP_IH     index_n_heads     (32, 4)
//   GLM5_MRTP_ID     index_head_dim    (128, 64)
//   GLM5_MRTP_TOPK   index_topk        (2048)
//   GLM5_MRTP_TRACE  1: record fetched / inputs-ready / done per instruction (%globaltimer)
// Launch: grid (num_queues) <= SMs (one resident CTA per SM: every queue must make progress),
// block (288) = 8 worker warps + 1 controller warp, dynamic shared memory = the largest family
// (device.py dynamic_smem_bytes), no PDL (the kernel is the whole step).
#include "megakernel.cuh"

#ifndef GLM5_MRTP_H
#define GLM5_MRTP_H 6144
#endif
#ifndef GLM5_MRTP_Q
#define GLM5_MRTP_Q 2048
#endif
#ifndef GLM5_MRTP_KV
#define GLM5_MRTP_KV 512
#endif
#ifndef GLM5_MRTP_R
#define GLM5_MRTP_R 64
#endif
#ifndef GLM5_MRTP_NOPE
#define GLM5_MRTP_NOPE 192
#endif
#ifndef GLM5_MRTP_IH
#define GLM5_MRTP_IH 32
#endif
#ifndef GLM5_MRTP_ID
#define GLM5_MRTP_ID 128
#endif
#ifndef GLM5_MRTP_TOPK
#define GLM5_MRTP_TOPK 2048
#endif
#ifndef GLM5_MRTP_TRACE
#define GLM5_MRTP_TRACE 0
#endif

using MegaDims = glm5::megartp::Dims<GLM5_MRTP_H, GLM5_MRTP_Q, GLM5_MRTP_KV, GLM5_MRTP_R, GLM5_MRTP_NOPE, GLM5_MRTP_IH, GLM5_MRTP_ID,
                                           GLM5_MRTP_TOPK>;

extern "C" __global__ void __launch_bounds__(glm5::megartp::kThreads, 1)
glm5_megartp(const __grid_constant__ glm5::megartp::MegaParams p) {
    glm5::megartp::megakernel_body<MegaDims, GLM5_MRTP_TRACE != 0>(p);
}
