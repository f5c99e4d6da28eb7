// Standalone L2 prefetch kernel (csrc/common/l2_prefetch.cuh) for up to kMaxRanges weight ranges.
// Launch: grid (G, 1, 1), block (kThreads, 1, 1), no shared memory; with PDL it lets the next kernel launch
// at once, issues its prefetches, then waits for the previous grid before it exits. The wait keeps the
// stream's order intact: a PDL consumer launched after this kernel waits for it, and through it for the
// kernel before it (this kernel writes nothing, so without the wait its consumer could run ahead of that
// producer).
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
};

extern "C" __global__ void __launch_bounds__(kThreads) glm5_l2_prefetch(const L2PrefetchParams p) {
    glm5::ptx::griddep_launch_dependents();
    const int64_t nthreads = static_cast<int64_t>(gridDim.x) * blockDim.x;
    const int64_t gtid = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
#pragma unroll
    for (int i = 0; i < kMaxRanges; ++i)
        if (i < p.num_ranges) glm5::L2PrefetchTile::run(p.r[i], gtid, nthreads);
    glm5::ptx::griddep_wait();
}
