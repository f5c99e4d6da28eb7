// Standalone launcher of the TMA + wgmma skinny FP8 GEMM tile (fp8_gemm_wgmma.cuh): one CTA per
// (n tile of 128 weight rows, K split, token block), the same grid and SkinnyParams ABI as
// fp8_gemm_skinny.cu plus two tensor maps. Compile-time configuration (part of the JIT cache key),
// chosen per (M, N, K) by glm5_fastpath/ops/fp8_gemm.py (impl "wgmma"):
//   GLM5_SKINNY_TM       tokens per CTA (wgmma N): 8, 16, 32, 64 or 128
//   GLM5_SKINNY_STAGES   TMA ring depth (stages of 16 KB weights + TM x 128 B activations)
//   GLM5_SKINNY_EPI      epilogue: 0 plain, 1 B0 qkv_a, 2 D0 q_b, 3 D1 indexer q, 4 B1 indexer k
//   GLM5_SKINNY_ROT      0 (default), or n: the n-point Walsh-Hadamard rotation option of epilogues 3 / 4
//                        (n = head dim; SkinnyFinish::rotate_rows)
//   GLM5_SKINNY_MINB     __launch_bounds__ min CTAs per SM (tuning; 1 = production)
//   GLM5_SKINNY_DIAG     0 off; 1 loads only; 2 no split-K reduce; 3 no loads in the K loop
//   GLM5_SKINNY_PIPE     0: wait each stage's wgmmas; 1: two partials, next stage issued first (TM <= 64)
//   GLM5_SKINNY_REDUCE   0: split-K through the global workspace; 1: through DSMEM of a (1, splits, 1)
//                        cluster (launch attribute; splits <= 8)
//   GLM5_SKINNY_WKB      0: W8 row-major [N, K] (2-D weight map); 1: k-block-major [K / 128][N][128] (3-D map,
//                        every weight box one contiguous 16 KB; glm5_fastpath.ops.fp8_gemm.kblock_major)
//   GLM5_SKINNY_PHASES   (diagnostic) thread 0 of every CTA writes %globaltimer (ns) at the phase marks into the
//                        __device__ array skinny_phase_ns[cta * 8 + i] (read back with cuModuleGetGlobal:
//                        glm5_fastpath.ops.fp8_gemm.read_phases): 0 entry, 1 past griddepcontrol.wait, 2 first stage
//                        landed, 3 K loop done, 4 split-K finish done (or left it to another CTA), 5 epilogue done,
//                        6 unused, 7 the SM id; the first kMaxPhaseCtas CTAs only. Not for persistent launches.
//   GLM5_SKINNY_PERSIST  0: one CTA per (n tile, split, token block) unit; 1: persistent, grid (P, 1, 1) with
//                        P <= units: CTA b takes units b, b + P, ... through one continuous TMA ring (global
//                        split-K reduce only. Built for multi-wave weight streams (o_proj, the dense MLP), but
//                        measured 3-14 % slower than the waves there at M <= 32 on the H200 (2026-11-30), tied at
//                        64: no default uses it)
//   GLM5_SKINNY_INFLIGHT 0 (default): the whole ring fill issued at once; n: at most n fill stages in flight
//                        (WgmmaGemmTile's kInflight; an experiment, one CTA per unit only)
// Parameters: (SkinnyParams p, CUtensorMap w_map, CUtensorMap x_map):
//   w_map: W8 [N, K] e4m3, box 128 K-bytes x 128 rows, SWIZZLE_128B (GLM5_SKINNY_WKB: [K/128, N, 128], box 128 x 128 x 1);
//   x_map: x8 [M, K] e4m3, box 128 K-bytes x TM rows, SWIZZLE_128B.
// Launch: grid (tiles_n, splits, tiles_m), block 288, dynamic smem
// WgmmaSmem<TM, STAGES>::launch_bytes(gmax); PDL-ready (weights are issued before griddepcontrol.wait).
#include <stdint.h>
#if GLM5_SKINNY_PHASES
constexpr int kMaxPhaseCtas = 2048;
__device__ unsigned long long skinny_phase_ns[kMaxPhaseCtas * 8];
__device__ __forceinline__ unsigned long long skinny_globaltimer() {
    unsigned long long t;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
    return t;
}
__device__ __forceinline__ int skinny_phase_cta() {
    return static_cast<int>(blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z));
}
#define GLM5_SKINNY_MARK(i)                                                                       \
    do {                                                                                          \
        const int cta_ = skinny_phase_cta();                                                      \
        if (threadIdx.x == 0 && cta_ < kMaxPhaseCtas) skinny_phase_ns[cta_ * 8 + (i)] = skinny_globaltimer(); \
    } while (0)
