// The MoE router whose last CTA also plans the MegaMoE launch that follows it (the work of glm5_megamoe_plan), so a
// decode MoE layer runs two kernels, router+plan -> glm5_megamoe, instead of router -> [act quant] -> plan -> MegaMoE.
// Why: in the engine the plan kernel sat on the critical path between the router and MegaMoE (5.5 us at 1 token,
// 8 us at 8 per MoE layer, H200 profile of 2026-12-01), most of it a second launch's wait and code fetch for a
// few hundred routing pairs.
//
// Both kernels are router.cu's (router_kernels.cuh, same tile code, bitwise the same ids / weights / logits / x8),
// plus the MegaMoE Params of the launch that follows; the CTA whose router body ran the top-k epilogue then runs
// MegaMoE::plan_body with its 256 threads over the ids it has just written, its router scratch reused as the plan's
// shared memory. The split-K kernel has one such CTA only with one token tile (M <= 32; the launcher's rule).
// MegaMoE is launched next with PDL; its griddepcontrol.wait covers this whole grid, plan included.
//
// Compile-time configuration: the router's (GLM5_ROUTER_*) and the MegaMoE build's (GLM5_MEGAMOE_*, see megamoe.cu):
// the plan depends on the token block, the pool build and H / I. Not for the EP build (its plan gathers across ranks).
#include "megamoe.cuh"
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
#ifndef GLM5_MEGAMOE_HIDDEN
#define GLM5_MEGAMOE_HIDDEN GLM5_ROUTER_HIDDEN
#endif
#ifndef GLM5_MEGAMOE_INTER
#define GLM5_MEGAMOE_INTER 2048
#endif
#ifndef GLM5_MEGAMOE_BN
#define GLM5_MEGAMOE_BN 16
#endif
#ifndef GLM5_MEGAMOE_STAGES
#define GLM5_MEGAMOE_STAGES 6
#endif

static_assert(GLM5_MEGAMOE_HIDDEN == GLM5_ROUTER_HIDDEN, "the router's h and MegaMoE's x are one hidden size");

using RouterTile = glm5::moe::RouterTile<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>;
using RouterDecodeTile = glm5::moe::RouterDecodeTile<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>;
using MegaMoE = glm5::moe::megamoe::MegaMoE<GLM5_MEGAMOE_HIDDEN, GLM5_MEGAMOE_INTER, GLM5_MEGAMOE_BN,
                                            GLM5_MEGAMOE_STAGES>;
using PlanSmem = MegaMoE::PlanSmem;

// The plan's shared memory is the router's scratch (free once the top-k epilogue has run), short of the arrival flag
// word at its end, which the last arrive_last's readers may still be reading when the plan starts.
static_assert(sizeof(PlanSmem) <= RouterTile::kWarps * RouterTile::kRedWarpFloats * sizeof(float),
              "the MegaMoE plan's shared memory fits the router scratch");
static_assert(RouterTile::kThreads == RouterDecodeTile::kThreads, "one CTA size");

// The last CTA: every thread's top-k stores (and reads of the scratch) before the plan reads the ids and reuses it.
static __device__ __forceinline__ void plan_in_last_cta(const glm5::moe::megamoe::Params& mp, float* scratch) {
    __syncthreads();
    MegaMoE::plan_body<RouterTile::kThreads>(mp, *reinterpret_cast<PlanSmem*>(scratch));
}

// Parameters: glm5_moe_router's (router.cu, same order), then the MegaMoE Params whose topk_ids / topk_w are this
// launch's topk_ids / topk_weights and whose x / x_scale are x8 / x_scale (or act_quant's output).
extern "C" __global__ void __launch_bounds__(RouterTile::kThreads)
glm5_moe_router_plan(const uint16_t* __restrict__ h, const uint16_t* __restrict__ gate, const float* __restrict__ bias,
                     float* __restrict__ logits, int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                     float* __restrict__ scaled_weights, float* __restrict__ partials, uint32_t* __restrict__ counters,
                     int32_t num_tokens, float routed_scaling, uint8_t* __restrict__ x8, float* __restrict__ x_scale,
                     float quant_eps, int32_t tokens_per_cta, const glm5::moe::megamoe::Params mp) {
    (void)tokens_per_cta;
    __shared__ __align__(16) float scratch[RouterTile::kScratchFloats];
    // one token tile only (the launcher's rule): its last CTA has every token's ids
    if (gridDim.z != 1) return;
    if (glm5::moe::router_splitk_body<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>(
            h, gate, bias, logits, topk_ids, topk_weights, scaled_weights, partials, counters, num_tokens,
            routed_scaling, x8, x_scale, quant_eps, scratch))
        plan_in_last_cta(mp, scratch);
}

extern "C" __global__ void __launch_bounds__(RouterDecodeTile::kThreads, 3)
glm5_moe_router_decode_plan(const uint16_t* __restrict__ h, const uint16_t* __restrict__ gate,
                            const float* __restrict__ bias, float* __restrict__ logits, int32_t* __restrict__ topk_ids,
                            float* __restrict__ topk_weights, float* __restrict__ scaled_weights,
                            float* __restrict__ partials, uint32_t* __restrict__ counters, int32_t num_tokens,
                            float routed_scaling, uint8_t* __restrict__ x8, float* __restrict__ x_scale,
                            float quant_eps, int32_t tokens_per_cta, const glm5::moe::megamoe::Params mp) {
    __shared__ __align__(16) float scratch[RouterTile::kScratchFloats];
    if (glm5::moe::router_decode_body<GLM5_ROUTER_HIDDEN, GLM5_ROUTER_EXPERTS, GLM5_ROUTER_TOPK>(
            h, gate, bias, logits, topk_ids, topk_weights, scaled_weights, partials, counters, num_tokens,
            routed_scaling, x8, x_scale, quant_eps, tokens_per_cta, scratch))
        plan_in_last_cta(mp, scratch);
}
