// Standalone B0 row kernel (B0 split mode): one CTA of GLM5_B0N_THREADS threads per token, calling
// the tile of b0_row_norms.cuh on the plain skinny GEMM's bf16 output. Compile-time configuration
// (the JIT cache key includes it):
//   GLM5_B0N_Q        q_lora_rank   (multiple of 128; 2048 for GLM-5, 256 for the small preset)
//   GLM5_B0N_KV       kv_lora_rank  (multiple of 8;   512 for GLM-5, 128 for the small preset)
//   GLM5_B0N_R        qk_rope_head_dim (multiple of 8; 64 for GLM-5, 32 for the small preset)
//   GLM5_B0N_THREADS  threads per CTA (chosen by the Python launcher)
// Launch: grid (M, 1, 1), block (GLM5_B0N_THREADS, 1, 1), no dynamic shared memory; PDL-ready
// (norm weights before griddepcontrol.wait, launch_dependents right after them).
#include "b0_row_norms.cuh"

#ifndef GLM5_B0N_Q
#define GLM5_B0N_Q 2048
#endif
#ifndef GLM5_B0N_KV
#define GLM5_B0N_KV 512
#endif
#ifndef GLM5_B0N_R
#define GLM5_B0N_R 64
#endif
#ifndef GLM5_B0N_THREADS
#define GLM5_B0N_THREADS 256
#endif

using B0RowTile = glm5::attn_pre::B0RowNormsTile<GLM5_B0N_Q, GLM5_B0N_KV, GLM5_B0N_R, GLM5_B0N_THREADS>;

// Parameter order and types are the ABI the Python launcher packs (glm5_fastpath/ops/fp8_gemm.py,
// _row_norms_args); the runtime checks sizes against the cubin at load.
extern "C" __global__ void __launch_bounds__(GLM5_B0N_THREADS)
glm5_b0_row_norms(const uint16_t* __restrict__ qkv,      // [M, Q+KV+R] bf16
                  const uint16_t* __restrict__ q_norm,   // [Q] bf16
                  const uint16_t* __restrict__ kv_norm,  // [KV] bf16
                  uint16_t* __restrict__ q_lora,         // [M, Q] bf16
                  uint8_t* __restrict__ q_fp8,           // [M, Q] e4m3
                  float* __restrict__ q_scale,           // [M, Q/128] fp32 row-major
                  uint16_t* __restrict__ c_kv,           // [M, KV] bf16
                  uint16_t* __restrict__ k_pe,           // [M, R] bf16
                  int32_t num_rows, float eps) {
    glm5::ptx::griddep_wait_at<0>();  // GLM5_PDL_WAIT_AT=0 (pdl_wait="entry")
    __shared__ float scratch[B0RowTile::kScratchFloats];
    const int tid = threadIdx.x;
    // GLM5_PDL_WAIT_AT=1: no generic prologue here (no barrier, no metadata): before the weights.
    glm5::ptx::griddep_wait_at<1>();

    // Prologue that does not depend on the previous kernel: both norm weights into registers.
    typename B0RowTile::Gamma gamma;
    B0RowTile::load_gamma(gamma, q_norm, kv_norm, tid);

    // Let the next kernel on the stream get scheduled now; it waits for our completion itself.
    glm5::ptx::griddep_launch_dependents();
    // qkv is written by the previous kernel (the plain GEMM): nothing of it is read before this.
    glm5::ptx::griddep_wait();

    const int64_t row = blockIdx.x;
    if (row >= num_rows) return;  // whole CTA leaves together: no barrier is skipped by a part
    constexpr int Q = GLM5_B0N_Q, KV = GLM5_B0N_KV, R = GLM5_B0N_R;
    const glm5::attn_pre::B0RowPtrs p{qkv + row * B0RowTile::kN, q_lora + row * Q, q_fp8 + row * Q,
                                      q_scale + row * (Q / 128),  c_kv + row * KV,  k_pe + row * R};
    B0RowTile::run(gamma, p, eps, scratch, tid);
}
