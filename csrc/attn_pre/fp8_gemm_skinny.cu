// Standalone launcher of the skinny FP8 GEMM tile (fp8_gemm_skinny.cuh): one CTA per
// (n tile of 128 weight rows, K split, token block). Compile-time configuration (part of the JIT
// cache key), chosen per (M, N, K) by glm5_fastpath/ops/fp8_gemm.py:
//   GLM5_SKINNY_TM       tokens per CTA: 8, 16, 32 or 64
//   GLM5_SKINNY_STAGES   cp.async ring depth (stages - 1 K groups of 16 KB weights in flight)
//   GLM5_SKINNY_EPI      epilogue: 0 plain, 1 B0 qkv_a, 2 D0 q_b, 3 D1 indexer q, 4 B1 indexer k
//   GLM5_SKINNY_ROT      0 (default), or n: the n-point Walsh-Hadamard rotation option of epilogues 3 / 4
//                        (n = head dim; SkinnyFinish::rotate_rows)
// Launch: grid (tiles_n, splits, tiles_m), block 256, dynamic smem SkinnySmem<TM, STAGES>::bytes(gmax);
// PDL-ready (weights are prefetched before griddepcontrol.wait).
#include "fp8_gemm_skinny.cuh"

#ifndef GLM5_SKINNY_TM
#define GLM5_SKINNY_TM 16
#endif
#ifndef GLM5_SKINNY_STAGES
#define GLM5_SKINNY_STAGES 5
#endif
#ifndef GLM5_SKINNY_EPI
#define GLM5_SKINNY_EPI 0
#endif
#ifndef GLM5_SKINNY_ROT
#define GLM5_SKINNY_ROT 0
#endif
// Tuning / diagnostics (benchmarks/fp8_gemm_sweep.py); the defaults are the production kernel.
//   GLM5_SKINNY_MINB     __launch_bounds__ min CTAs per SM (2: registers capped at 128 per thread)
//   GLM5_SKINNY_DIAG     0 off; 1 loads only; 2 no split-K reduce; 3 no loads in the K loop (see .cuh)
#ifndef GLM5_SKINNY_MINB
#define GLM5_SKINNY_MINB 1
#endif
#ifndef GLM5_SKINNY_DIAG
#define GLM5_SKINNY_DIAG 0
#endif

using SkinnyTile =
    glm5::attn_pre::skinny::SkinnyGemmTile<GLM5_SKINNY_TM, GLM5_SKINNY_STAGES,
                                           glm5::attn_pre::skinny::epi_with_rot(GLM5_SKINNY_EPI, GLM5_SKINNY_ROT),
                                           GLM5_SKINNY_DIAG>;

extern "C" __global__ void __launch_bounds__(glm5::attn_pre::skinny::kThreads, GLM5_SKINNY_MINB)
glm5_fp8_gemm_skinny(const glm5::attn_pre::skinny::SkinnyParams p) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry")
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x;
    const auto c = SkinnyTile::coord(p, blockIdx.x, blockIdx.y, blockIdx.z);
    // GLM5_PDL_WAIT_AT=1: the generic prologue is only the tile coordinates (no barrier, no metadata).
    glm5::ptx::griddep_wait_at<1>();

    // Independent of the previous kernel: weight stages + weight scales start streaming now.
    SkinnyTile::prologue(p, c, smem, tid);
    glm5::ptx::griddep_launch_dependents();
    // Activations, their scales and every epilogue input may be the previous kernel's output.
    glm5::ptx::griddep_wait();

    float acc[SkinnyTile::kNT][4];
    if (!SkinnyTile::mainloop(p, c, smem, tid, acc)) return;  // another split finishes this tile
    SkinnyTile::epilogue(p, c, smem, tid, acc);
}
