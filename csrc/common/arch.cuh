// Arch guard and the few macros every device header of glm5_fastpath uses.
//
// Device headers under csrc/ are framework-free: raw pointers and plain integer types only,
// no torch, no CUTLASS unless a kernel opts in. bf16 values travel as their raw 16-bit
// patterns (uint16_t) and fp8 e4m3 values as bytes (uint8_t); csrc/common/convert.cuh
// converts them with single PTX instructions.
#pragma once

#include <stdint.h>

// NOTES: every kernel of this project targets Hopper (sm_90a) or newer; the PTX used here
// (griddepcontrol, cvt.*.e4m3x2) does not exist before sm_90 / sm_89. Fail at compile time,
// loudly, rather than emitting a cubin that traps at run time.
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ < 900)
#error "glm5_fastpath kernels need sm_90 or newer (compile with -gencode=arch=compute_90a,code=sm_90a)"
#endif

#define GLM5_DEVICE __device__ __forceinline__

namespace glm5 {
// Fatal stop for timeout / cannot-happen paths, out of line. NOTES: an inline trap (__trap(), PTX `trap`) anywhere in
// a setmaxnreg.inc region made ptxas (nvcc 13.0) allocate the region's registers within the launch allocation (168 for
// 384 threads) instead of the raised count: with mbar_wait's spin-limit trap inline, MegaMoE's wide build spilled
// 1.6 KB and never used a register past R165; with the trap behind this call it used up to R187 and spilled nothing.
// Not the default everywhere: in MegaMoE's bn64 build the lifted cap (R197) measured 4.6 % slower at 1024 tokens
// (H200, 2026-11-30), so only code that needs the registers calls it (mbar_wait<true>, MegaMoE's wide math).
__device__ __noinline__ inline void trap_out_of_line() { __trap(); }
}  // namespace glm5
