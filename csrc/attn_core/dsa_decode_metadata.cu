// Launcher of the DSA decode metadata tile (dsa_decode_metadata.cuh): glm5_dsa_decode_metadata.
// Launch: grid (bs, ceil(max_len / 256), 1), block (256, 1, 1), no shared memory, on the stream SGLang prepares the
// replay's inputs on, before the graph launch (no PDL: the producers are torch copies).
#include "dsa_decode_metadata.cuh"

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/dsa_metadata.py, _kernel_args).
extern "C" __global__ void __launch_bounds__(glm5::attn_core::DsaDecodeMetadataTile::kThreads)
glm5_dsa_decode_metadata(const int32_t* __restrict__ req_to_token, const void* __restrict__ req_pool_indices,
                         const void* __restrict__ seq_lens, int32_t* __restrict__ cache_seqlens,
                         int32_t* __restrict__ cu_seqlens_k, int32_t* __restrict__ dsa_seqlens,
                         int32_t* __restrict__ dsa_cu, int32_t* __restrict__ page_table_1,
                         int32_t* __restrict__ real_table, int64_t req_to_token_stride, int64_t page_table_stride,
                         int64_t real_table_stride, int32_t bs, int32_t max_len, int32_t topk, int32_t page_size,
                         int32_t idx_int64, int32_t lens_int64) {
    const glm5::attn_core::DsaDecodeMetadataParams p{
        req_to_token, req_pool_indices, seq_lens, cache_seqlens, cu_seqlens_k, dsa_seqlens, dsa_cu, page_table_1,
        real_table, req_to_token_stride, page_table_stride, real_table_stride, bs, max_len, topk, page_size,
        idx_int64, lens_int64};
    glm5::attn_core::DsaDecodeMetadataTile::run(p, blockIdx.x, blockIdx.y, threadIdx.x);
}
