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
#include "act_quant.cuh"
#include "router.cuh"

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
using ActQuantTile = glm5::moe::ActQuantGroupTile;

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
    const int tid = threadIdx.x;
    const int split = blockIdx.x, group = blockIdx.y;

    // Prologue that does not depend on the previous kernel: this lane's gate-weight fragments.
    RouterTile::Weights wr;
    RouterTile::load_weights(wr, gate, split, group, tid);

    glm5::ptx::griddep_launch_dependents();
    // h, the outputs and the workspace are touched only after this.
    glm5::ptx::griddep_wait();

    const int tile = blockIdx.z;
    if (tile * RouterTile::kTokTile >= num_tokens) return;  // whole CTA leaves together
    // The MoE's input quant rides along: the tile's rows over the split's 256 columns (2 quant groups each) are
    // dealt over the split's expert-group CTAs (q = group + kGroups * j), one aligned half-warp per quant group,
    // every warp of the CTA the same trip count (one pass for GLM-5: <= 64 groups over 8 CTAs x 16 half-warps).
    if (x8 != nullptr) {
        const int rows = min(RouterTile::kTokTile, num_tokens - tile * RouterTile::kTokTile);
        constexpr int kHalfWarps = RouterTile::kThreads / ActQuantTile::kLanesPerGroup;
        constexpr int kGroupsPerSplit = RouterTile::kKChunk / ActQuantTile::kGroup;
        for (int base = 0; base < rows * kGroupsPerSplit; base += RouterTile::kGroups * kHalfWarps) {
            const int q = base + group + RouterTile::kGroups * (tid / ActQuantTile::kLanesPerGroup);
            const bool valid = q < rows * kGroupsPerSplit;
            const int64_t row = tile * RouterTile::kTokTile + (valid ? q / kGroupsPerSplit : 0);
            const int64_t g = static_cast<int64_t>(split) * kGroupsPerSplit + (valid ? q % kGroupsPerSplit : 0);
            const int64_t gi = row * (GLM5_ROUTER_HIDDEN / ActQuantTile::kGroup) + g;
            ActQuantTile::run(h + row * GLM5_ROUTER_HIDDEN + g * ActQuantTile::kGroup, x8 + gi * ActQuantTile::kGroup,
                              x_scale + gi, tid & (ActQuantTile::kLanesPerGroup - 1), valid, quant_eps);
        }
    }
    const glm5::moe::RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                                  partials, counters, num_tokens, routed_scaling};
    RouterTile::run(wr, p, split, group, tile, scratch, tid);
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
    const int tid = threadIdx.x;
    RouterDecodeTile::Weights w;
    // a grid the launcher never makes (gate rows out of range, arrivals miscounted): leave before touching anything
    if (gridDim.x != RouterDecodeTile::kCtas || gridDim.z != 1) return;
    if constexpr (RouterDecodeTile::kSupported)
        RouterDecodeTile::load_weights(w, gate, blockIdx.x, tid);  // before the wait: weights are never written

    glm5::ptx::griddep_launch_dependents();
    glm5::ptx::griddep_wait();

    if constexpr (RouterDecodeTile::kSupported) {
        // the launcher never does these: the whole grid leaves (no arrival is counted, nothing is written)
        if (num_tokens < 1 || tokens_per_cta < 1 || tokens_per_cta > RouterDecodeTile::kMaxTokens ||
            static_cast<int>(gridDim.y) != (num_tokens + tokens_per_cta - 1) / tokens_per_cta)
            return;
        const int ctas = static_cast<int>(gridDim.x * gridDim.y);
        const int cta_lin = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
        if (x8 != nullptr) {  // h's 1x128 quant: the M x HIDDEN/128 groups dealt over every CTA's half-warps
            constexpr int kHalfWarps = RouterDecodeTile::kThreads / ActQuantTile::kLanesPerGroup;
            constexpr int kGpr = GLM5_ROUTER_HIDDEN / ActQuantTile::kGroup;
            const int total = num_tokens * kGpr;
            for (int base = 0; base < total; base += ctas * kHalfWarps) {
                const int gi = base + cta_lin * kHalfWarps + tid / ActQuantTile::kLanesPerGroup;
                const bool valid = gi < total;
                const int64_t row = valid ? gi / kGpr : 0, g = valid ? gi % kGpr : 0;
                ActQuantTile::run(h + row * GLM5_ROUTER_HIDDEN + g * ActQuantTile::kGroup,
                                  x8 + static_cast<int64_t>(valid ? gi : 0) * ActQuantTile::kGroup,
                                  x_scale + (valid ? gi : 0), tid & (ActQuantTile::kLanesPerGroup - 1), valid,
                                  quant_eps);
            }
        }
        const glm5::moe::RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                                      partials, counters, num_tokens, routed_scaling};
        const int m0 = static_cast<int>(blockIdx.y) * tokens_per_cta;
        RouterDecodeTile::run(w, p, blockIdx.x, scratch, tid, m0, min(num_tokens, m0 + tokens_per_cta), ctas);
    }
}
