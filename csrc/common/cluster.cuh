// Thread-block cluster and distributed shared memory (DSMEM) helpers, sm_90. One PTX instruction
// per function. (A0 has private copies in csrc/attn_pre/a0_add_rmsnorm_quant.cuh namespace
// attn_pre::dsmem; to be deduplicated onto this file.)
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

// This CTA's rank in its cluster (0 .. cluster size - 1).
GLM5_DEVICE uint32_t cluster_ctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
    return r;
}

// Cluster-wide barrier, first half: this thread's prior memory accesses (shared::cluster included)
// are released at cluster scope. Every non-exited thread of every CTA of the cluster must arrive;
// .aligned: all threads of the warp execute it together.
GLM5_DEVICE void cluster_arrive_release() { asm volatile("barrier.cluster.arrive.release.aligned;" ::: "memory"); }

// Second half: returns once every thread of the cluster arrived; acquire at cluster scope.
GLM5_DEVICE void cluster_wait_acquire() { asm volatile("barrier.cluster.wait.acquire.aligned;" ::: "memory"); }

GLM5_DEVICE void cluster_sync() {
    cluster_arrive_release();
    cluster_wait_acquire();
}

// The shared::cluster address of shared::cta address `local` in the CTA of cluster rank `rank`.
GLM5_DEVICE uint32_t mapa_shared(uint32_t local, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}

// 16 bytes from a (possibly remote) shared::cluster address.
GLM5_DEVICE float4 ld_shared_cluster_f32x4(uint32_t addr) {
    float4 v;
    asm volatile("ld.shared::cluster.v4.f32 {%0, %1, %2, %3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w)
                 : "r"(addr)
                 : "memory");
    return v;
}

}  // namespace ptx
}  // namespace glm5
