// mbarrier + 1-D bulk copy engine (cp.async.bulk, plain sm_90): one PTX instruction per function.
//
// The pattern this supports: one thread arms a CTA-local mbarrier with the byte count it expects
// (mbarrier_arrive_expect_tx) and issues a global -> shared bulk copy that completes those bytes
// on the barrier; every consumer thread waits on the barrier's phase parity, after which the
// copied bytes are visible to its ordinary shared-memory loads. No tensor map is needed: the
// source is any 16-byte aligned global address and the size any multiple of 16 bytes.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

GLM5_DEVICE uint32_t cvta_shared(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

// Initialise an 8-byte aligned shared mbarrier expecting `count` arrivals per phase (phase 0).
GLM5_DEVICE void mbarrier_init(uint64_t* bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(cvta_shared(bar)), "r"(count) : "memory");
}

// Invalidate before the memory is reused for anything else (or re-initialised by a later tile).
GLM5_DEVICE void mbarrier_inval(uint64_t* bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(cvta_shared(bar)) : "memory");
}

// Make mbarrier.init visible to the async proxy (the bulk copy engine) before its first use;
// follow it with a CTA barrier so the other threads see the initialised object too.
GLM5_DEVICE void fence_mbarrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival that also raises the phase's expected transaction count by `bytes`.
GLM5_DEVICE void mbarrier_arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.release.cta.shared::cta.b64 _, [%0], %1;" ::"r"(cvta_shared(bar)),
                 "r"(bytes)
                 : "memory");
}

// One plain arrival (no transaction bytes).
GLM5_DEVICE void mbarrier_arrive(uint64_t* bar) {
    asm volatile("mbarrier.arrive.release.cta.shared::cta.b64 _, [%0];" ::"r"(cvta_shared(bar)) : "memory");
}

// True once the phase with parity `parity` has completed (acquire: the copied bytes are visible).
GLM5_DEVICE bool mbarrier_try_wait_parity(uint64_t* bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        " .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cta.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(cvta_shared(bar)), "r"(parity)
        : "memory");
    return done != 0;
}

// Global -> shared bulk copy of `bytes` (multiple of 16; both addresses 16-byte aligned) that
// completes `bytes` transactions on `bar` (a barrier of the issuing CTA).
GLM5_DEVICE void bulk_copy_g2s(void* dst_smem, const void* src_global, uint32_t bytes, uint64_t* bar) {
    asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
                     cvta_shared(dst_smem)),
                 "l"(src_global), "r"(bytes), "r"(cvta_shared(bar))
                 : "memory");
}

// The same with an L2 cache policy operand (a createpolicy policy, e.g. ptx_cp_async.cuh l2_policy_evict_first).
GLM5_DEVICE void bulk_copy_g2s_hint(void* dst_smem, const void* src_global, uint32_t bytes, uint64_t* bar,
                                    uint64_t policy) {
    asm volatile(
        "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1], %2, [%3], %4;" ::"r"(
            cvta_shared(dst_smem)),
        "l"(src_global), "r"(bytes), "r"(cvta_shared(bar)), "l"(policy)
        : "memory");
}

// Hint: bring `bytes` (multiple of 16, 16-byte aligned) of global memory into L2. No value is
// returned and no copy is made outside L2, the device-wide point of coherence, so a prefetch of
// data another kernel is still writing cannot make a later read see stale bytes.
GLM5_DEVICE void bulk_prefetch_l2(const void* src_global, uint32_t bytes) {
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(src_global), "r"(bytes) : "memory");
}

}  // namespace ptx
}  // namespace glm5
