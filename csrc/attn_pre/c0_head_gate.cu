// Standalone C0 kernel (indexer head gate): one CTA of 256 threads per (K chunk, 32-token tile),
// calling the tile function of c0_head_gate.cuh. Compile-time configuration (in the JIT cache key):
//   GLM5_C0_HIDDEN  K = hidden size (multiple of 256; 6144 for GLM-5, 512 for the small preset)
//   GLM5_C0_HEADS   N = indexer heads (multiple of 4, <= 32; 32 for GLM-5, 4 for the small preset)
// Launch: grid (HIDDEN / 256, ceil(M / 32), 1), block (256, 1, 1), no dynamic shared memory; PDL-ready.
#include "c0_head_gate.cuh"

#ifndef GLM5_C0_HIDDEN
#define GLM5_C0_HIDDEN 6144
#endif
#ifndef GLM5_C0_HEADS
#define GLM5_C0_HEADS 32
#endif

using C0Tile = glm5::attn_pre::C0HeadGateTile<GLM5_C0_HIDDEN, GLM5_C0_HEADS>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/c0_head_gate.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(C0Tile::kThreads)
glm5_c0_head_gate(const uint16_t* __restrict__ x,             // [M, HIDDEN] bf16
                  const uint16_t* __restrict__ weights_proj,  // [HEADS, HIDDEN] bf16
                  uint16_t* __restrict__ w_raw,               // [M, HEADS] bf16
                  float* __restrict__ partials,               // workspace [ceil(M/32)][splits][32][HEADS] fp32
                  uint32_t* __restrict__ counters,            // workspace [ceil(M/32)] uint32, zero between launches
                  int32_t num_tokens) {
    __shared__ __align__(16) float scratch[C0Tile::kScratchFloats];
    const int tid = threadIdx.x;
    const int split = blockIdx.x;

    // Prologue that does not depend on the previous kernel: this lane's weight fragments.
    C0Tile::Weights wr;
    C0Tile::load_weights(wr, weights_proj, split, tid);

    glm5::ptx::griddep_launch_dependents();
    // x and the workspace are touched only after this (the workspace may still be in use by a
    // previous launch of this kernel that the PDL overlap lets us run beside).
    glm5::ptx::griddep_wait();

    const int tile = blockIdx.y;
    if (tile * C0Tile::kTokTile >= num_tokens) return;  // whole CTA leaves together
    const glm5::attn_pre::C0Ptrs p{x, w_raw, partials, counters, num_tokens};
    C0Tile::run(wr, p, split, tile, scratch, tid);
}
