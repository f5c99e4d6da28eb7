// Programmatic Dependent Launch (PDL) and named barriers: one PTX instruction per function.
//
// A kernel launched with CU_LAUNCH_ATTRIBUTE_PROGRAMMATIC_STREAM_SERIALIZATION may start while
// the previous kernel on the stream is still running. It must execute griddep_wait() before it
// touches anything that kernel writes; griddep_wait() returns once every prerequisite grid has
// completed and its memory is visible. Work that does not depend on the previous kernel (loading
// weights, computing addresses) goes before the wait. Without the launch attribute both
// instructions are no-ops, so the same kernel runs correctly either way.
#pragma once

#include "arch.cuh"

namespace glm5 {
namespace ptx {

// Block until all prerequisite grids have completed and their writes are visible.
GLM5_DEVICE void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// Allow the dependent grid to be scheduled once every CTA of this grid has issued this (or
// exited). The dependent still waits for our full completion in its own griddep_wait().
GLM5_DEVICE void griddep_launch_dependents() { asm volatile("griddepcontrol.launch_dependents;" ::: "memory"); }

// bar.sync on a named barrier with a compile-time thread count. Id 0 with the whole block is
// __syncthreads(); a persistent megakernel gives each warp-group role its own id.
template <int kBarrierId, int kThreads>
GLM5_DEVICE void named_barrier_sync() {
    static_assert(kBarrierId >= 0 && kBarrierId < 16, "hardware has 16 named barriers");
    static_assert(kThreads % 32 == 0 && kThreads > 0, "named barriers count whole warps");
    asm volatile("bar.sync %0, %1;" ::"n"(kBarrierId), "n"(kThreads) : "memory");
}

// Nanosecond global timer (coarse ticks; for spin bounds and tests, not for fine timing).
GLM5_DEVICE uint64_t globaltimer_ns() {
    uint64_t t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}

}  // namespace ptx
}  // namespace glm5
