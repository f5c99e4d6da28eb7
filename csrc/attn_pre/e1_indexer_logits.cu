// Standalone E1 kernel: gridDim.x CTAs (the launcher picks ~2 per SM), each a consumer warpgroup
// (warps 0..3) + a producer warp (warp 4), running the roles of e1_indexer_logits.cuh over the
// CTA's balanced share of the batch's pages. Compile-time configuration (part of the JIT key):
//   GLM5_E1_HEADS      indexer heads (32 for GLM-5, 4 for the small preset)
//   GLM5_E1_DIM        indexer head dim (128 for GLM-5, 64 for the small preset)
//   GLM5_E1_STAGES     pages in flight per CTA (shared-memory ring)
//   GLM5_E1_PREFETCH   pages L2-prefetched before griddepcontrol.wait (with flags bit 0)
//   GLM5_E1_SMEM_BYTES (optional) the launcher's dynamic shared memory size, checked at compile time
// Launch: grid (ctas, 1, 1), block (160, 1, 1), dynamic shared memory E1::kSmemBytes; PDL-ready.
#include "e1_indexer_logits.cuh"

#ifndef GLM5_E1_HEADS
#define GLM5_E1_HEADS 32
#endif
#ifndef GLM5_E1_DIM
#define GLM5_E1_DIM 128
#endif
#ifndef GLM5_E1_STAGES
#define GLM5_E1_STAGES 7
#endif
#ifndef GLM5_E1_PREFETCH
#define GLM5_E1_PREFETCH 8
#endif

using E1 = glm5::attn_pre::E1PagedLogits<GLM5_E1_HEADS, GLM5_E1_DIM, GLM5_E1_STAGES, GLM5_E1_PREFETCH>;

// The Python launcher passes the dynamic shared memory it computes (E1Config.smem_bytes): a
// mismatch with the layout here fails the build instead of trapping at run time.
#ifdef GLM5_E1_SMEM_BYTES
static_assert(E1::kSmemBytes == GLM5_E1_SMEM_BYTES, "glm5_fastpath/ops/e1_indexer_logits.py E1Config.smem_bytes is stale");
#endif

// flags bit 0: read seq_lens / block_table and L2-prefetch the first pages BEFORE
// griddepcontrol.wait. Valid only when no kernel that may still be running writes seq_lens or
// block_table (step metadata written before the step's first kernel). Otherwise everything
// happens after the wait.
#define GLM5_E1_FLAG_META_BEFORE_WAIT 1

// NOTES: no __restrict__ on the inputs: with it nvcc may turn their loads into the non-coherent
// (LDG.CONSTANT) path, and q / head_w / the cache (and, with flags bit 0 clear, the metadata)
// are written by kernels this one may overlap under PDL; every read here is an ordinary coherent
// load or a bulk copy through L2.
// NOTES: __launch_bounds__(160, 3): <= 136 registers so that 3 CTAs fit an SM (2 of this grid +
// 1 of the next kernel in the stream, started early under PDL); E1::kSmemBytes (~68 KB for
// GLM-5) is sized for the same 3.
// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/
// e1_indexer_logits.py, _kernel_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(E1::kThreads, 3)
glm5_e1_indexer_logits(const uint8_t* q_fp8,        // [M, H, D] e4m3
                       const float* head_w,         // [M, H] fp32
                       const uint8_t* cache,        // [num_pages, 64 * (D + 4)] bytes
                       const int32_t* seq_lens,     // [M]
                       const int32_t* block_table,  // [M, width], row stride bt_stride
                       float* logits,               // [M, max_ctx] fp32
                       int64_t num_pages, int64_t bt_stride, int32_t m, int32_t bt_width, int32_t max_ctx,
                       int32_t flags) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry"), both roles
    extern __shared__ __align__(1024) uint8_t smem_raw[];
    const int tid = threadIdx.x;
    // The launcher guarantees these; a mismatch (e.g. a stale smem size) must not corrupt memory.
    uint32_t dyn_smem;
    asm("mov.u32 %0, %%dynamic_smem_size;" : "=r"(dyn_smem));
    if (blockDim.x != E1::kThreads || dyn_smem < E1::kSmemBytes) __trap();
    uint8_t* sm = E1::align_smem(smem_raw);

    glm5::attn_pre::E1Problem p;
    p.q = q_fp8;
    p.head_w = head_w;
    p.cache = cache;
    p.seq_lens = seq_lens;
    p.block_table = block_table;
    p.logits = logits;
    p.num_pages = num_pages;
    p.bt_stride = bt_stride;
    p.m = m;
    p.bt_width = bt_width;
    p.max_ctx = max_ctx;

    if (tid == 0) E1::init_barriers(sm);  // made visible by plan()'s CTA barriers
    const int cta = static_cast<int>(blockIdx.x), ctas = static_cast<int>(gridDim.x);
    const bool meta_first = (flags & GLM5_E1_FLAG_META_BEFORE_WAIT) != 0;
    const bool producer = (tid >> 5) == E1::kProducerWarp;
    if (meta_first) {
        E1::plan(p, cta, ctas, sm, tid);
        // GLM5_PDL_WAIT_AT=1: after the barrier init and the metadata reads (the plan), before the L2
        // page prefetch; every thread (producer warp and consumer warpgroup). Without flags bit 0 the
        // native wait below comes first anyway (after the barrier init, before any read).
        glm5::ptx::griddep_wait_at<1>();
        if (producer) E1::producer_prefetch(p, sm, tid & 31);
    }
    // q_fp8 / head_w (D1) and the index-K cache (B1) are the preceding kernels' outputs; so is the
    // logits buffer's previous reader (write-after-read), so nothing is written before the wait.
    glm5::ptx::griddep_wait();
    if (!meta_first) E1::plan(p, cta, ctas, sm, tid);
    if (producer)
        E1::producer_run(p, sm, tid & 31);  // triggers launch_dependents after its last page
    else
        E1::consumer_run(p, sm, tid);
}
