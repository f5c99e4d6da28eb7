// cp.async (sm_80+) 16-byte global->shared copies and their commit/wait groups, plus the few
// shared/global access instructions the skinny FP8 GEMM needs. One PTX instruction per function.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

GLM5_DEVICE uint32_t smem_addr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// 16-byte async copy through L2 only (.cg). src_bytes < 16 zero-fills the rest (0: pure zero fill,
// nothing is read, but `src` must still be a valid address).
GLM5_DEVICE void cp_async_16(uint32_t dst_smem, const void* src, uint32_t src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst_smem), "l"(src), "r"(src_bytes)
                 : "memory");
}

// L2 evict-first policy for .L2::cache_hint accesses (createpolicy: one instruction, hoisted): data read once per
// step (weights), so that it does not push out what is read again (kernel code, activations, caches).
GLM5_DEVICE uint64_t l2_policy_evict_first() {
    uint64_t p;
    asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(p));
    return p;
}

// cp_async_16 with an L2 cache policy.
GLM5_DEVICE void cp_async_16_hint(uint32_t dst_smem, const void* src, uint32_t src_bytes, uint64_t policy) {
    asm volatile("cp.async.cg.shared.global.L2::cache_hint [%0], [%1], 16, %2, %3;" ::"r"(dst_smem), "l"(src),
                 "r"(src_bytes), "l"(policy)
                 : "memory");
}

// Weight loads of the tile functions: evict-first in builds that define GLM5_WEIGHTS_EVICT_FIRST=1 (the MegaRTP
// megakernel by default; the standalone GEMMs / D2 at small M, ops/_device.py weights_hint_defines), else the
// plain copy (the same SASS as without the switch). Evict-first on every token block's pass, also where a tile
// re-reads its weights for the next block: evict-normal there (session 22 call 3) was 7 % slower at 64 tokens.
GLM5_DEVICE void cp_async_16_weights(uint32_t dst_smem, const void* src, uint32_t src_bytes) {
#if defined(GLM5_WEIGHTS_EVICT_FIRST) && GLM5_WEIGHTS_EVICT_FIRST
    cp_async_16_hint(dst_smem, src, src_bytes, l2_policy_evict_first());
#else
    cp_async_16(dst_smem, src, src_bytes);
#endif
}

// 4-byte async copy through L1 (.ca); for rows whose 16-byte alignment is not guaranteed.
GLM5_DEVICE void cp_async_ca_4(uint32_t dst_smem, const void* src) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(dst_smem), "l"(src) : "memory");
}

GLM5_DEVICE void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }

// Wait until at most kPending of this thread's committed groups are still in flight.
template <int kPending>
GLM5_DEVICE void cp_async_wait() {
    static_assert(kPending >= 0 && kPending < 8, "0..7 groups may stay pending");
    asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// Wait for all of this thread's cp.async copies, committed or not.
GLM5_DEVICE void cp_async_wait_all() { asm volatile("cp.async.wait_all;" ::: "memory"); }

// wait_group with a run-time bound (the immediate must be a constant: unrolled switch).
GLM5_DEVICE void cp_async_wait_dyn(int pending) {
    switch (pending) {
        case 0: cp_async_wait<0>(); break;
        case 1: cp_async_wait<1>(); break;
        case 2: cp_async_wait<2>(); break;
        case 3: cp_async_wait<3>(); break;
        case 4: cp_async_wait<4>(); break;
        case 5: cp_async_wait<5>(); break;
        case 6: cp_async_wait<6>(); break;
        default: cp_async_wait<7>(); break;
    }
}

GLM5_DEVICE void lds_v4(uint32_t addr, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "r"(addr));
}

// L2-coherent loads (bypass L1): data another CTA of the same grid wrote before a fence + atomic.
GLM5_DEVICE float4 ld_cg_f32x4(const float* p) {
    float4 v;
    asm volatile("ld.global.cg.v4.f32 {%0, %1, %2, %3}, [%4];" : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p)
                 : "memory");  // stays after the acquire / barrier it follows (a compiler barrier, as a fence was)
    return v;
}

GLM5_DEVICE void ld_cg_v4(const void* p, uint32_t& a, uint32_t& b, uint32_t& c, uint32_t& d) {
    asm volatile("ld.global.cg.v4.b32 {%0, %1, %2, %3}, [%4];" : "=r"(a), "=r"(b), "=r"(c), "=r"(d) : "l"(p)
                 : "memory");
}

GLM5_DEVICE void ld_cg_v2(const void* p, uint32_t& a, uint32_t& b) {
    asm volatile("ld.global.cg.v2.b32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "l"(p) : "memory");
}

GLM5_DEVICE void st_cg_f32x4(float* p, float4 v) {
    asm volatile("st.global.cg.v4.f32 [%0], {%1, %2, %3, %4};" ::"l"(p), "f"(v.x), "f"(v.y), "f"(v.z), "f"(v.w)
                 : "memory");
}

}  // namespace ptx
}  // namespace glm5