#endif
#include "fp8_gemm_wgmma.cuh"

#ifndef GLM5_SKINNY_TM
#define GLM5_SKINNY_TM 16
#endif
#ifndef GLM5_SKINNY_STAGES
#define GLM5_SKINNY_STAGES 8
#endif
#ifndef GLM5_SKINNY_EPI
#define GLM5_SKINNY_EPI 0
#endif
#ifndef GLM5_SKINNY_ROT
#define GLM5_SKINNY_ROT 0
#endif
#ifndef GLM5_SKINNY_MINB
#define GLM5_SKINNY_MINB 1
#endif
#ifndef GLM5_SKINNY_DIAG
#define GLM5_SKINNY_DIAG 0
#endif
#ifndef GLM5_SKINNY_PIPE
#define GLM5_SKINNY_PIPE 0
#endif
#ifndef GLM5_SKINNY_REDUCE
#define GLM5_SKINNY_REDUCE 0
#endif
#ifndef GLM5_SKINNY_PERSIST
#define GLM5_SKINNY_PERSIST 0
#endif
#ifndef GLM5_SKINNY_PHASES
#define GLM5_SKINNY_PHASES 0
#endif
#ifndef GLM5_SKINNY_WKB
#define GLM5_SKINNY_WKB 0
#endif
#ifndef GLM5_SKINNY_INFLIGHT
#define GLM5_SKINNY_INFLIGHT 0
#endif
static_assert(!GLM5_SKINNY_PERSIST || (!GLM5_SKINNY_REDUCE && !GLM5_SKINNY_DIAG),
              "persistent launch: global split-K reduce, no diagnostic variants");
static_assert(!(GLM5_SKINNY_PHASES && GLM5_SKINNY_PERSIST), "phase marks: one CTA per unit only");
static_assert(!(GLM5_SKINNY_INFLIGHT && GLM5_SKINNY_PERSIST), "in-flight cap: one CTA per unit only");

using WgmmaTile = glm5::attn_pre::skinny::WgmmaGemmTile<GLM5_SKINNY_TM, GLM5_SKINNY_STAGES,
                                                        glm5::attn_pre::skinny::epi_with_rot(GLM5_SKINNY_EPI, GLM5_SKINNY_ROT),
                                                        GLM5_SKINNY_DIAG, GLM5_SKINNY_PIPE, GLM5_SKINNY_REDUCE,
                                                        GLM5_SKINNY_WKB, GLM5_SKINNY_INFLIGHT>;

