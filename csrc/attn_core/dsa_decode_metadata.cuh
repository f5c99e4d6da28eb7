// DSA decode metadata tile: the per-step tensors SGLang's DSA backend prepares before a decode CUDA-graph replay
// (sglang 0.5.14 DeepseekSparseAttnBackend._apply_cuda_graph_metadata, decode branch), all in one launch instead of
// ~12 small torch ops (each a host dispatch and a kernel; at batch 1 the engine step is paced by the host).
//
// For request b < bs of the batch, with s_b = seq_lens[b] (int64 or int32) and r_b = req_pool_indices[b]:
//   cache_seqlens[b]    = int32(s_b)
//   cu_seqlens_k[b + 1] = sum_{i <= b} int32(s_i)                        (int32 wrap-around, as torch.cumsum)
//   dsa_seqlens[b]      = min(int32(s_b), topk)
//   dsa_cu[b + 1]       = sum_{i <= b} dsa_seqlens[i]
//   page_table_1[b, c]  = req_to_token[r_b, c]               for c < max_len
//   real_table[b, j]    = floor(req_to_token[r_b, j * ps] / ps)   for j < ceil(max_len / ps), when ps > 1
// Index 0 of cu_seqlens_k / dsa_cu is never written (SGLang's buffers hold 0 there from allocation).
//
// Grid (bs, ceil(max_len / kThreads)), kThreads threads: CTA (b, y) copies columns [y * kThreads, +kThreads) of row
// b; thread 0 of CTA (b, 0) also writes the four scalars of b (the prefix sums re-add b + 1 values: bs is a decode
// batch, small). No shared memory; framework-free (raw pointers).
#pragma once

#include <stdint.h>

#include "../common/arch.cuh"

namespace glm5 {
namespace attn_core {

struct DsaDecodeMetadataParams {
    const int32_t* req_to_token;  // [pool, ctx] int32, rows req_to_token_stride apart
    const void* req_pool_indices; // [bs] int64 or int32 (idx_int64)
    const void* seq_lens;         // [bs] int64 or int32 (lens_int64)
    int32_t* cache_seqlens;       // [bs]
    int32_t* cu_seqlens_k;        // [>= bs + 1]
    int32_t* dsa_seqlens;         // [bs]
    int32_t* dsa_cu;              // [>= bs + 1]
    int32_t* page_table_1;        // [bs, >= max_len], rows page_table_stride apart
    int32_t* real_table;          // [bs, >= ceil(max_len / ps)], rows real_table_stride apart; null when ps == 1
    int64_t req_to_token_stride, page_table_stride, real_table_stride;
    int32_t bs, max_len, topk, page_size;
    int32_t idx_int64, lens_int64;
};

struct DsaDecodeMetadataTile {
    static constexpr int kThreads = 256;

    static GLM5_DEVICE int64_t load_index(const void* p, int i, int is64) {
        return is64 ? static_cast<const int64_t*>(p)[i] : static_cast<int64_t>(static_cast<const int32_t*>(p)[i]);
    }

    // floor division (torch's // on integers), for any sign
    static GLM5_DEVICE int32_t floor_div(int32_t a, int32_t d) {
        const int32_t q = a / d;
        return (a % d != 0 && ((a < 0) != (d < 0))) ? q - 1 : q;
    }

    static GLM5_DEVICE void run(const DsaDecodeMetadataParams& p, int b, int col_block, int tid) {
        if (b >= p.bs) return;
        if (col_block == 0 && tid == 0) {
            uint32_t cu = 0, dcu = 0;  // unsigned: the int32 wrap-around of torch.cumsum without UB
            int32_t s_b = 0, d_b = 0;
            for (int i = 0; i <= b; ++i) {
                const int32_t s = static_cast<int32_t>(load_index(p.seq_lens, i, p.lens_int64));
                const int32_t d = s < p.topk ? s : p.topk;
                cu += static_cast<uint32_t>(s);
                dcu += static_cast<uint32_t>(d);
                s_b = s, d_b = d;
            }
            p.cache_seqlens[b] = s_b;
            p.dsa_seqlens[b] = d_b;
            p.cu_seqlens_k[b + 1] = static_cast<int32_t>(cu);
            p.dsa_cu[b + 1] = static_cast<int32_t>(dcu);
        }
        const int c = col_block * kThreads + tid;
        if (c >= p.max_len) return;
        const int64_t r = load_index(p.req_pool_indices, b, p.idx_int64);
        const int32_t v = p.req_to_token[r * p.req_to_token_stride + c];
        p.page_table_1[static_cast<int64_t>(b) * p.page_table_stride + c] = v;
        if (p.real_table != nullptr && c % p.page_size == 0)
            p.real_table[static_cast<int64_t>(b) * p.real_table_stride + c / p.page_size] = floor_div(v, p.page_size);
    }
};

}  // namespace attn_core
}  // namespace glm5
