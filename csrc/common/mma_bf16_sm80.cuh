// Warp-level bf16 tensor-core MMA (mma.sync m16n8k16), ldmatrix, cp.async and the few L2-coherent
// memory ops the split-K kernels need: one PTX instruction per function. smem_addr, cp_async_commit,
// cp_async_wait<> / cp_async_wait_dyn and the .cg f32x4 loads / stores (ld_cg_f32x4, st_cg_f32x4)
// are those of ptx_cp_async.cuh (one definition each).
//
// Fragment layouts of mma.sync.m16n8k16.row.col.f32.bf16.bf16.f32 (PTX ISA, "Matrix fragments for
// mma.m16n8k16"), lane = 4*g + t (g = lane/4 in 0..7, t = lane%4 in 0..3); each 32-bit register
// holds two bf16, the lower-indexed element in the low half:
//   A (16x16, row = M, col = K):  a0 = A[g][2t..2t+1]    a1 = A[g+8][2t..2t+1]
//                                 a2 = A[g][2t+8..2t+9]  a3 = A[g+8][2t+8..2t+9]
//   B (16x8,  row = K, col = N):  b0 = B[2t..2t+1][g]    b1 = B[2t+8..2t+9][g]
//   C (16x8, fp32):               c0 = C[g][2t]  c1 = C[g][2t+1]  c2 = C[g+8][2t]  c3 = C[g+8][2t+1]
// ldmatrix.x4(.trans): lanes 8i..8i+7 give the 8 row addresses (16 bytes each) of matrix i; lane
// (g, t) receives in register i the pair M_i[g][2t..2t+1], or with .trans M_i[2t][g], M_i[2t+1][g].
//
// NOTES: these instructions exist since sm_80 and are what a skinny (decode-M) GEMM wants on Hopper:
// the operands are tiny and the kernels are bound by the weight stream, not by tensor-core issue.
#pragma once

#include "arch.cuh"
#include "ptx_cp_async.cuh"
#include "vec_io.cuh"

namespace glm5 {
namespace ptx {

// D = A * B + D, fp32 accumulators in place.
GLM5_DEVICE void mma_m16n8k16_bf16(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3, uint32_t b0,
                                   uint32_t b1) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Four transposed 8x8 b16 matrices from shared memory (see the header comment for the layout).
GLM5_DEVICE void ldmatrix_x4_trans(uint32_t (&r)[4], uint32_t smem_row_addr) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_row_addr)
                 : "memory");
}

// 16-byte global -> shared copy that bypasses L1 (cp.async.cg); completes per commit group.
GLM5_DEVICE void cp_async_16(uint32_t smem_dst, const void* gmem_src) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(smem_dst), "l"(gmem_src) : "memory");
}

// cp_async_16 for weights (ptx_cp_async.cuh cp_async_16_weights: evict-first under GLM5_WEIGHTS_EVICT_FIRST).
GLM5_DEVICE void cp_async_16_weights(uint32_t smem_dst, const void* gmem_src) {
#if defined(GLM5_WEIGHTS_EVICT_FIRST) && GLM5_WEIGHTS_EVICT_FIRST
    cp_async_16_hint(smem_dst, gmem_src, 16u, l2_policy_evict_first());
#else
    cp_async_16(smem_dst, gmem_src);
#endif
}

// Device-scope acq_rel fetch-and-add on an arrival counter (orders this CTA's earlier partial
// stores, made visible by the preceding fence + barrier, before the increment).
GLM5_DEVICE uint32_t atomic_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
    uint32_t old;
    asm volatile("atom.add.acq_rel.gpu.global.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

GLM5_DEVICE void st_relaxed_gpu_u32(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// 4-byte global load / store (one bf16 pair).
GLM5_DEVICE uint32_t ld_global_u32(const void* p) {
    uint32_t v;
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

GLM5_DEVICE void st_global_u32(void* p, uint32_t v) { asm volatile("st.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); }

GLM5_DEVICE int64_t ld_global_s64(const int64_t* p) {
    int64_t v;
    asm volatile("ld.global.s64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}

GLM5_DEVICE int32_t ld_global_s32(const int32_t* p) {
    int32_t v;
    asm volatile("ld.global.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

}  // namespace ptx
}  // namespace glm5