extern "C" __global__ void __launch_bounds__(glm5::attn_pre::skinny::kWgThreads, GLM5_SKINNY_MINB)
glm5_fp8_gemm_wgmma(const glm5::attn_pre::skinny::SkinnyParams p, const __grid_constant__ CUtensorMap w_map,
                    const __grid_constant__ CUtensorMap x_map) {
    using namespace glm5::attn_pre::skinny;
    GLM5_SKINNY_MARK(0);
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry"), every role
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    uint8_t* smem = WgmmaTile::align_smem(smem_raw);
    const int tid = threadIdx.x;
    const bool producer = tid >= kThreads;  // warp 8
    const bool leader = tid == kThreads;    // its lane 0 issues every TMA
    // Same grid as the mma.sync launcher, (tiles_n, splits, tiles_m), but enumerated token block
    // fastest: CTAs are dispatched roughly in linear block order, so the token blocks that read the
    // same weight tile (M > kTM) run in the same wave and share it through L2.
    // Cluster reduce: the cluster (1, splits, 1) must hold the splits of ONE (n tile, token block),
    // so the grid is used as is (blockIdx.y = split = cluster rank).
    const int units = p.tiles_n * p.splits * p.tiles_m;
    if (GLM5_SKINNY_PERSIST && static_cast<int>(blockIdx.x) >= units) return;  // the host never launches more
    const int lin = GLM5_SKINNY_PERSIST ? static_cast<int>(blockIdx.x)  // persistent: this CTA's first unit
                                        : blockIdx.x + gridDim.x * (blockIdx.y + gridDim.y * blockIdx.z);
    const int tile_m = GLM5_SKINNY_REDUCE ? static_cast<int>(blockIdx.z) : lin % p.tiles_m;
    const int rest = lin / p.tiles_m;
    const auto c = GLM5_SKINNY_REDUCE ? WgmmaTile::coord(p, blockIdx.x, blockIdx.y, blockIdx.z)
                                      : WgmmaTile::coord(p, rest % p.tiles_n, rest / p.tiles_n, tile_m);

    if (leader) WgmmaTile::init_barriers(smem);
    __syncthreads();
    if (leader) WgmmaTile::prefetch_descriptors(&w_map, &x_map);
    // GLM5_PDL_WAIT_AT=1: after the barrier init and the descriptor prefetch, before the weights;
    // every thread (producer and math warps) passes it before its role.
    glm5::ptx::griddep_wait_at<1>();

    // Independent of the previous kernel: weight boxes of the first stages + the weight scales.
    if (leader) WgmmaTile::producer_prologue(p, c, &w_map, &x_map, smem);
    if (!producer) WgmmaTile::consumer_prologue(p, c, smem, tid);
    glm5::ptx::griddep_launch_dependents();
    // Activations, their scales and every epilogue input may be the previous kernel's output.
    glm5::ptx::griddep_wait();
    GLM5_SKINNY_MARK(1);
#if GLM5_SKINNY_PHASES
    if (tid == 0 && skinny_phase_cta() < kMaxPhaseCtas) {
        uint32_t smid;
        asm volatile("mov.u32 %0, %%smid;" : "=r"(smid));
        skinny_phase_ns[skinny_phase_cta() * 8 + 7] = smid;
    }
#endif

    if (GLM5_SKINNY_PERSIST) {
        if (producer) {
            if (leader) WgmmaTile::producer_persistent(p, &w_map, &x_map, smem, units);
            return;
        }
        uint32_t q = 0;  // stages consumed so far (ring slot / parity)
        for (int u = blockIdx.x; u < units; u += gridDim.x) {
            const auto cu = WgmmaTile::unit_coord(p, u);
            if (u != static_cast<int>(blockIdx.x)) {
                consumer_sync();  // every math warp is done with the previous unit's scales and finish scratch
                WgmmaTile::consumer_prologue(p, cu, smem, tid);
            }
            float acc[WgmmaTile::kNT][4];
            if (WgmmaTile::mainloop(p, cu, smem, tid, acc, q)) WgmmaTile::epilogue(p, cu, smem, tid, acc);
            q += static_cast<uint32_t>(cu.nk);
        }
        return;
    }
    if (producer) {
        if (leader) WgmmaTile::producer_mainloop(p, c, &w_map, &x_map, smem);
        if (GLM5_SKINNY_REDUCE && p.splits > 1) WgmmaTile::cluster_producer_sync();  // its share of the cluster barriers
        return;
    }
    float acc[WgmmaTile::kNT][4];
    const bool finishes = WgmmaTile::mainloop(p, c, smem, tid, acc);
    GLM5_SKINNY_MARK(4);
    if (!finishes) return;  // another split finishes this tile
    WgmmaTile::epilogue(p, c, smem, tid, acc);
    GLM5_SKINNY_MARK(5);
}
