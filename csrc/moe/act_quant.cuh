// Per-token 1x128 FP8 (e4m3) activation quantization of bf16 rows: the tile of ONE 128-column group,
// done by one aligned half-warp (16 lanes x one 16-byte vector of 8 bf16 each).
//
// Framework-free (raw pointers, bf16 as uint16_t bit patterns, e4m3 as bytes), so a persistent kernel
// (MegaMoE's loader, a megakernel) can call it per group as well as the standalone launcher
// (act_quant.cu).
//
// Math, bit for bit glm5_fastpath.ref.fp8.quant_act_per_token (eps = config.ACT_QUANT_EPS as fp32):
//   per 128-column group g of a row:
//     amax_g  = max |f32(x)|                                   (NaN-propagating, like torch.amax)
//     s_g     = max(amax_g, eps) / 448                         (IEEE fp32 divide = the reference's
//                                                               float64 divide rounded once to fp32;
//                                                               NaN-propagating, like clamp_min)
//     x8      = e4m3_rn_satfinite(f32(x) / s_g)                (IEEE divide, not * 1/s; saturates at
//                                                               +-448 like the reference's clamp)
// The only representational difference: a NaN comes out as the canonical e4m3 NaN 0x7f, where the
// CPU reference keeps the sign of the fp32 NaN it converts (0x7f or 0xff). Every finite or infinite
// input gives the same bytes.
//
// Work split. A group is 256 bytes of bf16: 16 lanes load one 16-byte vector each (all loads of the
// group in flight at once), the group amax is a 4-step butterfly over the aligned half-warp, each lane
// stores its 8 e4m3 bytes with one 8-byte store (the half-warp writes the group's 128 bytes
// contiguously) and lane 0 of the half writes the scale. No shared memory, no block-level sync: the
// caller may give a CTA any whole number of warps.
#pragma once

#include "../common/arch.cuh"
#include "../common/convert.cuh"
#include "../common/vec_io.cuh"

namespace glm5 {
namespace moe {

// max that returns NaN when either operand is NaN (fmaxf drops a NaN operand). torch.amax and
// clamp_min propagate NaN, so a group holding a NaN gets a NaN scale and all-NaN bytes, as there.
GLM5_DEVICE float fmax_nan(float a, float b) {
    float d;
    asm("max.NaN.f32 %0, %1, %2;" : "=f"(d) : "f"(a), "f"(b));
    return d;
}

struct ActQuantGroupTile {
    static constexpr int kVec = 8;                        // bf16 per 16-byte vector
    static constexpr int kGroup = 128;                    // FP8 activation group (1x128)
    static constexpr int kLanesPerGroup = kGroup / kVec;  // 16: an aligned half-warp
    static constexpr float kFp8Max = 448.0f;

    // Group amax over the aligned half-warp, NaN-propagating (butterfly: every lane ends with it).
    static GLM5_DEVICE float group_amax(float v) {
#pragma unroll
        for (int off = kLanesPerGroup / 2; off > 0; off >>= 1) v = fmax_nan(v, __shfl_xor_sync(0xffffffffu, v, off));
        return v;
    }

    // Quantize this lane's 8 bf16 (`v`, lower address = lower bits) of a group whose other 120 values the
    // other 15 lanes of the aligned half-warp hold. Every lane of the warp must call it (full-mask
    // shuffles); a half-warp without a group passes zeros and discards the result. Returns the group
    // scale (the same in all 16 lanes); q_lo / q_hi receive the 8 e4m3 bytes, byte i = element i.
    static GLM5_DEVICE float quantize(const ptx::u32x4& v, float eps, uint32_t& q_lo, uint32_t& q_hi) {
        float f[kVec];
        const uint32_t w[4] = {v.x, v.y, v.z, v.w};
        float amax = 0.0f;
#pragma unroll
        for (int i = 0; i < 4; ++i) {
            f[2 * i] = ptx::bf16lo_to_f32(w[i]);
            f[2 * i + 1] = ptx::bf16hi_to_f32(w[i]);
            amax = fmax_nan(amax, fmax_nan(fabsf(f[2 * i]), fabsf(f[2 * i + 1])));
        }
        amax = group_amax(amax);
        const float s = fmax_nan(amax, eps) / kFp8Max;  // IEEE divide (no fast-math: the JIT never sets it)
        uint32_t q[2];
#pragma unroll
        for (int i = 0; i < 2; ++i) {
            const uint32_t lo = ptx::f32x2_to_e4m3x2_satfinite(f[4 * i] / s, f[4 * i + 1] / s);
            const uint32_t hi = ptx::f32x2_to_e4m3x2_satfinite(f[4 * i + 2] / s, f[4 * i + 3] / s);
            q[i] = lo | (hi << 16);
        }
        q_lo = q[0];
        q_hi = q[1];
        return s;
    }

    // One group per aligned half-warp: load, quantize, store. `sub` = lane within the half (0..15);
    // x_group / q_group / scale point at the group's first bf16, first e4m3 byte and its scale; `valid`
    // must be uniform over the half-warp (false: nothing is read or written, the lanes only take part
    // in the shuffles). x_group must be 16-byte aligned, q_group 8-byte aligned. x is read with a
    // coherent load: it is the previous kernel's output (call after griddepcontrol.wait).
    static GLM5_DEVICE void run(const uint16_t* x_group, uint8_t* q_group, float* scale, int sub, bool valid,
                                float eps) {
        ptx::u32x4 v{0u, 0u, 0u, 0u};
        if (valid) v = ptx::ld_global_v4(x_group + sub * kVec);
        uint32_t q_lo, q_hi;
        const float s = quantize(v, eps, q_lo, q_hi);
        if (valid) {
            ptx::st_global_v2(q_group + sub * kVec, q_lo, q_hi);
            if (sub == 0) ptx::st_global_f32(scale, s);
        }
    }
};

}  // namespace moe
}  // namespace glm5
