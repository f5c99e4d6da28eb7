// Standalone L2 prefetch kernel (csrc/common/l2_prefetch.cuh) for up to kMaxRanges weight ranges.
// Launch: grid (G, 1, 1), block (kThreads, 1, 1), no shared memory. p.bulk: 1 = 16 KB bulk prefetches through
// the TMA unit, 0 = one line prefetch per 128 bytes through the load/store unit. p.wait_prev: 1 = in a PDL
// chain on the main stream: let the next kernel launch at once, issue, then griddepcontrol.wait for the
// previous grid before exiting; that wait keeps the stream's order intact (a PDL consumer launched after
// this kernel waits for it, and through it for the kernel before it; this kernel writes nothing, so without
// the wait its consumer could run ahead of that producer). 0 = on a side stream, no chain to keep.
#include "../common/l2_prefetch.cuh"
#include "../common/pdl.cuh"

namespace {
constexpr int kThreads = 128;
constexpr int kMaxRanges = 4;
}  // namespace

// Parameter order and types are the ABI ops/prefetch.py packs (_kernel_args); the runtime checks sizes.
struct L2PrefetchParams {
    glm5::L2Range r[kMaxRanges];
    int32_t num_ranges;
    int32_t bulk;
    int32_t wait_prev;
};

extern "C" __global__ void __launch_bounds__(kThreads) glm5_l2_prefetch(const L2PrefetchParams p) {
    glm5::ptx::griddep_launch_dependents();
    const int64_t nworkers = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t worker = static_cast<int64_t>(threadIdx.x) * gridDim.x + blockIdx.x;  // CTA-fastest
    const bool bulk = p.bulk != 0;
    int64_t offset = 0;
#pragma unroll
    for (int i = 0; i < kMaxRanges; ++i) {
        if (i >= p.num_ranges) break;
        glm5::L2PrefetchTile::run(p.r[i], bulk, offset, worker, nworkers);
        offset += glm5::L2PrefetchTile::units(p.r[i], bulk);
    }
    if (p.wait_prev) glm5::ptx::griddep_wait();
}
