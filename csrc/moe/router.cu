// Standalone MoE router kernel: one CTA of 256 threads per (K chunk, 32-expert group, 32-token tile),
// calling the tile function of router.cuh. Compile-time configuration (in the JIT cache key):
//   GLM5_ROUTER_HIDDEN   K = hidden size (multiple of 256; 6144 for GLM-5, 512 for the small preset)
//   GLM5_ROUTER_EXPERTS  N = routed experts (a multiple of 32, or a multiple of 4 up to 32; 256 / 16)
//   GLM5_ROUTER_TOPK     experts per token (8 / 4)
// Launch: grid (HIDDEN / 256, EXPERTS / 32 (or 1), ceil(M / 32)), block (256, 1, 1), no dynamic shared
// memory; M <= 256. PDL-ready: the gate weights are loaded before griddepcontrol.wait.
// Optional (x8 != nullptr): both kernels also write h's per-token 1x128 FP8 quant (x8 [M, HIDDEN] e4m3, x_scale
// [M, HIDDEN/128] fp32, act_quant.cuh's group tile: bit for bit glm5_act_quant_fp8), so the MoE after the router
// needs no separate quant kernel.
//   GLM5_ROUTER_PHASES   (diagnostic) thread 0 of every CTA writes %globaltimer (ns) at the phase marks of router.cuh
//                        into the __device__ array router_phase_ns[cta * 8 + i] (read back with cuModuleGetGlobal:
//                        glm5_fastpath.ops.moe_router.read_phases), column 7 the SM id; the first kMaxPhaseCtas CTAs
//                        (linear index x + X (y + Y z)) only. A separate cubin; the production build has no marks.
#include <stdint.h>
#if GLM5_ROUTER_PHASES
constexpr int kMaxPhaseCtas = 1024;
__device__ unsigned long long router_phase_ns[kMaxPhaseCtas * 8];
__device__ __forceinline__ unsigned long long router_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ unsigned int router_smid() {
    unsigned int r;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(r));
    return r;
}
#define GLM5_ROUTER_MARK(i)                                                                                      \
    do {                                                                                                         \
        const int cta_ = static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));      \
        if (threadIdx.x == 0 && cta_ < kMaxPhaseCtas) {                                                          \
            router_phase_ns[cta_ * 8 + (i)] = router_globaltimer();                                              \
            if ((i) == 0) router_phase_ns[cta_ * 8 + 7] = router_smid();                                         \
        }                                                                                                        \
    } while (0)
#endif
#include "router_kernels.cuh"

#ifndef GLM5_ROUTER_HIDDEN
#define GLM5_ROUTER_HIDDEN 6144
#endif
#ifndef GLM5_ROUTER_EXPERTS
#define GLM5_ROUTER_EXPERTS 256
#endif
#ifndef GLM5_ROUTER_TOPK
#define GLM5_ROUTER_TOPK 8
#endif

using RouterTile = glm5::moe::RouterTile<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>;
using RouterDecodeTile = glm5::moe::RouterDecodeTile<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/moe_router.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(RouterTile::kThreads)
glm5_moe_router(const uint16_t* __restrict__ h,       // [M, HIDDEN] bf16
                const uint16_t* __restrict__ gate,    // [EXPERTS, HIDDEN] bf16
                const float* __restrict__ bias,       // [EXPERTS] fp32
                float* __restrict__ logits,           // [M, EXPERTS] fp32
                int32_t* __restrict__ topk_ids,       // [M, TOPK] int32
                float* __restrict__ topk_weights,     // [M, TOPK] fp32
                float* __restrict__ scaled_weights,   // [M, TOPK] fp32 or nullptr
                float* __restrict__ partials,         // workspace fp32
                uint32_t* __restrict__ counters,      // workspace uint32 [kCounterWords], zero between launches
                int32_t num_tokens,
                float routed_scaling,
                uint8_t* __restrict__ x8,             // [M, HIDDEN] e4m3 or nullptr: h's 1x128 quant (act_quant.cuh)
                float* __restrict__ x_scale,          // [M, HIDDEN/128] fp32 (with x8)
                float quant_eps,
                int32_t tokens_per_cta) {             // the decode kernel's; unused here (one argument list)
    (void)tokens_per_cta;
    __shared__ __align__(16) float scratch[RouterTile::kScratchFloats];
    glm5::moe::router_splitk_body<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>(
        h, gate, bias, logits, topk_ids, topk_weights, scaled_weights, partials, counters, num_tokens, routed_scaling,
        x8, x_scale, quant_eps, scratch);
}

// Decode variant (1 <= M <= 256): grid (EXPERTS / RouterDecodeTile::kEpc, ceil(M / tokens_per_cta), 1), block
// (256, 1, 1), the same parameters plus tokens_per_cta (1..32; y slice y takes tokens [y t, y t + t)); partials
// unused; the arrival counter is counters[RouterTile::kCounterWords] (one more word).
// 3 CTAs per SM (<= 85 registers): the 3 x 128-CTA grid is one wave, so every CTA loads its gate weights before
// griddepcontrol.wait (ops.moe_router.DECODE_SLICES).
extern "C" __global__ void __launch_bounds__(RouterDecodeTile::kThreads, 3)
glm5_moe_router_decode(const uint16_t* __restrict__ h, const uint16_t* __restrict__ gate,
                       const float* __restrict__ bias, float* __restrict__ logits, int32_t* __restrict__ topk_ids,
                       float* __restrict__ topk_weights, float* __restrict__ scaled_weights,
                       float* __restrict__ partials, uint32_t* __restrict__ counters, int32_t num_tokens,
                       float routed_scaling, uint8_t* __restrict__ x8, float* __restrict__ x_scale,
                       float quant_eps, int32_t tokens_per_cta) {
    __shared__ __align__(16) float scratch[RouterTile::kScratchFloats];
    glm5::moe::router_decode_body<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>(
        h, gate, bias, logits, topk_ids, topk_weights, scaled_weights, partials, counters, num_tokens, routed_scaling,
        x8, x_scale, quant_eps, tokens_per_cta, scratch);
}
