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

// Compile-time wait-point switch: where a prefix kernel executes its FIRST griddepcontrol.wait, so
// the CMP benchmark can charge each PDL mechanism separately (glm5_fastpath/attn_pre/cmp/modes.py):
//   0  entry: the kernel's first instruction (the early launch buys only the scheduling latency);
//   1  after the generic prologue (barrier init, descriptor prefetch, metadata loads), before any
//      weight load;
//   2  native (default): after the prologue and the weight prefetch, where each kernel calls
//      griddep_wait() itself.
// Kernels call griddep_wait_at<0>() / griddep_wait_at<1>() at those points and keep their native
// unconditional griddep_wait(): a second wait returns at once. With the default (2) both calls
// compile to nothing. Set by the Python ops' pdl_wait= ("entry" | "after_prologue"), part of the
// JIT cache key.
#ifndef GLM5_PDL_WAIT_AT
#define GLM5_PDL_WAIT_AT 2
#endif
static_assert(GLM5_PDL_WAIT_AT >= 0 && GLM5_PDL_WAIT_AT <= 2,
              "GLM5_PDL_WAIT_AT: 0 (entry), 1 (after the prologue) or 2 (native)");

namespace glm5 {
namespace ptx {

// The wait point this build was compiled for (GLM5_PDL_WAIT_AT), for kernels that must reorder
// their prologue (e.g. barrier init before the weight loads) when waiting at point 1.
constexpr int kPdlWaitAt = GLM5_PDL_WAIT_AT;

// Block until all prerequisite grids have completed and their writes are visible.
GLM5_DEVICE void griddep_wait() { asm volatile("griddepcontrol.wait;" ::: "memory"); }

// griddep_wait() iff this build waits at kPoint (see GLM5_PDL_WAIT_AT above); otherwise nothing.
template <int kPoint>
GLM5_DEVICE void griddep_wait_at() {
    static_assert(kPoint == 0 || kPoint == 1, "wait points 0 (entry) and 1 (after the prologue); 2 is the native wait");
    if constexpr (kPoint == kPdlWaitAt) griddep_wait();
}

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
