// Standalone E2 kernel: one CTA of GLM5_E2_THREADS threads per row, calling the tile function of
// e2_topk.cuh. Compile-time configuration (the JIT cache key includes it):
//   GLM5_E2_THREADS  threads per CTA (128..1024, whole warps dividing 1024)
//   GLM5_E2_ITEMS    contiguous positions per thread and chunk (4, 8 or 16); rows of up to
//                    THREADS*ITEMS live tokens stay in registers, longer rows are re-read from L2
// Launch: grid (M, 1, 1), block (GLM5_E2_THREADS, 1, 1), no dynamic shared memory; PDL-ready.
#include "e2_topk.cuh"

#ifndef GLM5_E2_THREADS
#define GLM5_E2_THREADS 1024
#endif
#ifndef GLM5_E2_ITEMS
#define GLM5_E2_ITEMS 8
#endif

using E2Tile = glm5::attn_pre::E2TopkTile<GLM5_E2_THREADS, GLM5_E2_ITEMS>;

// flags bit 0: seq_lens is int64 (else int32); bit 1: block_table is int64 (else int32).
// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/e2_topk.py,
// _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(GLM5_E2_THREADS, 1)
glm5_e2_topk(const float* logits,          // [M, >= width] fp32, row stride logits_stride
             int64_t logits_stride,        // elements
             int32_t width,                // columns that may be read
             const void* seq_lens,         // [M] int32 / int64
             const void* block_table,      // [M, >= bt_cols] int32 / int64, row stride bt_stride
             int64_t bt_stride,            // elements
             int32_t bt_cols,
             int32_t* __restrict__ out,    // [M, topk] int32, contiguous
             int32_t topk, int32_t num_rows, int32_t flags) {
    __shared__ typename E2Tile::Smem smem;
    const int tid = threadIdx.x;

    // Prologue that does not depend on the previous kernel: zero the histograms.
    E2Tile::prologue(smem, tid);

    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();
    // logits are the previous kernel's output; seq_lens / block_table may be too (a metadata
    // kernel in the same graph), so nothing global is read or written before this.
    glm5::ptx::griddep_wait();

    const int64_t row = blockIdx.x;
    if (row >= num_rows) return;  // whole CTA leaves together: no barrier is skipped by a part
    const bool seq64 = (flags & 1) != 0, bt64 = (flags & 2) != 0;
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
    E2Tile::run(a, smem, tid);
}
