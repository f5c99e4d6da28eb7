// The memory-model and control PTX the MegaRTP runtime uses: one instruction per function.
//
// Cross-CTA protocol (event counters, split-K reduce counters, the error record) is expressed with
// PTX memory-model operations at gpu scope:
//   producer:  st (outputs) ... bar.sync (all writers) ; fence.acq_rel.gpu ; red.release.gpu.add
//   consumer:  ld.relaxed.gpu (poll) ... ; fence.acq_rel.gpu ; bar.sync ; ld (inputs)
// The acquire fence after the poll also invalidates this SM's L1 (SASS: CCTL.IVALL), so a line of a
// producer's output cached by an earlier instruction (the previous epoch's read of the same address)
// is never served stale to a later plain ld.global.
// CTA-local hand-off between the controller warp and the worker warps (instruction slots) uses
// st.release / ld.acquire at cta scope on shared-memory words.
#pragma once

#include "../common/arch.cuh"

namespace glm5 {
namespace megartp {
namespace sync {

GLM5_DEVICE uint32_t ld_relaxed_gpu(const uint32_t* p) {
    uint32_t v;
    asm volatile("ld.relaxed.gpu.global.u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

GLM5_DEVICE int32_t ld_relaxed_gpu(const int32_t* p) {
    int32_t v;
    asm volatile("ld.relaxed.gpu.global.s32 %0, [%1];" : "=r"(v) : "l"(p) : "memory");
    return v;
}

GLM5_DEVICE void fence_acq_rel_gpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

GLM5_DEVICE void red_release_gpu_add(uint32_t* p, uint32_t v) {
    asm volatile("red.release.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// Fire-and-forget (no reply awaited): the exit bookkeeping, read only by the next launch or the host.
GLM5_DEVICE void st_relaxed_gpu(uint32_t* p, uint32_t v) {
    asm volatile("st.relaxed.gpu.global.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE void red_relaxed_gpu_add(uint32_t* p, uint32_t v) {
    asm volatile("red.relaxed.gpu.global.add.u32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

GLM5_DEVICE uint32_t atom_add_acq_rel_gpu(uint32_t* p, uint32_t v) {
    uint32_t old;
    asm volatile("atom.acq_rel.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

// Dynamic dispatch's claim: only the returned index matters (the instruction tensor is read-only).
GLM5_DEVICE uint32_t atom_add_relaxed_gpu(uint32_t* p, uint32_t v) {
    uint32_t old;
    asm volatile("atom.relaxed.gpu.global.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
    return old;
}

GLM5_DEVICE void st_release_gpu(int32_t* p, int32_t v) {
    asm volatile("st.release.gpu.global.s32 [%0], %1;" ::"l"(p), "r"(v) : "memory");
}

// ---- CTA-local (shared memory) ------------------------------------------------------------------

GLM5_DEVICE uint32_t smem_u32(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

GLM5_DEVICE uint32_t ld_acquire_cta(const uint32_t* smem_word) {
    uint32_t v;
    asm volatile("ld.acquire.cta.shared.u32 %0, [%1];" : "=r"(v) : "r"(smem_u32(smem_word)) : "memory");
    return v;
}

GLM5_DEVICE void st_release_cta(uint32_t* smem_word, uint32_t v) {
    asm volatile("st.release.cta.shared.u32 [%0], %1;" ::"r"(smem_u32(smem_word)), "r"(v) : "memory");
}

// bar.sync 0 without a thread count: every thread of the CTA (= __syncthreads()). The controller
// warp executes it to take part in the CTA-wide barriers of a tile function that uses
// __syncthreads() (see families.cuh, SkinnyGemm).
GLM5_DEVICE void bar_sync_cta() { asm volatile("bar.sync 0;" ::: "memory"); }

// ---- instruction fetch ----------------------------------------------------------------------------

// The instruction tensor is never written while the kernel runs: read-only path.
GLM5_DEVICE int32_t ld_nc_s32(const int32_t* p) {
    int32_t v;
    asm volatile("ld.global.nc.s32 %0, [%1];" : "=r"(v) : "l"(p));
    return v;
}

GLM5_DEVICE uint64_t ld_nc_u64(const uint64_t* p) {
    uint64_t v;
    asm volatile("ld.global.nc.u64 %0, [%1];" : "=l"(v) : "l"(p));
    return v;
}

// ---- L2-only float2 access (split-K workspaces: written and read by different CTAs) --------------

GLM5_DEVICE void st_cg_f32x2(float* p, float a, float b) {
    asm volatile("st.global.cg.v2.f32 [%0], {%1, %2};" ::"l"(p), "f"(a), "f"(b) : "memory");
}

GLM5_DEVICE float2 ld_cg_f32x2(const float* p) {
    float2 v;
    asm volatile("ld.global.cg.v2.f32 {%0, %1}, [%2];" : "=f"(v.x), "=f"(v.y) : "l"(p) : "memory");
    return v;
}

GLM5_DEVICE float4 ld_cg_f32x4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p) : "memory");
    return v;
}

// ---- special registers ----------------------------------------------------------------------------

GLM5_DEVICE uint32_t smid() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%smid;" : "=r"(v));
    return v;
}

GLM5_DEVICE uint32_t dynamic_smem_bytes() {
    uint32_t v;
    asm volatile("mov.u32 %0, %%dynamic_smem_size;" : "=r"(v));
    return v;
}

GLM5_DEVICE uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

}  // namespace sync
}  // namespace megartp
}  // namespace glm5
