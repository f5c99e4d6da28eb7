// Thread-block cluster and distributed shared memory (DSMEM) helpers, sm_90. One PTX instruction
// per function. Used by A0 / C0 (cross-CTA row reductions with st.async), the FP8 GEMM's cluster
// reduce, E2 (cross-CTA top-k merge) and MegaMoE's CTA-pair build (claim forwarding, split-K hand-off).
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

// The number of CTAs in this CTA's cluster.
GLM5_DEVICE uint32_t cluster_nctarank() {
    uint32_t r;
    asm volatile("mov.u32 %0, %%cluster_nctarank;" : "=r"(r));
    return r;
}

// Trap unless the launch really formed clusters of kCluster CTAs (kernels that index peers by rank).
template <int kCluster>
GLM5_DEVICE void require_cluster_size() {
    if (cluster_nctarank() != static_cast<uint32_t>(kCluster)) __trap();
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

// The same split barrier without ordering: arrive.relaxed, then wait (acquire is wait's default).
// A0 / C0 use it as the DSMEM start-up rule (a peer must be running, its mbarrier initialised,
// before anyone writes into it): arrive in the prologue, wait just before the first st.async.
GLM5_DEVICE void cluster_arrive_relaxed() { asm volatile("barrier.cluster.arrive.relaxed.aligned;" ::: "memory"); }

GLM5_DEVICE void cluster_wait() { asm volatile("barrier.cluster.wait.aligned;" ::: "memory"); }

// The shared::cluster address of shared::cta address `local` in the CTA of cluster rank `rank`.
GLM5_DEVICE uint32_t mapa_shared(uint32_t local, uint32_t rank) {
    uint32_t r;
    asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(local), "r"(rank));
    return r;
}

// 4 / 8 bytes from a (possibly remote) shared::cluster address.
GLM5_DEVICE uint32_t ld_shared_cluster_u32(uint32_t addr) {
    uint32_t v;
    asm volatile("ld.shared::cluster.u32 %0, [%1];" : "=r"(v) : "r"(addr) : "memory");
    return v;
}

GLM5_DEVICE void ld_shared_cluster_v2_u32(uint32_t addr, uint32_t& a, uint32_t& b) {
    asm volatile("ld.shared::cluster.v2.u32 {%0, %1}, [%2];" : "=r"(a), "=r"(b) : "r"(addr) : "memory");
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

// 4 / 16 bytes into a peer's shared memory (shared::cluster address), completing that many
// transaction bytes on the peer's mbarrier `remote_bar` (shared::cluster address, same CTA).
GLM5_DEVICE void st_async_b32(uint32_t remote_addr, uint32_t v, uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];" ::"r"(remote_addr),
                 "r"(v), "r"(remote_bar)
                 : "memory");
}

GLM5_DEVICE void st_async_v4_b32(uint32_t remote_addr, uint32_t a, uint32_t b, uint32_t c, uint32_t d,
                                 uint32_t remote_bar) {
    asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.v4.b32 [%0], {%1, %2, %3, %4}, [%5];" ::"r"(
                     remote_addr),
                 "r"(a), "r"(b), "r"(c), "r"(d), "r"(remote_bar)
                 : "memory");
}

// One arrival on a peer's mbarrier (shared::cluster address), releasing this thread's prior accesses at cluster
// scope: the hand-back of a DSMEM buffer or mailbox the peer may now overwrite.
GLM5_DEVICE void mbarrier_arrive_remote(uint32_t remote_bar) {
    asm volatile("mbarrier.arrive.release.cluster.shared::cluster.b64 _, [%0];" ::"r"(remote_bar) : "memory");
}

// try_wait with cluster-scope acquire: the peers' st.async bytes (released at cluster scope by the
// complete_tx) are visible to this thread's ordinary shared loads once it returns true.
GLM5_DEVICE bool mbarrier_try_wait_parity_cluster(uint32_t bar, uint32_t parity) {
    uint32_t done;
    asm volatile(
        "{\n"
        " .reg .pred p;\n"
        " mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(parity)
        : "memory");
    return done != 0;
}

// Spin until the phase of parity `parity` completes. Bounded: a peer that never sends (a launch
// without the cluster attribute, a bug) traps after ~2^32 cycles (seconds) instead of hanging.
GLM5_DEVICE void mbarrier_wait_parity_cluster(uint32_t bar, uint32_t parity) {
    if (mbarrier_try_wait_parity_cluster(bar, parity)) return;
    const long long t0 = clock64();
    while (!mbarrier_try_wait_parity_cluster(bar, parity)) {
        if (clock64() - t0 > (1ll << 32)) __trap();
    }
}

}  // namespace ptx
}  // namespace glm5
