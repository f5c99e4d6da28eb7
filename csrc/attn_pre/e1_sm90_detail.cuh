// Hopper (sm_90a) instructions E1 needs that the shared headers (csrc/common/sm90_wgmma.cuh,
// sm90_tma.cuh, sm90_mbarrier.cuh) do not have yet, one PTX instruction per function.
//
// NOTES: private to E1; merge into csrc/common/sm90_wgmma.cuh (the RS f16 wgmma) and
// csrc/common/bulk_copy.cuh (the bulk copy with an L2 cache hint) when someone owns those files.
// Why E1 uses the register-A ("RS") form with f16 operands rather than the shared SS e4m3 form:
// - A from registers: an index-K page arrives with the 1-D bulk copy as plain 128-byte rows, which
//   is no canonical wgmma shared-memory layout (the 128B swizzle XORs the 16-byte chunk index with
//   the row), so the threads load A themselves (no tensor map, one bulk copy per page).
// - f16, not e4m3: e4m3 -> f16 is exact and HGMMA accumulates in fp32, so the logits keep ~1e-7
//   agreement with the fp32 reference; the e4m3 wgmma accumulates with reduced precision
//   (DeepGEMM's stock E1 is 1.3e-4 off the same reference). Throughput is not the limit: 8
//   m64n32k16 per 64-token page is ~130 tensor cycles against ~470 cycles of HBM time per page
//   per SM at 4.2 TB/s.
#pragma once

#include "../common/arch.cuh"

namespace glm5 {
namespace attn_pre {
namespace e1_sm90 {

// D[64 x N] (+)= A[64 x 16] * B[16 x N], f16 inputs, fp32 accumulators, A from registers (K-major),
// B from shared memory (K-major, descriptor, e.g. sm90::smem_desc_k128sw). scale_d = 0 overwrites D.
// Register fragments (CuTe ALayout_64x16 / CLayout_64xN; warp w of the warpgroup, g = lane / 4,
// t = lane % 4; each a register holds 2 f16, the lower k in the low half):
//   a0 = A[16w+g][2t..2t+1], a1 = A[16w+g+8][2t..2t+1], a2 = A[16w+g][2t+8..2t+9], a3 = A[16w+g+8][2t+8..2t+9]
//   d[4j + 2h + b] = D[16w + g + 8h][8j + 2t + b]
// Same fence / commit / wait discipline as sm90::wgmma_m64k32_e4m3; the A registers must also stay
// untouched until the wait.
template <int N>
GLM5_DEVICE void wgmma_m64k16_f16_rs(float (&d)[N / 2], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                     uint64_t desc_b, int scale_d) {
    static_assert(N == 8 || N == 16 || N == 24 || N == 32, "E1 uses N in {8, 16, 24, 32}");
    if constexpr (N == 8) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %9, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n8k16.f32.f16.f16 {%0, %1, %2, %3}, {%4, %5, %6, %7}, %8, p, 1, 1, 0;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d));
    } else if constexpr (N == 16) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %13, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n16k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7}, "
            "{%8, %9, %10, %11}, %12, p, 1, 1, 0;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d));
    } else if constexpr (N == 24) {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %17, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n24k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11}, "
            "{%12, %13, %14, %15}, %16, p, 1, 1, 0;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d));
    } else {
        asm volatile(
            "{\n .reg .pred p;\n setp.ne.b32 p, %21, 0;\n"
            " wgmma.mma_async.sync.aligned.m64n32k16.f32.f16.f16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, "
            "%12, %13, %14, %15}, {%16, %17, %18, %19}, %20, p, 1, 1, 0;\n"
            "}\n"
            : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]),
              "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15])
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "l"(desc_b), "r"(scale_d));
    }
}

// Global -> shared bulk copy of `bytes` (multiple of 16; both addresses 16-byte aligned) completing
// `bytes` transactions on the mbarrier at shared address `bar`, with an L2 cache policy
// (sm90::l2_policy_evict_first for data read once: streamed pages then do not push out what the
// L2 still has to serve, e.g. pages prefetched by the next kernel under PDL).
GLM5_DEVICE void bulk_copy_g2s_hint(uint32_t dst_smem, const void* src_global, uint32_t bytes, uint32_t bar,
                                    uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            dst_smem),
        "l"(src_global), "r"(bytes), "r"(bar), "l"(policy)
        : "memory");
}

}  // namespace e1_sm90
}  // namespace attn_pre
}  // namespace glm5
