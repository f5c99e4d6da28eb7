// Bodies of the router kernels (router.cu: the router alone; router_plan.cu: the router whose last CTA also plans the
// MegaMoE launch that follows). Template parameters instead of the .cu files' macros, so both units share one copy.
// Each body is the whole kernel but for the shared scratch, which the caller declares (router_plan.cu reuses it for
// the plan); it returns true in every thread of the CTA that ran the top-k epilogue (the last to arrive).
#pragma once

#include "../common/opaque.cuh"
#include "act_quant.cuh"
#include "router.cuh"

// GLM5_WARM_CODE=1 (GLM5_FASTPATH_MOE_WARM_CODE=1): every CTA runs the top-k epilogue's code once, dry (no stores),
// before griddepcontrol.wait. Why: the epilogue runs in the one CTA that arrives last, right on the MoE layer's critical
// path, and its code is cold at every launch (the MoE weights streamed since the last layer evicted it from L2): ~3.4 us
// at 1 token against ~1 us of work (session 37, bench router --phases). The CTAs sit in griddepcontrol.wait under o_proj
// for tens of us, so the warm-up costs the chain nothing while they are resident early.
#ifndef GLM5_WARM_CODE
#define GLM5_WARM_CODE 0
#endif

namespace glm5 {
namespace moe {

// The split-K router after griddepcontrol.wait (router_splitk_body): h's quant share, this CTA's partial, the two
// arrival levels and (epilogue, in the tile's last CTA) the top-k epilogue. Returns true in that last CTA.
template <int kHidden, int kExperts, int kTopK>
GLM5_DEVICE bool splitk_own_part(const typename RouterTile<kHidden, kExperts, kTopK>::Weights& wr, const RouterPtrs& p,
                                 uint8_t* __restrict__ x8, float* __restrict__ x_scale, float quant_eps, float* scratch,
                                 int tid, bool epilogue = true) {
    using Tile = RouterTile<kHidden, kExperts, kTopK>;
    using Quant = ActQuantGroupTile;
    const int split = blockIdx.x, group = blockIdx.y;
    const int tile = blockIdx.z;
    const int num_tokens = p.num_tokens;
    const uint16_t* h = p.h;
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
    return Tile::run(wr, p, split, group, tile, scratch, tid, epilogue);
}

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
    const int tid = threadIdx.x;
    const int split = blockIdx.x, group = blockIdx.y;
    GLM5_ROUTER_MARK(0);
    const RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                       partials, counters, num_tokens, routed_scaling};
    typename Tile::Weights wr;
#if GLM5_WARM_CODE
    // As the decode kernel (below): pass 0 runs the epilogue dry (both pass widths: warp 0 two tokens, warps 1.. one;
    // logits row 0; no stores) before anything else, pass 1 is the kernel and, in the tile's last CTA, the real
    // epilogue, through the one call site.
#pragma unroll 1
    for (int pass = 0; pass < 2; ++pass) {
        const bool dry = ptx::opaque(pass) == 0;
        int tok_base = 0, valid = Tile::kWarps + 1;
        if (!dry) {
            Tile::load_weights(wr, gate, split, group, tid);
            ptx::griddep_launch_dependents();
            ptx::griddep_wait();
            GLM5_ROUTER_MARK(1);
            if (!splitk_own_part<kHidden, kExperts, kTopK>(wr, p, x8, x_scale, quant_eps, scratch, tid, false))
                return false;
            tok_base = static_cast<int>(blockIdx.z) * Tile::kTokTile;
            valid = min(Tile::kTokTile, num_tokens - tok_base);
        }
        Tile::topk_epilogue(p, tok_base, valid, tid >> 5, tid & 31, dry);
        if (!dry) {
            GLM5_ROUTER_MARK(4);
            return true;
        }
    }
    return false;
#else
    // Prologue that does not depend on the previous kernel: this lane's gate-weight fragments.
    Tile::load_weights(wr, gate, split, group, tid);

