// Standalone C0 kernel (indexer head gate): one thread-block cluster of GLM5_C0_CLUSTER CTAs (256
// threads each) per tile of 8 * GLM5_C0_NT tokens, calling the tile function of c0_head_gate.cuh.
// Compile-time configuration (in the JIT cache key):
//   GLM5_C0_HIDDEN   K = hidden size (multiple of 256 * CLUSTER; 6144 for GLM-5, 512 for the small preset)
//   GLM5_C0_HEADS    N = indexer heads (multiple of 4, <= 32; 32 for GLM-5, 4 for the small preset)
//   GLM5_C0_NT       n8 token tiles per cluster (1: 8 tokens, 2: 16 tokens; chosen per M by the launcher)
//   GLM5_C0_CLUSTER  CTAs per cluster = K slices (8 for GLM-5, 2 for the small preset)
// Launch: grid (CLUSTER, ceil(M / (8 * NT)), 1) with the cluster-dimension attribute (CLUSTER, 1, 1),
// block (256, 1, 1), no dynamic shared memory, no workspace; PDL-ready. A launch with another cluster
// shape traps.
#include "c0_head_gate.cuh"

#ifndef GLM5_C0_HIDDEN
#define GLM5_C0_HIDDEN 6144
#endif
#ifndef GLM5_C0_HEADS
#define GLM5_C0_HEADS 32
#endif
#ifndef GLM5_C0_NT
#define GLM5_C0_NT 1
#endif
#ifndef GLM5_C0_CLUSTER
#define GLM5_C0_CLUSTER 8
#endif

using C0Tile = glm5::attn_pre::C0HeadGateClusterTile<GLM5_C0_HIDDEN, GLM5_C0_HEADS, GLM5_C0_NT, GLM5_C0_CLUSTER>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/c0_head_gate.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
// Two CTAs per SM (<= 128 registers): the next launch's prologue (its weight loads) can then run beside
// this one even at M = 256 (16 clusters of 8 CTAs).
extern "C" __global__ void __launch_bounds__(C0Tile::kThreads, 2)
glm5_c0_head_gate(const uint16_t* __restrict__ x,             // [M, HIDDEN] bf16
                  const uint16_t* __restrict__ weights_proj,  // [HEADS, HIDDEN] bf16
                  uint16_t* __restrict__ w_raw,               // [M, HEADS] bf16
                  int32_t num_tokens) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry")
    __shared__ typename C0Tile::Smem smem;
    const int tid = threadIdx.x;
    const int tile = blockIdx.y;
    // The grid holds exactly ceil(M / kTok) tiles; a stray cluster leaves as a whole, before any barrier.
    if (tile * C0Tile::kTok >= num_tokens) return;
    glm5::ptx::require_cluster_size<GLM5_C0_CLUSTER>();
    const int rank = static_cast<int>(glm5::ptx::cluster_ctarank());

    // Prologue that does not depend on the previous kernel: this lane's weight fragments of the CTA's
    // K slice, the receive barrier armed, the start-up cluster barrier arrived at. Waiting at point 1
    // (pdl_wait="after_prologue"), the barrier init goes first and the wait before the weight loads.
    if constexpr (glm5::ptx::kPdlWaitAt == 1) C0Tile::init(smem, rank, tid);
    glm5::ptx::griddep_wait_at<1>();
    C0Tile::Weights wr;
    C0Tile::load_weights(wr, weights_proj, rank, tid);
    if constexpr (glm5::ptx::kPdlWaitAt != 1) C0Tile::init(smem, rank, tid);

    glm5::ptx::griddep_launch_dependents();
    // x is read only after this (the previous kernel writes it).
    glm5::ptx::griddep_wait();

    const glm5::attn_pre::C0Ptrs p{x, w_raw, num_tokens};
    C0Tile::run(wr, p, tile, smem, rank, tid);
}
