// Standalone E2 kernels, calling the tile function of e2_topk.cuh. Compile-time configuration
// (the JIT cache key includes it):
//   GLM5_E2_THREADS  threads per CTA (64..1024, whole warps dividing 2048 bins evenly)
//   GLM5_E2_ITEMS    contiguous positions per thread and chunk (4, 8, 16 or 32)
//   GLM5_E2_MIN_BLOCKS  CTAs per SM for __launch_bounds__ (default 1 at 1024 threads, else 2)
// Kernels (same parameters):
//   glm5_e2_topk          grid (M, 1, 1): one CTA per row.
//   glm5_e2_topk_cluster  grid (M * C, 1, 1), cluster (C, 1, 1): C CTAs per row (long rows), each
//                         owning `chunks` consecutive chunks of THREADS*ITEMS positions.
// Block (GLM5_E2_THREADS, 1, 1); dynamic shared memory smem_chunks * THREADS*ITEMS * 4 bytes
// (chunks 1..smem_chunks of each CTA's segment); PDL-ready.
//   GLM5_E2_PHASES   (debug) record clock64() of thread 0 of CTA 0 at the phase marks of the
//                    single-chunk path into the __device__ array e2_phase_clock (read back with
//                    cuModuleGetGlobal; tests/ops/test_e2_topk.py prints the breakdown).
#include <stdint.h>
#ifdef GLM5_E2_PHASES
__device__ unsigned long long e2_phase_clock[16];
#define GLM5_E2_PHASE(i)                                                                       \
    do {                                                                                       \
        if (blockIdx.x == 0 && threadIdx.x == 0) e2_phase_clock[i] = clock64();               \
    } while (0)
#endif
#include "e2_topk.cuh"

#ifndef GLM5_E2_THREADS
#define GLM5_E2_THREADS 512
#endif
#ifndef GLM5_E2_ITEMS
#define GLM5_E2_ITEMS 16
#endif
// CTAs per SM the plain kernel's register budget is sized for: two below 1024 threads (M = 256 rows
// in one wave on 132 SMs).
#ifndef GLM5_E2_MIN_BLOCKS
#define GLM5_E2_MIN_BLOCKS (GLM5_E2_THREADS >= 1024 ? 1 : 2)
#endif

namespace {

constexpr int kFlagSeq64 = 1;            // seq_lens is int64 (else int32)
constexpr int kFlagBt64 = 2;             // block_table is int64 (else int32)
constexpr int kFlagMetaBeforeWait = 4;   // read seq_lens / block_table before griddepcontrol.wait

extern __shared__ __align__(16) uint32_t e2_chunk_smem[];

template <bool kCluster>
__device__ __forceinline__ void e2_topk_body(const float* logits, int64_t logits_stride, int32_t width,
                                             const void* seq_lens, const void* block_table, int64_t bt_stride,
                                             int32_t bt_cols, int32_t* out, int32_t topk, int32_t num_rows,
                                             int32_t flags, int32_t chunks, int32_t smem_chunks) {
    using Tile = glm5::attn_pre::E2TopkTile<GLM5_E2_THREADS, GLM5_E2_ITEMS, kCluster>;
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry")
    // GLM5_PDL_WAIT_AT=1 is the native point: the histogram zeroing and the metadata reads (flags
    // bit 2) are the whole prologue, and there are no weights to prefetch.
    __shared__ typename Tile::Smem smem;
    const int tid = threadIdx.x;
    GLM5_E2_PHASE(0);

    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();
    // Prologue that touches no global memory: zero the histograms.
    Tile::prologue(smem, tid);

    int n_cta = 1, rank = 0;
    int64_t row = blockIdx.x;
    if constexpr (kCluster) {
        n_cta = static_cast<int>(glm5::ptx::cluster_nctarank());
        rank = static_cast<int>(glm5::ptx::cluster_ctarank());
        row = blockIdx.x / n_cta;  // the grid is exactly M clusters: no CTA of a cluster leaves alone
    } else {
        if (row >= num_rows) return;  // whole CTA leaves together: no barrier is skipped by a part
    }
    const bool seq64 = (flags & kFlagSeq64) != 0, bt64 = (flags & kFlagBt64) != 0;
    glm5::attn_pre::E2RowArgs a;
    a.logits = logits + row * logits_stride;
    a.width = width;
    a.seq_len = seq64 ? static_cast<const void*>(static_cast<const int64_t*>(seq_lens) + row)
                      : static_cast<const void*>(static_cast<const int32_t*>(seq_lens) + row);
    a.bt = bt64 ? static_cast<const void*>(static_cast<const int64_t*>(block_table) + row * bt_stride)
                : static_cast<const void*>(static_cast<const int32_t*>(block_table) + row * bt_stride);
    a.bt_cols = bt_cols;
    a.out = out + row * static_cast<int64_t>(topk);
    a.topk = topk;
    a.seq_len_64 = seq64;
    a.bt_64 = bt64;
    a.chunks = chunks;
    a.smem_chunks = smem_chunks;
    a.chunk_smem = e2_chunk_smem;
    a.n_cta = n_cta;
    a.rank = rank;

    // logits are the previous kernel's output: read only after griddepcontrol.wait. seq_lens /
    // block_table are step metadata (graph inputs written before the step's first kernel): read
    // before the wait unless the caller says a still-running kernel may write them.
    glm5::attn_pre::E2Meta m;
    if (flags & kFlagMetaBeforeWait) {
        m = Tile::load_meta(a, smem, tid);
        glm5::ptx::griddep_wait();
    } else {
        glm5::ptx::griddep_wait();
        m = Tile::load_meta(a, smem, tid);
    }
    GLM5_E2_PHASE(1);
    Tile::run(a, m, smem, tid);
}

}  // namespace

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/e2_topk.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
#define GLM5_E2_PARAMS                                                                                          \
    const float *logits, int64_t logits_stride, int32_t width, const void *seq_lens, const void *block_table, \
        int64_t bt_stride, int32_t bt_cols, int32_t *__restrict__ out, int32_t topk, int32_t num_rows,       \
        int32_t flags, int32_t chunks, int32_t smem_chunks
#define GLM5_E2_ARGS \
    logits, logits_stride, width, seq_lens, block_table, bt_stride, bt_cols, out, topk, num_rows, flags, chunks, smem_chunks

extern "C" __global__ void __launch_bounds__(GLM5_E2_THREADS, GLM5_E2_MIN_BLOCKS) glm5_e2_topk(GLM5_E2_PARAMS) {
    e2_topk_body<false>(GLM5_E2_ARGS);
}

// One CTA per SM is the cluster kernel's budget (its CTAs hold up to ~180 KB of row on chip anyway).
extern "C" __global__ void __launch_bounds__(GLM5_E2_THREADS, 1) glm5_e2_topk_cluster(GLM5_E2_PARAMS) {
    e2_topk_body<true>(GLM5_E2_ARGS);
}
