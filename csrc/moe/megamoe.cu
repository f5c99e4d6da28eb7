// Launchers of MegaMoE for Hopper (megamoe.cuh): the plan kernel (1 CTA of 1024 threads: token lists
// per expert, ordered task list, counter resets) and the persistent kernel (one CTA of 384 threads per
// SM). Compile-time configuration (part of the JIT cache key), chosen per token bucket by
// glm5_fastpath/moe/megamoe.py:
//   GLM5_MEGAMOE_HIDDEN   H (multiple of 256; GLM-5 6144, small preset 512)
//   GLM5_MEGAMOE_INTER    I, expert intermediate size (multiple of 128; GLM-5 2048, small preset 128)
//   GLM5_MEGAMOE_BN       token block = wgmma N: 8, 16, 32, 64, or 128 (the wide mode: 128-row tiles)
//   GLM5_MEGAMOE_STAGES   pipeline stages (32 KB of weights (wide: 16) + BN x 128 B of activations each)
//   GLM5_MEGAMOE_POOL     1: token pool + one TMA box of activations per stage (tm_pool / tm_act), else cp.async
//                         gathers (megamoe.cuh kPool)
// Launch order on one stream: glm5_megamoe_plan <<<1, 1024>>> then glm5_megamoe <<<num_SMs, 384,
// Smem::kAlloc>>> with PDL; both take the same Params. Both wait for their predecessor
// (griddepcontrol.wait) before touching the workspace, so back-to-back launches (CUDA-graph replays
// included) need no memset.
#include "megamoe.cuh"

#ifndef GLM5_MEGAMOE_HIDDEN
#define GLM5_MEGAMOE_HIDDEN 6144
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

using MegaMoE = glm5::moe::megamoe::MegaMoE<GLM5_MEGAMOE_HIDDEN, GLM5_MEGAMOE_INTER, GLM5_MEGAMOE_BN,
                                            GLM5_MEGAMOE_STAGES>;

extern "C" __global__ void __launch_bounds__(glm5::moe::megamoe::kPlanThreads, 1)
glm5_megamoe_plan(const glm5::moe::megamoe::Params p) {
    __shared__ MegaMoE::PlanSmem s;
    MegaMoE::plan(p, s);
}

extern "C" __global__ void __launch_bounds__(glm5::moe::megamoe::kThreads, 1)
glm5_megamoe(const __grid_constant__ CUtensorMap tm_w13,  // 5-D view of w13 [E_tot, 2I, H] e4m3, box {128, 8, 2, 16, 1} (wide: {128, 8, 2, 8, 1})
             const __grid_constant__ CUtensorMap tm_w2,   // [E_tot * H, I] e4m3, box {128, 256} (wide: {128, 128}), 128B swizzle
             const __grid_constant__ CUtensorMap tm_pool, // pool [pairs_cap, H] e4m3, box {128, BN}, 128B swizzle (GLM5_MEGAMOE_POOL)
             const __grid_constant__ CUtensorMap tm_act,  // act [pairs_cap, I] e4m3, box {128, BN}, 128B swizzle (idem)
             const glm5::moe::megamoe::Params p) {
    extern __shared__ __align__(1024) uint8_t smem[];
    MegaMoE::run(&tm_w13, &tm_w2, &tm_pool, &tm_act, p, smem);
}

#if GLM5_MEGAMOE_TRACE
// Trace build only (GLM5_MEGAMOE_TRACE=1): the same kernel, stamping each claimed task (megamoe.cuh TraceBuf).
extern "C" __global__ void __launch_bounds__(glm5::moe::megamoe::kThreads, 1)
glm5_megamoe_trace(const __grid_constant__ CUtensorMap tm_w13, const __grid_constant__ CUtensorMap tm_w2,
                   const __grid_constant__ CUtensorMap tm_pool, const __grid_constant__ CUtensorMap tm_act,
                   const glm5::moe::megamoe::Params p,
                   int64_t* trace,     // [num_SMs][trace_cap][kTraceCols] int64, zero-filled by the host
                   int32_t trace_cap) {
    extern __shared__ __align__(1024) uint8_t smem[];
    MegaMoE::run(&tm_w13, &tm_w2, &tm_pool, &tm_act, p, smem, glm5::moe::megamoe::TraceBuf{trace, trace_cap});
}
#endif
