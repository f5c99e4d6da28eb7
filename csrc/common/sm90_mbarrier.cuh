// Hopper (sm_90a) shared-memory mbarriers and warpgroup register reallocation: one PTX instruction
// per function (the wait is a try_wait loop). Barriers are named by their 32-bit shared-memory
// address (ptx::smem_addr / __cvta_generic_to_shared of an 8-byte aligned uint64_t in smem), so
// callers index arrays of barriers with plain integer arithmetic.
//
// Producer / consumer ring with TMA (the pattern of fp8_gemm_wgmma.cuh):
//   init (one thread):  mbar_init(full[s], 1); mbar_init(empty[s], kConsumerArrivals);
//                       fence_barrier_init(); then a CTA barrier (__syncthreads).
//   producer, stage i:  mbar_wait(empty[s], ((i / S) & 1) ^ 1)      (round 0 passes at once)
//                       mbar_arrive_expect_tx(full[s], bytes); tma_load_2d(..., full[s], ...)
//   consumer, stage i:  mbar_wait(full[s], (i / S) & 1); read the stage; mbar_arrive(empty[s])
//
// Phase parity: a fresh barrier is in phase 0. mbar_wait(bar, P) returns once the phase with
// parity P has completed, i.e. while the barrier's current phase parity differs from P; so waiting
// for parity 1 on a fresh barrier returns immediately (the "previous" phase counts as complete).
//
// NOTES: mbar_wait spins with try_wait (which itself suspends the thread for a hardware-defined
// time) and traps after GLM5_MBAR_SPIN_LIMIT_CYCLES clock cycles (default 2^34, ~9 s at 1.98 GHz;
// 0 disables the bound): a lost arrival or a wrong transaction byte count then fails the launch
// with an error instead of hanging the GPU. Define GLM5_MBAR_TIMEOUT_PRINTF to print the barrier
// address, parity, block and thread before the trap (printf costs a stack frame, hence opt-in).
#pragma once

#include "arch.cuh"

#ifndef GLM5_MBAR_SPIN_LIMIT_CYCLES
#define GLM5_MBAR_SPIN_LIMIT_CYCLES (1ull << 34)
#endif

namespace glm5 {
namespace sm90 {

// Initialise the barrier at shared address `bar` for `count` arrivals per phase (phase 0).
GLM5_DEVICE void mbar_init(uint32_t bar, uint32_t count) {
    asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}

// Invalidate a barrier before its memory is reused for anything else.
GLM5_DEVICE void mbar_inval(uint32_t bar) {
    asm volatile("mbarrier.inval.shared::cta.b64 [%0];" ::"r"(bar) : "memory");
}

// Make preceding mbarrier.init visible to the async proxy (TMA complete_tx) and to other threads'
// later arrive/wait; follow with a CTA barrier before any other thread uses the barriers.
GLM5_DEVICE void fence_barrier_init() { asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory"); }

// One arrival (release semantics at CTA scope: this thread's earlier memory accesses, e.g. its
// reads of a ring stage, happen before the phase completes).
GLM5_DEVICE void mbar_arrive(uint32_t bar) {
    asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}

// One arrival that also raises the current phase's expected transaction count by `bytes`: the
// phase completes when every arrival has happened AND `bytes` bytes of async copies (TMA,
// cp.async.bulk) have completed on this barrier.
GLM5_DEVICE void mbar_arrive_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// Raise the expected transaction count without arriving.
GLM5_DEVICE void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
    asm volatile("mbarrier.expect_tx.relaxed.cta.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}

// One non-blocking test: true once the phase with parity `phase` has completed (acquire at CTA
// scope: data the phase guarded, including TMA-written shared memory, is visible afterwards).
GLM5_DEVICE bool mbar_try_wait(uint32_t bar, uint32_t phase) {
    uint32_t done;
    asm volatile(
        "{\n"
        " .reg .pred p;\n"
        " mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\n"
        " selp.u32 %0, 1, 0, p;\n"
        "}\n"
        : "=r"(done)
        : "r"(bar), "r"(phase)
        : "memory");
    return done != 0;
}

// Block until the phase with parity `phase` (0 or 1) of barrier `bar` has completed. kTrapOutOfLine: the timeout's
// trap as a call (trap_out_of_line, arch.cuh), for waits inside a setmaxnreg.inc region whose code needs more
// registers than the launch allocation (an inline trap caps it there); the default keeps the inline trap.
template <bool kTrapOutOfLine = false>
GLM5_DEVICE void mbar_wait(uint32_t bar, uint32_t phase) {
    if (mbar_try_wait(bar, phase)) return;
#if GLM5_MBAR_SPIN_LIMIT_CYCLES
    const long long t0 = clock64();
#endif
    while (!mbar_try_wait(bar, phase)) {
#if GLM5_MBAR_SPIN_LIMIT_CYCLES
        if (static_cast<unsigned long long>(clock64() - t0) > (GLM5_MBAR_SPIN_LIMIT_CYCLES)) {
#ifdef GLM5_MBAR_TIMEOUT_PRINTF
            printf("glm5 mbar_wait timeout: bar=0x%x parity=%u block=(%d,%d,%d) thread=%d\n", bar, phase, blockIdx.x,
                   blockIdx.y, blockIdx.z, threadIdx.x);
#endif
            if constexpr (kTrapOutOfLine)
                trap_out_of_line();
            else
                __trap();
        }
#endif
    }
}

// Warpgroup register reallocation (setmaxnreg). Every warp of a whole, aligned warpgroup (4
// consecutive warps, the first a multiple of 4) must execute the same call; R in [24, 256], a
// multiple of 8. _dec releases registers (producer warpgroups), _inc claims them (math
// warpgroups); the kernel must be compiled for a per-thread count that the totals fit.
template <int R>
GLM5_DEVICE void setmaxnreg_inc() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256, multiple of 8");
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;" ::"n"(R));
}

template <int R>
GLM5_DEVICE void setmaxnreg_dec() {
    static_assert(R >= 24 && R <= 256 && R % 8 == 0, "setmaxnreg: 24..256, multiple of 8");
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;" ::"n"(R));
}

}  // namespace sm90
}  // namespace glm5
