// Bodies of the router kernels (router.cu: the router alone; router_plan.cu: the router whose last CTA also plans the
// MegaMoE launch that follows). Template parameters instead of the .cu files' macros, so both units share one copy.
// Each body is the whole kernel but for the shared scratch, which the caller declares (router_plan.cu reuses it for
// the plan); it returns true in every thread of the CTA that ran the top-k epilogue (the last to arrive).
#pragma once

#include "act_quant.cuh"
#include "router.cuh"

namespace glm5 {
namespace moe {

// Split-K router: grid (H / 256, E / 32 (or 1), ceil(M / 32)), block 256. PDL-ready: the gate weights are loaded
// before griddepcontrol.wait. x8 != nullptr: h's per-token 1x128 FP8 quant rides along (act_quant.cuh's group tile).
template <int kHidden, int kExperts, int kTopK>
GLM5_DEVICE bool router_splitk_body(const uint16_t* __restrict__ h, const uint16_t* __restrict__ gate,
                                    const float* __restrict__ bias, float* __restrict__ logits,
                                    int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                                    float* __restrict__ scaled_weights, float* __restrict__ partials,
                                    uint32_t* __restrict__ counters, int32_t num_tokens, float routed_scaling,
                                    uint8_t* __restrict__ x8, float* __restrict__ x_scale, float quant_eps,
                                    float* scratch) {
    using Tile = RouterTile<kHidden, kExperts, kTopK>;
    using Quant = ActQuantGroupTile;
    const int tid = threadIdx.x;
    const int split = blockIdx.x, group = blockIdx.y;
    GLM5_ROUTER_MARK(0);

    // Prologue that does not depend on the previous kernel: this lane's gate-weight fragments.
    typename Tile::Weights wr;
    Tile::load_weights(wr, gate, split, group, tid);

    ptx::griddep_launch_dependents();
    // h, the outputs and the workspace are touched only after this.
    ptx::griddep_wait();
    GLM5_ROUTER_MARK(1);

    const int tile = blockIdx.z;
    if (tile * Tile::kTokTile >= num_tokens) return false;  // whole CTA leaves together
    // The MoE's input quant rides along: the tile's rows over the split's 256 columns (2 quant groups each) are
    // dealt over the split's expert-group CTAs (q = group + kGroups * j), one aligned half-warp per quant group,
    // every warp of the CTA the same trip count (one pass for GLM-5: <= 64 groups over 8 CTAs x 16 half-warps).
    if (x8 != nullptr) {
        const int rows = min(Tile::kTokTile, num_tokens - tile * Tile::kTokTile);
        constexpr int kHalfWarps = Tile::kThreads / Quant::kLanesPerGroup;
        constexpr int kGroupsPerSplit = Tile::kKChunk / Quant::kGroup;
        for (int base = 0; base < rows * kGroupsPerSplit; base += Tile::kGroups * kHalfWarps) {
            const int q = base + group + Tile::kGroups * (tid / Quant::kLanesPerGroup);
            const bool valid = q < rows * kGroupsPerSplit;
            const int64_t row = tile * Tile::kTokTile + (valid ? q / kGroupsPerSplit : 0);
            const int64_t g = static_cast<int64_t>(split) * kGroupsPerSplit + (valid ? q % kGroupsPerSplit : 0);
            const int64_t gi = row * (kHidden / Quant::kGroup) + g;
            Quant::run(h + row * kHidden + g * Quant::kGroup, x8 + gi * Quant::kGroup, x_scale + gi,
                       tid & (Quant::kLanesPerGroup - 1), valid, quant_eps);
        }
    }
    const RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                       partials, counters, num_tokens, routed_scaling};
    return Tile::run(wr, p, split, group, tile, scratch, tid);
}

// Decode router (1 <= M <= 256): grid (E / RouterDecodeTile::kEpc, ceil(M / tokens_per_cta), 1), block 256; grid
// row y takes tokens [y t, y t + t). Partials unused; the arrival counter is counters[RouterTile::kCounterWords].
template <int kHidden, int kExperts, int kTopK>
GLM5_DEVICE bool router_decode_body(const uint16_t* __restrict__ h, const uint16_t* __restrict__ gate,
                                    const float* __restrict__ bias, float* __restrict__ logits,
                                    int32_t* __restrict__ topk_ids, float* __restrict__ topk_weights,
                                    float* __restrict__ scaled_weights, float* __restrict__ partials,
                                    uint32_t* __restrict__ counters, int32_t num_tokens, float routed_scaling,
                                    uint8_t* __restrict__ x8, float* __restrict__ x_scale, float quant_eps,
                                    int32_t tokens_per_cta, float* scratch) {
    using Tile = RouterDecodeTile<kHidden, kExperts, kTopK>;
    using Quant = ActQuantGroupTile;
    const int tid = threadIdx.x;
    typename Tile::Weights w;
    // a grid the launcher never makes (gate rows out of range, arrivals miscounted): leave before touching anything
    if (gridDim.x != Tile::kCtas || gridDim.z != 1) return false;
    GLM5_ROUTER_MARK(0);
    if constexpr (Tile::kSupported) Tile::load_weights(w, gate, blockIdx.x, tid);  // before the wait: never written

    ptx::griddep_launch_dependents();
    ptx::griddep_wait();
    GLM5_ROUTER_MARK(1);

    if constexpr (Tile::kSupported) {
        // the launcher never does these: the whole grid leaves (no arrival is counted, nothing is written)
        if (num_tokens < 1 || tokens_per_cta < 1 || tokens_per_cta > Tile::kMaxTokens ||
            static_cast<int>(gridDim.y) != (num_tokens + tokens_per_cta - 1) / tokens_per_cta)
            return false;
        const int ctas = static_cast<int>(gridDim.x * gridDim.y);
        const int cta_lin = static_cast<int>(blockIdx.y * gridDim.x + blockIdx.x);
        if (x8 != nullptr) {  // h's 1x128 quant: the M x H/128 groups dealt over every CTA's half-warps
            constexpr int kHalfWarps = Tile::kThreads / Quant::kLanesPerGroup;
            constexpr int kGpr = kHidden / Quant::kGroup;
            const int total = num_tokens * kGpr;
            for (int base = 0; base < total; base += ctas * kHalfWarps) {
                const int gi = base + cta_lin * kHalfWarps + tid / Quant::kLanesPerGroup;
                const bool valid = gi < total;
                const int64_t row = valid ? gi / kGpr : 0, g = valid ? gi % kGpr : 0;
                Quant::run(h + row * kHidden + g * Quant::kGroup, x8 + static_cast<int64_t>(valid ? gi : 0) * Quant::kGroup,
                           x_scale + (valid ? gi : 0), tid & (Quant::kLanesPerGroup - 1), valid, quant_eps);
            }
        }
        const RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                           partials, counters, num_tokens, routed_scaling};
        const int m0 = static_cast<int>(blockIdx.y) * tokens_per_cta;
        return Tile::run(w, p, blockIdx.x, scratch, tid, m0, min(num_tokens, m0 + tokens_per_cta), ctas);
    }
    return false;
}

}  // namespace moe
}  // namespace glm5
