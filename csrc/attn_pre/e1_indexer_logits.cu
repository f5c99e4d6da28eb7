// Standalone E1 kernel: one CTA of GLM5_E1_THREADS threads per (KV split, sequence), calling the
// tile function of e1_indexer_logits.cuh. Compile-time configuration (the JIT cache key includes it):
//   GLM5_E1_HEADS      indexer heads (32 for GLM-5, 4 for the small preset)
//   GLM5_E1_DIM        indexer head dim (128 for GLM-5, 64 for the small preset)
//   GLM5_E1_STAGES     pages in flight per CTA (shared-memory ring)
//   GLM5_E1_MAX_PAGES  most pages per split (sizes the shared logits buffer)
//   GLM5_E1_THREADS    threads per CTA
// Launch: grid (ceil(max_ctx / (pages_per_split * 64)), M, 1), block (GLM5_E1_THREADS, 1, 1),
// dynamic shared memory E1Tile::kSmemBytes; PDL-ready.
//   GLM5_PDL_WAIT_AT   where the first griddepcontrol.wait runs (csrc/common/pdl.cuh): 0 entry,
//                      1 after the prologue and before the L2 prefetch, 2 (default) native
#include "e1_indexer_logits.cuh"

#ifndef GLM5_E1_HEADS
#define GLM5_E1_HEADS 32
#endif
#ifndef GLM5_E1_DIM
#define GLM5_E1_DIM 128
#endif
#ifndef GLM5_E1_STAGES
#define GLM5_E1_STAGES 4
#endif
#ifndef GLM5_E1_MAX_PAGES
#define GLM5_E1_MAX_PAGES 16
#endif
#ifndef GLM5_E1_THREADS
#define GLM5_E1_THREADS 128
#endif

using E1Tile = glm5::attn_pre::E1IndexerLogitsTile<GLM5_E1_HEADS, GLM5_E1_DIM, GLM5_E1_STAGES, GLM5_E1_MAX_PAGES,
                                                   GLM5_E1_THREADS>;

// flags bit 0: read seq_lens / block_table and prefetch the first pages into L2 BEFORE
// griddepcontrol.wait. Valid only when no kernel that may still be running writes seq_lens or
// block_table (step metadata written before the step's first kernel). Otherwise everything
// happens after the wait.
#define GLM5_E1_FLAG_META_BEFORE_WAIT 1

// NOTES: no __restrict__ on the inputs: with it nvcc turns their loads into the non-coherent
// (LDG.CONSTANT) path, and q / head_w / the cache (and, with flags bit 0 clear, the metadata)
// are written by kernels this one may overlap under PDL; every read here is an ordinary coherent
// load or a bulk copy through L2.
// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/
// e1_indexer_logits.py, _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(GLM5_E1_THREADS)
glm5_e1_indexer_logits(const uint8_t* q_fp8,        // [M, H, D] e4m3
                       const float* head_w,         // [M, H] fp32
                       const uint8_t* cache,        // [num_pages, 64 * (D + 4)] bytes
                       const int32_t* seq_lens,     // [M]
                       const int32_t* block_table,  // [M, width], row stride bt_stride
                       float* logits,               // [M, max_ctx] fp32
                       int64_t num_pages, int64_t bt_stride, int32_t bt_width, int32_t max_ctx,
                       int32_t pages_per_split, int32_t flags) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry"): before anything
    extern __shared__ __align__(128) uint8_t smem[];
    const int tid = threadIdx.x;
    // The launcher guarantees both; a mismatch (e.g. a stale smem size) must not corrupt memory.
    uint32_t dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (pages_per_split < 1 || pages_per_split > GLM5_E1_MAX_PAGES || dyn_smem < E1Tile::kSmemBytes) __trap();

    // Address math only: nothing here depends on the preceding kernels.
    const int64_t row = blockIdx.y;
    const int split_tokens = pages_per_split * E1Tile::kPageTokens;
    const int t0 = static_cast<int>(blockIdx.x) * split_tokens;
    const int64_t capacity = min(static_cast<int64_t>(max_ctx), static_cast<int64_t>(bt_width) * E1Tile::kPageTokens);
    glm5::attn_pre::E1TileArgs a;
    a.q = q_fp8 + row * (GLM5_E1_HEADS * GLM5_E1_DIM);
    a.head_w = head_w + row * GLM5_E1_HEADS;
    a.cache = cache;
    a.block_table = block_table + row * bt_stride;
    a.logits = logits + row * static_cast<int64_t>(max_ctx);
    a.num_pages = num_pages;
    a.t0 = t0;
    a.t_end = min(t0 + split_tokens, max_ctx);

    const bool meta_first = (flags & GLM5_E1_FLAG_META_BEFORE_WAIT) != 0;
    if (meta_first) {
        a.seq_len = static_cast<int32_t>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(seq_lens[row]), capacity)));
        // GLM5_PDL_WAIT_AT=1 (pdl_wait="after_prologue"): the prologue (block-table reads, mbarrier
        // init, CTA barrier) runs without its L2 prefetch, then the wait, then the prefetch of the
        // first pages. Natively (2) the prologue prefetches as it reads (the same code as before the
        // switch existed). Without flags bit 0 the native wait below comes first anyway (before any read).
        E1Tile::prologue(a, smem, tid, /*l2_prefetch=*/glm5::ptx::kPdlWaitAt != 1);
        glm5::ptx::griddep_wait_at<1>();
        if constexpr (glm5::ptx::kPdlWaitAt == 1) E1Tile::prefetch_l2(a, smem, tid);
    }
    // Let the next kernel get scheduled; it waits for our completion in its own griddep_wait().
    glm5::ptx::griddep_launch_dependents();
    // q_fp8 / head_w (D1) and the index-K cache (B1) are the preceding kernels' outputs.
    glm5::ptx::griddep_wait();
    if (!meta_first) {
        a.seq_len = static_cast<int32_t>(max(static_cast<int64_t>(0), min(static_cast<int64_t>(seq_lens[row]), capacity)));
        E1Tile::prologue(a, smem, tid, /*l2_prefetch=*/false);
    }
    E1Tile::run(a, smem, tid);
}