    ptx::griddep_launch_dependents();
    // h, the outputs and the workspace are touched only after this.
    ptx::griddep_wait();
    GLM5_ROUTER_MARK(1);
    return splitk_own_part<kHidden, kExperts, kTopK>(wr, p, x8, x_scale, quant_eps, scratch, tid);
#endif
}

// The decode router after griddepcontrol.wait (router_decode_body): launch checks, h's 1x128 quant, this CTA's logits,
// the arrival and (epilogue, in the last CTA) the top-k epilogue. Returns true in the last CTA.
template <int kHidden, int kExperts, int kTopK>
GLM5_DEVICE bool decode_own_part(const typename RouterDecodeTile<kHidden, kExperts, kTopK>::Weights& w,
                                 const RouterPtrs& p, uint8_t* __restrict__ x8, float* __restrict__ x_scale,
                                 float quant_eps, int32_t tokens_per_cta, float* scratch, int tid, bool epilogue = true) {
    using Tile = RouterDecodeTile<kHidden, kExperts, kTopK>;
    using Quant = ActQuantGroupTile;
    const int num_tokens = p.num_tokens;
    const uint16_t* h = p.h;
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
    const int m0 = static_cast<int>(blockIdx.y) * tokens_per_cta;
    return Tile::run(w, p, blockIdx.x, scratch, tid, m0, min(num_tokens, m0 + tokens_per_cta), ctas, epilogue);
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
    const int tid = threadIdx.x;
    typename Tile::Weights w;
    // a grid the launcher never makes (gate rows out of range, arrivals miscounted): leave before touching anything
    if (gridDim.x != Tile::kCtas || gridDim.z != 1) return false;
    GLM5_ROUTER_MARK(0);
#if GLM5_WARM_CODE
    if constexpr (Tile::kSupported) {
        // Two passes through one call site of the epilogue, in a loop the compiler may neither unroll nor peel (the pass
        // number goes through an opaque move): pass 0 runs it dry (warp 0, one token, logits row 0, no stores) before
        // anything else, pass 1 is the kernel (weights, wait, own part, arrival) and, in the last CTA, the real epilogue
        // on the instructions pass 0 just fetched.
        const RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                           partials, counters, num_tokens, routed_scaling};
#pragma unroll 1
        for (int pass = 0; pass < 2; ++pass) {
            const bool dry = ptx::opaque(pass) == 0;
            if (!dry) {
                Tile::load_weights(w, gate, blockIdx.x, tid);  // before the wait: never written
                ptx::griddep_launch_dependents();
                ptx::griddep_wait();
                GLM5_ROUTER_MARK(1);
                if (!decode_own_part<kHidden, kExperts, kTopK>(w, p, x8, x_scale, quant_eps, tokens_per_cta, scratch,
                                                              tid, /*epilogue*/ false))
                    return false;
            }
            Tile::Base::template topk_epilogue<1>(p, 0, dry ? 1 : num_tokens, tid >> 5, tid & 31, dry);
            if (!dry) {
                GLM5_ROUTER_MARK(4);
                return true;
            }
        }
    } else {
        ptx::griddep_launch_dependents();
        ptx::griddep_wait();
    }
    return false;
#else
    if constexpr (Tile::kSupported) Tile::load_weights(w, gate, blockIdx.x, tid);  // before the wait: never written

    ptx::griddep_launch_dependents();
    ptx::griddep_wait();
    GLM5_ROUTER_MARK(1);

    if constexpr (Tile::kSupported) {
        const RouterPtrs p{h, bias, logits, topk_ids, topk_weights, scaled_weights,
                           partials, counters, num_tokens, routed_scaling};
        return decode_own_part<kHidden, kExperts, kTopK>(w, p, x8, x_scale, quant_eps, tokens_per_cta, scratch, tid);
    }
    return false;
#endif
}

}  // namespace moe
}  // namespace glm5
