"""The cost model reproduces spec/glm5_layer.md section 7 and appendix A, row by row (CPU, fast).

Printed spec values are compared at their printed precision: |ours - printed| <= half a unit of
the last printed digit, or relative 1e-3 (whichever is looser). Where the spec's own numbers are
inconsistent, the test says so next to the check.
"""
from __future__ import annotations

import re

import pytest
import torch

from glm5_fastpath import cost as C
from glm5_fastpath.config import Glm5Config

GLM5 = Glm5Config.preset("glm5")
L = 8192


def agrees(ours: float, printed: str, rel: float = 1e-3) -> bool:
    printed = printed.replace("*", "").replace(" ", "").strip()
    p = float(printed)
    if p == 0:
        return abs(ours) < 1e-12
    mant, _, exp = printed.lower().partition("e")
    decimals = len(mant.split(".")[1]) if "." in mant else 0
    half_ulp = 0.5 * 10.0 ** ((int(exp) if exp else 0) - decimals)
    return abs(ours - p) <= half_ulp * (1 + 1e-9) or abs(ours - p) <= rel * abs(p)


def test_agrees_helper():
    assert agrees(0.07854, "0.0785") and not agrees(0.0787, "0.0785")
    assert agrees(1974.0, "1.97e+03") and not agrees(1990.0, "1.97e+03")
    assert agrees(0.0, "0") and not agrees(1e-3, "0")
    assert agrees(11102.5, "11100")  # relative 1e-3


# ---- appendix A, verbatim ---------------------------------------------------------------------------------

APPENDIX = """
#### Attention prefix, M=1, L=8192 per sequence (M independent sequences)
| A0 | fused_add_rmsnorm(6144) [input_layernorm] | 3.072e-05 | 0.01229 | 0.04915 | 0.06144 | 0.0143 | 3.11e-05 |
| A0 | per_token_group_quant_fp8(x,128) [SGLang: separate] | 1.229e-05 | 0 | 0.01862 | 0.01862 | 0.00433 | 1.24e-05 |
| B0 | QKV-A fp8 GEMM K=6144 N=2624 (DeepGEMM) | 0.03224 | 16.13 | 0.01158 | 16.14 | 3.75 | 0.0163 |
| B0+ | q_a_layernorm RMSNorm(2048) | 8.192e-06 | 0.004096 | 0.008192 | 0.01229 | 0.00286 | 8.28e-06 |
| B0+ | kv_a_layernorm RMSNorm(512) | 2.048e-06 | 0.001024 | 0.002048 | 0.003072 | 0.000714 | 2.07e-06 |
| C0 | Head-Gate weights_proj bf16 GEMM K=6144 N=32 | 0.0003932 | 0.3932 | 0.01242 | 0.4056 | 0.0943 | 0.000398 |
| B1 | Indexer-K wk fp8 GEMM K=6144 N=128 (checkpoint fp8) | 0.001573 | 0.7866 | 0.006592 | 0.7932 | 0.184 | 0.000795 |
| B1 | k LayerNorm+RoPE(64, interleaved)+fp8 quant+store idxK | 1.536e-06 | 0.001024 | 0.000644 | 0.001668 | 0.000388 | 1.55e-06 |
| D1 | q_lora act quant (for wq_b) | 4.096e-06 | 0 | 0.006208 | 0.006208 | 0.00144 | 4.14e-06 |
| D1 | Indexer-Q wq_b fp8 GEMM K=2048 N=4096 | 0.01678 | 8.391 | 0.0103 | 8.401 | 1.95 | 0.00848 |
| D1 | q RoPE(64)+per-head fp8 quant+head weights | 2.458e-05 | 0 | 0.01274 | 0.01274 | 0.00296 | 2.48e-05 |
| D0 | q_lora act quant (for q_b_proj) | 4.096e-06 | 0 | 0.006208 | 0.006208 | 0.00144 | 4.14e-06 |
| D0 | q_b_proj fp8 GEMM K=2048 N=16384 | 0.06711 | 33.56 | 0.03488 | 33.6 | 7.81 | 0.0339 |
| D2 | W_UK absorb bmm bf16 [64]x(Mx192)x(192x512) | 0.01258 | 12.58 | 0.09011 | 12.67 | 2.95 | 0.0127 |
| rope | MLA RoPE q_pe(64x64)+k_pe(64) interleaved | 2.496e-05 | 0 | 0.0169 | 0.0169 | 0.00393 | 2.52e-05 |
| kv | MLA latent KV store (512 normed + 64 roped) | 0 | 0 | 0.002304 | 0.002304 | 0.000536 | 0 |
| E1 | fp8_paged_mqa_logits (DeepGEMM) L=8192 | 0.0679 | 0 | 1.119 | 1.119 | 0.26 | 0.0343 |
| E2 | top-2048 + page-table transform (sgl_kernel) | 1.638e-05 | 0 | 0.04915 | 0.04915 | 0.0114 | 1.66e-05 |
| **sum** | | **0.1987** | **71.86** | **1.457** | **73.32** | **17.1** | **0.107** |
#### Attention core (not prefix), M=1
| F0 | sparse MLA decode (top-2048, bf16 latent KV 576) | 0.2852 | 0 | 2.507 | 2.507 | 0.583 | 0.288 |
| F1 | W_UV bmm bf16 (Mx512)x(512x256) x64 heads | 0.01678 | 16.78 | 0.0983 | 16.88 | 3.92 | 0.017 |
| F2 | o_proj fp8 GEMM K=16384 N=6144 | 0.2013 | 100.7 | 0.02918 | 100.7 | 23.4 | 0.102 |
| **sum** | | **0.5033** | **117.5** | **2.634** | **120.1** | **27.9** | **0.407** |
#### MoE (expected unique experts, uniform routing), M=1
| M0 | fused_add_rmsnorm(6144) [post_attention_layernorm] | 3.072e-05 | 0.01229 | 0.04915 | 0.06144 | 0.0143 | 3.11e-05 |
| M1 | router gate bf16 GEMM K=6144 N=256 -> fp32 | 0.003146 | 3.146 | 0.01331 | 3.159 | 0.735 | 0.00318 |
| M2 | sigmoid+bias top-8 (n_group=1)+renorm (flashinfer fused_topk_deepseek) | 2.56e-06 | 0.001024 | 0.001088 | 0.002112 | 0.000491 | 2.59e-06 |
| M3 | per_token_group_quant_fp8(x,128) | 1.229e-05 | 0 | 0.01862 | 0.01862 | 0.00433 | 1.24e-05 |
| M4 | FC1 w13 fp8 grouped GEMM K=6144 N=4096 (8.0+1 experts) | 0.453 | 226.5 | 0.1308 | 226.7 | 52.7 | 0.229 |
| M5 | silu(gate)*up | 7.373e-05 | 0 | 0.1106 | 0.1106 | 0.0257 | 7.45e-05 |
| M6 | per_token_group_quant_fp8(h,128) | 3.686e-05 | 0 | 0.05587 | 0.05587 | 0.013 | 3.73e-05 |
| M7 | FC2 w2 fp8 grouped GEMM K=2048 N=6144 | 0.2265 | 113.3 | 0.1296 | 113.4 | 26.4 | 0.114 |
| M8 | moe_sum_reduce (topk-weighted sum x2.5) | 0.0001106 | 0 | 0.1229 | 0.1229 | 0.0286 | 0.000112 |
| **sum** | | **0.6829** | **343** | **0.6319** | **343.6** | **79.9** | **0.347** |
#### Attention prefix, M=16, L=8192 per sequence (M independent sequences)
| A0 | fused_add_rmsnorm(6144) [input_layernorm] | 0.0004915 | 0.01229 | 0.7864 | 0.7987 | 0.186 | 0.000497 |
| A0 | per_token_group_quant_fp8(x,128) [SGLang: separate] | 0.0001966 | 0 | 0.298 | 0.298 | 0.0693 | 0.000199 |
| B0 | QKV-A fp8 GEMM K=6144 N=2624 (DeepGEMM) | 0.5159 | 16.13 | 0.1853 | 16.31 | 3.79 | 0.261 |
| B0+ | q_a_layernorm RMSNorm(2048) | 0.0001311 | 0.004096 | 0.1311 | 0.1352 | 0.0314 | 0.000133 |
| B0+ | kv_a_layernorm RMSNorm(512) | 3.277e-05 | 0.001024 | 0.03277 | 0.03379 | 0.00786 | 3.31e-05 |
| C0 | Head-Gate weights_proj bf16 GEMM K=6144 N=32 | 0.006291 | 0.3932 | 0.1987 | 0.5919 | 0.138 | 0.00636 |
| B1 | Indexer-K wk fp8 GEMM K=6144 N=128 (checkpoint fp8) | 0.02517 | 0.7866 | 0.1055 | 0.8921 | 0.207 | 0.0127 |
| B1 | k LayerNorm+RoPE(64, interleaved)+fp8 quant+store idxK | 2.458e-05 | 0.001024 | 0.0103 | 0.01133 | 0.00263 | 2.48e-05 |
| D1 | q_lora act quant (for wq_b) | 6.554e-05 | 0 | 0.09933 | 0.09933 | 0.0231 | 6.63e-05 |
| D1 | Indexer-Q wq_b fp8 GEMM K=2048 N=4096 | 0.2684 | 8.391 | 0.1649 | 8.556 | 1.99 | 0.136 |
| D1 | q RoPE(64)+per-head fp8 quant+head weights | 0.0003932 | 0 | 0.2038 | 0.2038 | 0.0474 | 0.000398 |
| D0 | q_lora act quant (for q_b_proj) | 6.554e-05 | 0 | 0.09933 | 0.09933 | 0.0231 | 6.63e-05 |
| D0 | q_b_proj fp8 GEMM K=2048 N=16384 | 1.074 | 33.56 | 0.5581 | 34.12 | 7.94 | 0.543 |
| D2 | W_UK absorb bmm bf16 [64]x(Mx192)x(192x512) | 0.2013 | 12.58 | 1.442 | 14.02 | 3.26 | 0.204 |
| rope | MLA RoPE q_pe(64x64)+k_pe(64) interleaved | 0.0003994 | 0 | 0.2703 | 0.2703 | 0.0629 | 0.000404 |
| kv | MLA latent KV store (512 normed + 64 roped) | 0 | 0 | 0.03686 | 0.03686 | 0.00857 | 0 |
| E1 | fp8_paged_mqa_logits (DeepGEMM) L=8192 | 1.086 | 0 | 17.9 | 17.9 | 4.16 | 0.549 |
| E2 | top-2048 + page-table transform (sgl_kernel) | 0.0002621 | 0 | 0.7864 | 0.7864 | 0.183 | 0.000265 |
| **sum** | | **3.179** | **71.86** | **23.31** | **95.17** | **22.1** | **1.71** |
#### Attention prefix, M=16, one shared KV sequence L=8192 (article E1 assumption)
| A0 | fused_add_rmsnorm(6144) [input_layernorm] | 0.0004915 | 0.01229 | 0.7864 | 0.7987 | 0.186 | 0.000497 |
| A0 | per_token_group_quant_fp8(x,128) [SGLang: separate] | 0.0001966 | 0 | 0.298 | 0.298 | 0.0693 | 0.000199 |
| B0 | QKV-A fp8 GEMM K=6144 N=2624 (DeepGEMM) | 0.5159 | 16.13 | 0.1853 | 16.31 | 3.79 | 0.261 |
| B0+ | q_a_layernorm RMSNorm(2048) | 0.0001311 | 0.004096 | 0.1311 | 0.1352 | 0.0314 | 0.000133 |
| B0+ | kv_a_layernorm RMSNorm(512) | 3.277e-05 | 0.001024 | 0.03277 | 0.03379 | 0.00786 | 3.31e-05 |
| C0 | Head-Gate weights_proj bf16 GEMM K=6144 N=32 | 0.006291 | 0.3932 | 0.1987 | 0.5919 | 0.138 | 0.00636 |
| B1 | Indexer-K wk fp8 GEMM K=6144 N=128 (checkpoint fp8) | 0.02517 | 0.7866 | 0.1055 | 0.8921 | 0.207 | 0.0127 |
| B1 | k LayerNorm+RoPE(64, interleaved)+fp8 quant+store idxK | 2.458e-05 | 0.001024 | 0.0103 | 0.01133 | 0.00263 | 2.48e-05 |
| D1 | q_lora act quant (for wq_b) | 6.554e-05 | 0 | 0.09933 | 0.09933 | 0.0231 | 6.63e-05 |
| D1 | Indexer-Q wq_b fp8 GEMM K=2048 N=4096 | 0.2684 | 8.391 | 0.1649 | 8.556 | 1.99 | 0.136 |
| D1 | q RoPE(64)+per-head fp8 quant+head weights | 0.0003932 | 0 | 0.2038 | 0.2038 | 0.0474 | 0.000398 |
| D0 | q_lora act quant (for q_b_proj) | 6.554e-05 | 0 | 0.09933 | 0.09933 | 0.0231 | 6.63e-05 |
| D0 | q_b_proj fp8 GEMM K=2048 N=16384 | 1.074 | 33.56 | 0.5581 | 34.12 | 7.94 | 0.543 |
| D2 | W_UK absorb bmm bf16 [64]x(Mx192)x(192x512) | 0.2013 | 12.58 | 1.442 | 14.02 | 3.26 | 0.204 |
| rope | MLA RoPE q_pe(64x64)+k_pe(64) interleaved | 0.0003994 | 0 | 0.2703 | 0.2703 | 0.0629 | 0.000404 |
| kv | MLA latent KV store (512 normed + 64 roped) | 0 | 0 | 0.03686 | 0.03686 | 0.00857 | 0 |
| E1 | fp8_paged_mqa_logits (DeepGEMM) L=8192 | 1.086 | 0 | 1.674 | 1.674 | 0.389 | 0.549 |
| E2 | top-2048 + page-table transform (sgl_kernel) | 0.0002621 | 0 | 0.7864 | 0.7864 | 0.183 | 0.000265 |
| **sum** | | **3.179** | **71.86** | **7.083** | **78.94** | **18.4** | **1.71** |
#### Attention core (not prefix), M=16
| F0 | sparse MLA decode (top-2048, bf16 latent KV 576) | 4.563 | 0 | 40.11 | 40.11 | 9.33 | 4.61 |
| F1 | W_UV bmm bf16 (Mx512)x(512x256) x64 heads | 0.2684 | 16.78 | 1.573 | 18.35 | 4.27 | 0.271 |
| F2 | o_proj fp8 GEMM K=16384 N=6144 | 3.221 | 100.7 | 0.4669 | 101.2 | 23.5 | 1.63 |
| **sum** | | **8.053** | **117.5** | **42.15** | **159.6** | **37.1** | **6.51** |
#### MoE (expected unique experts, uniform routing), M=16
| M0 | fused_add_rmsnorm(6144) [post_attention_layernorm] | 0.0004915 | 0.01229 | 0.7864 | 0.7987 | 0.186 | 0.000497 |
| M1 | router gate bf16 GEMM K=6144 N=256 -> fp32 | 0.05033 | 3.146 | 0.213 | 3.359 | 0.781 | 0.0509 |
| M2 | sigmoid+bias top-8 (n_group=1)+renorm (flashinfer fused_topk_deepseek) | 4.096e-05 | 0.001024 | 0.01741 | 0.01843 | 0.00429 | 4.14e-05 |
| M3 | per_token_group_quant_fp8(x,128) | 0.0001966 | 0 | 0.298 | 0.298 | 0.0693 | 0.000199 |
| M4 | FC1 w13 fp8 grouped GEMM K=6144 N=4096 (102.0+1 experts) | 7.248 | 2592 | 2.092 | 2594 | 603 | 3.66 |
| M5 | silu(gate)*up | 0.00118 | 0 | 1.769 | 1.769 | 0.412 | 0.00119 |
| M6 | per_token_group_quant_fp8(h,128) | 0.0005898 | 0 | 0.894 | 0.894 | 0.208 | 0.000596 |
| M7 | FC2 w2 fp8 grouped GEMM K=2048 N=6144 | 3.624 | 1296 | 2.074 | 1298 | 302 | 1.83 |
| M8 | moe_sum_reduce (topk-weighted sum x2.5) | 0.001769 | 0 | 1.966 | 1.966 | 0.457 | 0.00179 |
| **sum** | | **10.93** | **3891** | **10.11** | **3901** | **907** | **5.55** |
#### Attention prefix, M=64, L=8192 per sequence (M independent sequences)
| A0 | fused_add_rmsnorm(6144) [input_layernorm] | 0.001966 | 0.01229 | 3.146 | 3.158 | 0.734 | 0.00199 |
| A0 | per_token_group_quant_fp8(x,128) [SGLang: separate] | 0.0007864 | 0 | 1.192 | 1.192 | 0.277 | 0.000795 |
| B0 | QKV-A fp8 GEMM K=6144 N=2624 (DeepGEMM) | 2.064 | 16.13 | 0.7414 | 16.87 | 3.92 | 1.04 |
| B0+ | q_a_layernorm RMSNorm(2048) | 0.0005243 | 0.004096 | 0.5243 | 0.5284 | 0.123 | 0.00053 |
| B0+ | kv_a_layernorm RMSNorm(512) | 0.0001311 | 0.001024 | 0.1311 | 0.1321 | 0.0307 | 0.000133 |
| C0 | Head-Gate weights_proj bf16 GEMM K=6144 N=32 | 0.02517 | 0.3932 | 0.7946 | 1.188 | 0.276 | 0.0254 |
| B1 | Indexer-K wk fp8 GEMM K=6144 N=128 (checkpoint fp8) | 0.1007 | 0.7866 | 0.4219 | 1.209 | 0.281 | 0.0509 |
| B1 | k LayerNorm+RoPE(64, interleaved)+fp8 quant+store idxK | 9.83e-05 | 0.001024 | 0.04122 | 0.04224 | 0.00982 | 9.94e-05 |
| D1 | q_lora act quant (for wq_b) | 0.0002621 | 0 | 0.3973 | 0.3973 | 0.0924 | 0.000265 |
| D1 | Indexer-Q wq_b fp8 GEMM K=2048 N=4096 | 1.074 | 8.391 | 0.6595 | 9.05 | 2.1 | 0.543 |
| D1 | q RoPE(64)+per-head fp8 quant+head weights | 0.001573 | 0 | 0.8151 | 0.8151 | 0.19 | 0.00159 |
| D0 | q_lora act quant (for q_b_proj) | 0.0002621 | 0 | 0.3973 | 0.3973 | 0.0924 | 0.000265 |
| D0 | q_b_proj fp8 GEMM K=2048 N=16384 | 4.295 | 33.56 | 2.232 | 35.79 | 8.32 | 2.17 |
| D2 | W_UK absorb bmm bf16 [64]x(Mx192)x(192x512) | 0.8053 | 12.58 | 5.767 | 18.35 | 4.27 | 0.814 |
| rope | MLA RoPE q_pe(64x64)+k_pe(64) interleaved | 0.001597 | 0 | 1.081 | 1.081 | 0.251 | 0.00162 |
| kv | MLA latent KV store (512 normed + 64 roped) | 0 | 0 | 0.1475 | 0.1475 | 0.0343 | 0 |
| E1 | fp8_paged_mqa_logits (DeepGEMM) L=8192 | 4.345 | 0 | 71.61 | 71.61 | 16.7 | 2.2 |
| E2 | top-2048 + page-table transform (sgl_kernel) | 0.001049 | 0 | 3.146 | 3.146 | 0.732 | 0.00106 |
| **sum** | | **12.72** | **71.86** | **93.24** | **165.1** | **38.4** | **6.85** |
#### Attention core (not prefix), M=64
| F0 | sparse MLA decode (top-2048, bf16 latent KV 576) | 18.25 | 0 | 160.4 | 160.4 | 37.3 | 18.5 |
| F1 | W_UV bmm bf16 (Mx512)x(512x256) x64 heads | 1.074 | 16.78 | 6.291 | 23.07 | 5.36 | 1.09 |
| F2 | o_proj fp8 GEMM K=16384 N=6144 | 12.88 | 100.7 | 1.868 | 102.6 | 23.9 | 6.51 |
| **sum** | | **32.21** | **117.5** | **168.6** | **286.1** | **66.5** | **26.1** |
#### MoE (expected unique experts, uniform routing), M=64
| M0 | fused_add_rmsnorm(6144) [post_attention_layernorm] | 0.001966 | 0.01229 | 3.146 | 3.158 | 0.734 | 0.00199 |
| M1 | router gate bf16 GEMM K=6144 N=256 -> fp32 | 0.2013 | 3.146 | 0.852 | 3.998 | 0.93 | 0.204 |
| M2 | sigmoid+bias top-8 (n_group=1)+renorm (flashinfer fused_topk_deepseek) | 0.0001638 | 0.001024 | 0.06963 | 0.07066 | 0.0164 | 0.000166 |
| M3 | per_token_group_quant_fp8(x,128) | 0.0007864 | 0 | 1.192 | 1.192 | 0.277 | 0.000795 |
| M4 | FC1 w13 fp8 grouped GEMM K=6144 N=4096 (222.4+1 experts) | 28.99 | 5624 | 8.368 | 5633 | 1.31e+03 | 14.6 |
| M5 | silu(gate)*up | 0.004719 | 0 | 7.078 | 7.078 | 1.65 | 0.00477 |
| M6 | per_token_group_quant_fp8(h,128) | 0.002359 | 0 | 3.576 | 3.576 | 0.832 | 0.00239 |
| M7 | FC2 w2 fp8 grouped GEMM K=2048 N=6144 | 14.5 | 2812 | 8.294 | 2821 | 656 | 7.32 |
| M8 | moe_sum_reduce (topk-weighted sum x2.5) | 0.007078 | 0 | 7.864 | 7.864 | 1.83 | 0.00716 |
| **sum** | | **43.7** | **8440** | **40.44** | **8480** | **1.97e+03** | **22.2** |
#### Attention prefix, M=256, L=8192 per sequence (M independent sequences)
| A0 | fused_add_rmsnorm(6144) [input_layernorm] | 0.007864 | 0.01229 | 12.58 | 12.6 | 2.93 | 0.00795 |
| A0 | per_token_group_quant_fp8(x,128) [SGLang: separate] | 0.003146 | 0 | 4.768 | 4.768 | 1.11 | 0.00318 |
| B0 | QKV-A fp8 GEMM K=6144 N=2624 (DeepGEMM) | 8.254 | 16.13 | 2.966 | 19.09 | 4.44 | 4.17 |
| B0+ | q_a_layernorm RMSNorm(2048) | 0.002097 | 0.004096 | 2.097 | 2.101 | 0.489 | 0.00212 |
| B0+ | kv_a_layernorm RMSNorm(512) | 0.0005243 | 0.001024 | 0.5243 | 0.5253 | 0.122 | 0.00053 |
| C0 | Head-Gate weights_proj bf16 GEMM K=6144 N=32 | 0.1007 | 0.3932 | 3.178 | 3.572 | 0.831 | 0.102 |
| B1 | Indexer-K wk fp8 GEMM K=6144 N=128 (checkpoint fp8) | 0.4027 | 0.7866 | 1.688 | 2.474 | 0.575 | 0.203 |
| B1 | k LayerNorm+RoPE(64, interleaved)+fp8 quant+store idxK | 0.0003932 | 0.001024 | 0.1649 | 0.1659 | 0.0386 | 0.000398 |
| D1 | q_lora act quant (for wq_b) | 0.001049 | 0 | 1.589 | 1.589 | 0.37 | 0.00106 |
| D1 | Indexer-Q wq_b fp8 GEMM K=2048 N=4096 | 4.295 | 8.391 | 2.638 | 11.03 | 2.56 | 2.17 |
| D1 | q RoPE(64)+per-head fp8 quant+head weights | 0.006291 | 0 | 3.26 | 3.26 | 0.758 | 0.00636 |
| D0 | q_lora act quant (for q_b_proj) | 0.001049 | 0 | 1.589 | 1.589 | 0.37 | 0.00106 |
| D0 | q_b_proj fp8 GEMM K=2048 N=16384 | 17.18 | 33.56 | 8.929 | 42.49 | 9.88 | 8.68 |
| D2 | W_UK absorb bmm bf16 [64]x(Mx192)x(192x512) | 3.221 | 12.58 | 23.07 | 35.65 | 8.29 | 3.26 |
| rope | MLA RoPE q_pe(64x64)+k_pe(64) interleaved | 0.00639 | 0 | 4.325 | 4.325 | 1.01 | 0.00646 |
| kv | MLA latent KV store (512 normed + 64 roped) | 0 | 0 | 0.5898 | 0.5898 | 0.137 | 0 |
| E1 | fp8_paged_mqa_logits (DeepGEMM) L=8192 | 17.38 | 0 | 286.4 | 286.4 | 66.6 | 8.78 |
| E2 | top-2048 + page-table transform (sgl_kernel) | 0.004194 | 0 | 12.58 | 12.58 | 2.93 | 0.00424 |
| **sum** | | **50.87** | **71.86** | **373** | **444.8** | **103** | **27.4** |
#### Attention core (not prefix), M=256
| F0 | sparse MLA decode (top-2048, bf16 latent KV 576) | 73.01 | 0 | 641.7 | 641.7 | 149 | 73.8 |
| F1 | W_UV bmm bf16 (Mx512)x(512x256) x64 heads | 4.295 | 16.78 | 25.17 | 41.94 | 9.75 | 4.34 |
| F2 | o_proj fp8 GEMM K=16384 N=6144 | 51.54 | 100.7 | 7.471 | 108.2 | 25.2 | 26 |
| **sum** | | **128.8** | **117.5** | **674.4** | **791.8** | **184** | **104** |
#### MoE (expected unique experts, uniform routing), M=256
| M0 | fused_add_rmsnorm(6144) [post_attention_layernorm] | 0.007864 | 0.01229 | 12.58 | 12.6 | 2.93 | 0.00795 |
| M1 | router gate bf16 GEMM K=6144 N=256 -> fp32 | 0.8053 | 3.146 | 3.408 | 6.554 | 1.52 | 0.814 |
| M2 | sigmoid+bias top-8 (n_group=1)+renorm (flashinfer fused_topk_deepseek) | 0.0006554 | 0.001024 | 0.2785 | 0.2796 | 0.065 | 0.000663 |
| M3 | per_token_group_quant_fp8(x,128) | 0.003146 | 0 | 4.768 | 4.768 | 1.11 | 0.00318 |
| M4 | FC1 w13 fp8 grouped GEMM K=6144 N=4096 (255.9+1 experts) | 116 | 6467 | 33.47 | 6501 | 1.51e+03 | 58.6 |
| M5 | silu(gate)*up | 0.01887 | 0 | 28.31 | 28.31 | 6.58 | 0.0191 |
| M6 | per_token_group_quant_fp8(h,128) | 0.009437 | 0 | 14.3 | 14.3 | 3.33 | 0.00954 |
| M7 | FC2 w2 fp8 grouped GEMM K=2048 N=6144 | 57.98 | 3234 | 33.18 | 3267 | 760 | 29.3 |
| M8 | moe_sum_reduce (topk-weighted sum x2.5) | 0.02831 | 0 | 31.46 | 31.46 | 7.32 | 0.0286 |
| **sum** | | **174.8** | **9704** | **161.8** | **9866** | **2.29e+03** | **88.8** |
#### Summary per layer (TP=1)
| M | prefix MB | prefix t_mem us | attn-core MB | attn-core t_mem us | MoE MB (E[uniq]) | MoE t_mem us | MoE MB (worst) | layer total MB | layer t_mem us | layer GFLOP |
| 1 | 73.32 | 17.1 | 120.1 | 27.9 | 343.6 | 79.9 | 343.6 | 537 | 125 | 1.385 |
| 16 | 95.17 | 22.1 | 159.6 | 37.1 | 3901 | 907 | 4884 | 4156 | 966 | 22.16 |
| 64 | 165.1 | 38.4 | 286.1 | 66.5 | 8480 | 1.97e+03 | 9747 | 8931 | 2.08e+03 | 88.63 |
| 256 | 444.8 | 103 | 791.8 | 184 | 9866 | 2.29e+03 | 9869 | 1.11e+04 | 2.58e+03 | 354.5 |
Expected unique routed experts: {1: 8.0, 16: 102.0, 64: 222.4, 256: 255.9}
"""

PREFIX_LABELS = ["A0", "A0", "B0", "B0+", "B0+", "C0", "B1", "B1", "D1", "D1", "D1", "D0", "D0", "D2", "rope", "kv",
                 "E1", "E2"]
PREFIX_NAMES = [n for n in C.PREFIX_ROWS if n not in ("C0+B1.gemm", "rope.q", "rope.k")]


def _appendix_tables() -> dict[str, list[list[str]]]:
    tables: dict[str, list[list[str]]] = {}
    head = None
    for line in APPENDIX.strip().splitlines():
        if line.startswith("#### "):
            head = line[5:].strip()
            tables[head] = []
        elif line.startswith("|") and head is not None:
            tables[head].append([c.strip().replace("*", "") for c in line.strip().strip("|").split("|")])
    return tables


TABLES = _appendix_tables()
OP_TABLES = [h for h in TABLES if not h.startswith("Summary")]


def _ours_for(head: str) -> tuple[list[C.OpCost], list[str], list[str]]:
    M = int(re.search(r"M=(\d+)", head).group(1))
    if head.startswith("Attention prefix"):
        rows = C.prefix_costs(GLM5, M, L, shared_kv="shared KV" in head)
        return rows, PREFIX_NAMES, PREFIX_LABELS
    if head.startswith("Attention core"):
        return C.attn_core_costs(GLM5, M, L), ["F0.sparse_mla", "F1.w_uv", "F2.o_proj"], ["F0", "F1", "F2"]
    if head.startswith("MoE"):
        names = ["M0.norm", "M1.router", "M2.topk", "M3.quant", "M4.fc1", "M5.act", "M6.quant", "M7.fc2", "M8.combine"]
        return C.moe_costs(GLM5, M), names, [n.split(".")[0] for n in names]
    raise AssertionError(head)


def _columns(c: C.OpCost) -> list[float]:
    return [c.flops / 1e9, c.weight_bytes / C.MB, c.act_bytes / C.MB, c.bytes / C.MB, c.t_mem_us(C.SPEC_BW),
            c.t_compute_us()]


COLS = ["GFLOP", "weight MB", "act MB", "total MB", "t_mem@4.3", "t_compute"]


def test_appendix_has_all_tables():
    assert len(OP_TABLES) == 13, OP_TABLES


@pytest.mark.parametrize("head", OP_TABLES)
def test_appendix_table_rows_and_sum(head):
    rows, names, labels = _ours_for(head)
    printed = TABLES[head]
    assert [r.name for r in rows] == names
    assert [p[0] for p in printed[:-1]] == labels and printed[-1][0] == "sum", f"{head}: unexpected row order"
    bad = []
    for ours, p in zip(rows + [C.total(rows)], printed):
        for col, v, s in zip(COLS, _columns(ours), p[2:]):
            if not agrees(v, s):
                bad.append(f"{ours.name} {col}: ours {v:.6g} vs spec {s}")
    assert not bad, f"{head}:\n" + "\n".join(bad)


def test_appendix_summary_per_layer():
    rows = TABLES["Summary per layer (TP=1)"][1:]
    assert [r[0] for r in rows] == ["1", "16", "64", "256"]
    bad = []
    for r in rows:
        M = int(r[0])
        lay = C.layer_summary(GLM5, M, L)
        worst = C.moe_costs(GLM5, M, distinct_experts=min(GLM5.n_routed_experts, GLM5.num_experts_per_tok * M))
        p, co, mo = (C.total(x) for x in (lay.prefix, lay.core, lay.mlp))
        ours = [p.bytes / C.MB, p.t_mem_us(C.SPEC_BW), co.bytes / C.MB, co.t_mem_us(C.SPEC_BW), mo.bytes / C.MB,
                mo.t_mem_us(C.SPEC_BW), C.total(worst).bytes / C.MB, lay.bytes / C.MB, lay.floor_us(C.SPEC_BW),
                lay.flops / 1e9]
        for i, (v, s) in enumerate(zip(ours, r[1:])):
            if not agrees(v, s):
                bad.append(f"M={M} column {i + 1}: ours {v:.6g} vs spec {s}")
    assert not bad, "\n".join(bad)


# ---- section 7 ----------------------------------------------------------------------------------------------

SECTION_7_1 = """
| op (M → bytes MB / µs floor) | M=1 | M=16 | M=64 | M=256 | GFLOP/token |
|---|---|---|---|---|---|
| A0 add+RMSNorm (+ quant) | 0.08 / 0.02 | 1.10 / 0.26 | 4.35 / 1.01 | 17.4 / 4.0 | ~0 |
| B0 QKV-A FP8 6144→2624 | 16.14 / 3.75 | 16.31 / 3.79 | 16.87 / 3.92 | 19.09 / 4.44 | 0.0322 |
| q_a / kv_a RMSNorm | 0.015 / 0.004 | 0.17 / 0.04 | 0.66 / 0.15 | 2.6 / 0.61 | ~0 |
| C0 Head-Gate bf16 6144→32 | 0.41 / 0.09 | 0.59 / 0.14 | 1.19 / 0.28 | 3.57 / 0.83 | 0.0004 |
| B1 wk FP8 6144→128 + LN/rope/quant/store | 0.79 / 0.18 | 0.90 / 0.21 | 1.25 / 0.29 | 2.64 / 0.61 | 0.0016 |
| D1 wq_b FP8 2048→4096 + rope/quant/weights | 8.42 / 1.96 | 8.86 / 2.06 | 10.26 / 2.38 | 15.88 / 3.69 | 0.0168 |
| D0 q_b_proj FP8 2048→16384 (+act quant) | 33.6 / 7.81 | 34.2 / 7.96 | 36.2 / 8.41 | 44.1 / 10.25 | 0.0671 |
| D2 W_UK bmm bf16 (64×192×512) | 12.67 / 2.95 | 14.02 / 3.26 | 18.35 / 4.27 | 35.65 / 8.29 | 0.0126 |
| MLA rope + KV store | 0.02 / 0.004 | 0.31 / 0.07 | 1.23 / 0.29 | 4.9 / 1.15 | ~0 |
| E1 paged MQA logits (L=8192 per seq) | 1.12 / 0.26 | 17.9 / 4.16 | 71.6 / 16.7 | 286 / 66.6 | 0.0679 (= 2·32·128·L) |
| E2 top-2048 (+page transform) | 0.05 / 0.01 | 0.79 / 0.18 | 3.15 / 0.73 | 12.6 / 2.93 | ~0 |
| **prefix total** | **73.3 MB / 17.1 µs** | **95.2 / 22.1** | **165 / 38.4** | **445 / 103** | 0.199 |
| prefix total, one shared KV seq (article E1) | – | 78.9 / 18.4 | – | – | |
"""

# The section 7.1 lines are SGLang-kernel groups of the appendix rows.
S71_GROUPS = {
    "A0": ("A0.norm", "A0.quant"), "B0": ("B0.gemm",), "q_a": ("B0.q_a_norm", "B0.kv_a_norm"), "C0": ("C0.gemm",),
    "B1": ("B1.gemm", "B1.post"), "D1": ("D1.quant", "D1.gemm", "D1.post"), "D0": ("D0.quant", "D0.gemm"),
    "D2": ("D2.bmm",), "MLA": ("rope", "kv_store"), "E1": ("E1.logits",), "E2": ("E2.topk",),
}
# spec: section 7.1 adds the appendix's rounded per-row times in two cells; from exact bytes
#   MLA rope + KV store at M=256: 4.915 MB -> 1.143 us (printed 1.15 = 1.01 + 0.137),
#   D1 at M=64: 10.262 MB -> 2.387 us (printed 2.38 = 0.0924 + 2.1 + 0.19).
S71_KNOWN_ROUNDING = {("MLA", 256, "us"): "1.14", ("D1", 64, "us"): "2.39"}


def test_section_7_1_per_op_table():
    lines = [l for l in SECTION_7_1.strip().splitlines() if l.startswith("| ") and "→ bytes" not in l]
    bad = []
    for line in lines:
        cells = [c.strip().replace("*", "") for c in line.strip().strip("|").split("|")]
        key = cells[0].split()[0]
        if key not in S71_GROUPS:
            continue
        for M, cell in zip((1, 16, 64, 256), cells[1:5]):
            rows = {r.name: r for r in C.prefix_costs(GLM5, M, L)}
            t = C.total([rows[n] for n in S71_GROUPS[key]])
            mb, us = (x.strip() for x in cell.split("/"))
            if not agrees(t.bytes / C.MB, mb):
                bad.append(f"{key} M={M} MB: ours {t.bytes / C.MB:.5g} vs {mb}")
            us = S71_KNOWN_ROUNDING.get((key, M, "us"), us)
            if not agrees(t.t_mem_us(C.SPEC_BW), us):
                bad.append(f"{key} M={M} us: ours {t.t_mem_us(C.SPEC_BW):.5g} vs {us}")
    assert len(lines) >= 11
    assert not bad, "\n".join(bad)


@pytest.mark.parametrize("M,mb,us,gflop", [(1, "73.3", "17.1", "0.199"), (16, "95.2", "22.1", None),
                                           (64, "165", "38.4", None), (256, "445", "103", None)])
def test_section_7_1_prefix_totals(M, mb, us, gflop):
    t = C.total(C.prefix_costs(GLM5, M, L))
    assert agrees(t.bytes / C.MB, mb) and agrees(C.floor_us(C.prefix_costs(GLM5, M, L), C.SPEC_BW), us), \
        f"{M=}: {t.bytes / C.MB:.4g} MB, {t.t_mem_us(C.SPEC_BW):.4g} us"
    if gflop:
        assert agrees(t.flops / 1e9 / M, gflop)


def test_section_7_1_shared_kv_total_and_weights():
    t = C.total(C.prefix_costs(GLM5, 16, L, shared_kv=True))
    assert agrees(t.bytes / C.MB, "78.9") and agrees(t.t_mem_us(C.SPEC_BW), "18.4")
    rows = {r.name: r for r in C.prefix_costs(GLM5, 1, L)}
    w = sum(r.weight_bytes for r in rows.values())
    assert agrees(w / C.MB, "71.9")
    for name, pct in (("D0.gemm", "46.7"), ("B0.gemm", "22.4"), ("D2.bmm", "17.5"), ("D1.gemm", "11.7")):
        assert agrees(100 * rows[name].weight_bytes / w, pct), name
    idx = sum(rows[n].weight_bytes for n in ("C0.gemm", "B1.gemm", "B1.post", "D1.gemm"))
    assert agrees(idx / C.MB, "9.6") and agrees(idx / C.SPEC_BW * 1e6, "2.2")
    # weights do not depend on M
    assert all(sum(r.weight_bytes for r in C.prefix_costs(GLM5, M, L)) == w for M in (16, 64, 256))


@pytest.mark.parametrize("M,mla,wuv,oproj,us", [(1, "2.5", "16.9", "100.7", "27.9"), (16, "40.1", "18.4", "101.2", "37.1"),
                                                (64, "160", "23.1", "102.6", "66.5"), (256, "642", "41.9", "108.2", "184")])
def test_section_7_2_attention_core(M, mla, wuv, oproj, us):
    f0, f1, f2 = C.attn_core_costs(GLM5, M, L)
    for c, s in ((f0, mla), (f1, wuv), (f2, oproj)):
        assert agrees(c.bytes / C.MB, s), f"{c.name} {M=}: {c.bytes / C.MB:.5g} vs {s}"
    assert agrees(C.floor_us([f0, f1, f2], C.SPEC_BW), us)


@pytest.mark.parametrize("M,experts,fc1,fc2,rest,mb,us,worst,gflop,tc", [
    (1, "9", "226.7", "113.4", "3.5", "343.6", "79.9", "343.6", "0.683", "0.35"),
    (16, "103.0", "2594", "1298", "9.1", "3901", "907", "4884", "10.9", "5.6"),
    (64, "223.4", "5633", "2821", "26.9", "8480", "1972", "9747", "43.7", "22"),
    (256, "256.9", "6501", "3267", "98.3", "9866", "2294", "9869", "174.8", "89"),
])
def test_section_7_3_moe(M, experts, fc1, fc2, rest, mb, us, worst, gflop, tc):
    rows = C.moe_costs(GLM5, M)
    by = {r.name: r for r in rows}
    E, k = GLM5.n_routed_experts, GLM5.num_experts_per_tok
    assert agrees(C.expected_distinct_experts(M, E, k) + GLM5.n_shared_experts, experts)
    assert agrees(by["M4.fc1"].bytes / C.MB, fc1) and agrees(by["M7.fc2"].bytes / C.MB, fc2)
    others = [r for r in rows if r.name not in ("M4.fc1", "M7.fc2")]
    assert agrees(C.total(others).bytes / C.MB, rest)
    assert agrees(C.total(rows).bytes / C.MB, mb) and agrees(C.floor_us(rows, C.SPEC_BW), us)
    wc = C.moe_costs(GLM5, M, distinct_experts=min(E, k * M))
    assert agrees(C.total(wc).bytes / C.MB, worst)
    assert agrees(C.total(rows).flops / 1e9, gflop)
    # spec: the row is titled "compute floor at FP8 peak" but its values are the appendix t_compute
    # sums (FP8 GEMMs at the FP8 peak, the rest at the bf16 peak; all at FP8 peak gives 5.52 us at
    # M=16), and at M=16 it rounds the appendix's rounded 5.55 up to 5.6 (exact: 5.549).
    assert agrees(C.compute_floor_us(rows), {"5.6": "5.55"}.get(tc, tc))


# spec: section 7.4 prints 1.39 GFLOP at M=1, the appendix's rounded 1.385 rounded again (exact 1.3849).
@pytest.mark.parametrize("M,mb,us,gflop", [(1, "537", "125", "1.385"), (16, "4156", "966", "22.2"),
                                           (64, "8931", "2077", "88.6"), (256, "11100", "2580", "354.5")])
def test_section_7_4_whole_layer(M, mb, us, gflop):
    lay = C.layer_summary(GLM5, M, L)
    assert agrees(lay.bytes / C.MB, mb) and agrees(lay.floor_us(C.SPEC_BW), us) and agrees(lay.flops / 1e9, gflop), \
        lay.summary(C.SPEC_BW)


def test_per_token_moe_flops_section_6():
    rows = {r.name: r for r in C.moe_costs(GLM5, 1)}
    assert rows["M4.fc1"].flops + rows["M7.fc2"].flops == 9 * (2 * 6144 * 4096 + 2 * 2048 * 6144)  # 679.5 MFLOP
    assert agrees((rows["M4.fc1"].flops + rows["M7.fc2"].flops) / 1e6, "679.5")
    assert agrees(rows["M1.router"].flops / 1e6, "3.1")


# ---- weights (spec section 2) and experts ----------------------------------------------------------------------


def test_weight_bytes_section_2():
    assert C.fp8_block_weight_bytes(2624, 6144) == 16_121_856 + 4_032
    assert C.fp8_block_weight_bytes(16384, 2048) == 33_554_432 + 8_192
    assert C.fp8_block_weight_bytes(6144, 16384) == 100_663_296 + 24_576
    assert C.fp8_block_weight_bytes(4096, 2048) == 8_388_608 + 2_048
    assert C.fp8_block_weight_bytes(4096, 6144) == 25_165_824 + 6_144
    assert C.fp8_block_weight_bytes(6144, 2048) == 12_582_912 + 3_072
    assert C.fp8_block_weight_bytes(128, 6144) == 786_624  # wk FP8, section 2 "786 624 B"
    assert C.fp8_block_weight_bytes(130, 129) == 130 * 129 + 4 * 2 * 2  # ragged blocks round up
    assert C.expert_bytes(GLM5) == 37_757_952
    assert f"{C.expert_bytes(GLM5) / C.MB:.3f}" == "37.758"
    rows = {r.name: r for r in C.prefix_costs(GLM5, 1, L)}
    assert rows["B0.gemm"].weight_bytes == 16_121_856 + 4_032
    assert rows["D0.gemm"].weight_bytes == 33_554_432 + 8_192
    assert rows["D2.bmm"].weight_bytes == 12_582_912
    assert rows["C0.gemm"].weight_bytes == 393_216
    f1 = C.attn_core_costs(GLM5, 1, L)[1]
    assert f1.weight_bytes == 16_777_216
    d = {r.name: r for r in C.dense_mlp_costs(GLM5, 1)}
    assert d["MD1.gate_up"].weight_bytes == 150_994_944 + 4 * 192 * 48
    assert d["MD2.down"].weight_bytes == 75_497_472 + 4 * 48 * 96


def test_expected_distinct_experts():
    got = [round(C.expected_distinct_experts(M, 256, 8), 1) for M in (1, 16, 64, 256)]
    assert got == [8.0, 102.0, 222.4, 255.9]
    assert C.expected_distinct_experts(0, 256, 8) == 0
    with pytest.raises(ValueError):
        C.expected_distinct_experts(4, 8, 9)


# ---- GLM-5.2 shared-indexer layers and anchors.md ---------------------------------------------------------------


def test_glm52_shared_layer_prefix_floor():
    cfg = Glm5Config.preset("glm5.2")
    assert not cfg.is_full_indexer_layer(3) and cfg.is_full_indexer_layer(6)
    for M, mb, us in ((1, "62.5", "14.5"), (16, "66", "15.4")):
        lay = C.layer_summary(cfg, M, L, layer=3)
        t = C.total(lay.prefix)
        assert agrees(t.bytes / C.MB, mb) and agrees(t.t_mem_us(C.SPEC_BW), us), f"{M=}: {t.bytes / C.MB:.4g} MB"
        names = {r.name for r in lay.prefix}
        assert not names & {"C0.gemm", "B1.gemm", "B1.post", "D1.quant", "D1.gemm", "D1.post", "E1.logits", "E2.topk"}
        full = C.layer_summary(cfg, M, L, layer=6)
        assert C.total(full.prefix).bytes == C.total(C.prefix_costs(GLM5, M, L)).bytes


def test_anchors_prefix_floor():
    rows = C.prefix_costs(GLM5, 16, L)
    assert C.floor_us(rows) == C.floor_us(rows, C.H200_COPY_BW)  # the project default
    assert round(C.total(rows).bytes / C.MB) == 95 and round(C.floor_us(rows)) == 22
    w = sum(r.weight_bytes for r in rows)
    assert round(w / C.MB) == 72 and round(w / C.H200_COPY_BW * 1e6) == 17


def test_anchors_gemm_weight_floors():
    rows = {r.name: r for r in C.prefix_costs(GLM5, 1, L)}
    for name, us in (("B0.gemm", "3.8"), ("D0.gemm", "7.9"), ("D1.gemm", "2.0"), ("B1.gemm", "0.18")):
        assert agrees(rows[name].weight_bytes / C.H200_COPY_BW * 1e6, us), name


@pytest.mark.parametrize("experts,us", [(8, "70.7"), (29, "256.4"), (32, "282.9"), (97, "858"), (221, "1954"),
                                        (256, "2263")])
def test_anchors_expert_weight_floors(experts, us):
    # spec: anchors.md uses 37.75 MB/expert; the exact 37.758 gives 282.96 (printed 282.9) and
    # 2263.6 (printed 2263): within 3e-4 relative.
    assert agrees(experts * C.expert_bytes(GLM5) / C.H200_COPY_BW * 1e6, us)


def test_anchors_moe_floors():
    # spec: anchors.md quotes the MoE floors 80 / 907 / 1972 us "at 4.27 TB/s", but those are the
    # section 7.3 values at 4.3 TB/s; at 4.27 TB/s they are 80.5 / 913.6 / 1986.
    for M, us in ((1, "80"), (16, "907"), (64, "1972")):
        rows = C.moe_costs(GLM5, M)
        assert agrees(C.floor_us(rows, C.SPEC_BW), us)
        assert C.floor_us(rows) > C.floor_us(rows, C.SPEC_BW)


# ---- section 4 / options ----------------------------------------------------------------------------------------


def test_section_4_article_numbers():
    rows = {r.name: r for r in C.prefix_costs(GLM5, 16, L)}
    assert agrees(rows["C0.gemm"].bytes / C.MB, "0.59")
    assert agrees(rows["D2.bmm"].bytes / C.MB, "14.0")
    assert agrees(rows["E1.logits"].bytes / C.MB, "17.9")
    shared = {r.name: r for r in C.prefix_costs(GLM5, 16, L, shared_kv=True)}
    assert agrees(shared["E1.logits"].bytes / C.MB, "1.67")
    fp8 = {r.name: r for r in C.prefix_costs(GLM5, 16, L, d2="fp8")}
    assert agrees(fp8["D2.bmm"].bytes / C.MB, "7.7") and fp8["D2.bmm"].fp8_flops == fp8["D2.bmm"].flops
    # spec: section 4's "total, shared KV, D2 FP8 ~ 72.5 MB" subtracts from its own fused-op total
    # (78.8); on the appendix rows the same change gives 78.94 - 14.02 + 7.74 = 72.65 MB.
    t = C.total(C.prefix_costs(GLM5, 16, L, shared_kv=True, d2="fp8")).bytes / C.MB
    assert agrees(t, "72.65")


def test_sglang_fused_wk_weights_proj():
    split = {r.name: r for r in C.prefix_costs(GLM5, 1, L)}
    fused = {r.name: r for r in C.prefix_costs(GLM5, 1, L, b1_c0="sglang_fused")}
    assert "C0+B1.gemm" in fused and "C0.gemm" not in fused and "B1.gemm" not in fused
    assert agrees(fused["C0+B1.gemm"].weight_bytes / C.MB, "1.966")
    split_w = split["C0.gemm"].weight_bytes + split["B1.gemm"].weight_bytes
    assert agrees(split_w / C.MB, "1.18")
    assert agrees((fused["C0+B1.gemm"].weight_bytes - split_w) / C.MB, "0.79")
    assert fused["C0+B1.gemm"].fp8_flops == 0


def test_kv_lens_forms():
    a = C.prefix_costs(GLM5, 4, 1000)
    b = C.prefix_costs(GLM5, 4, [1000] * 4)
    assert [x.bytes for x in a] == [x.bytes for x in b]
    mixed = {r.name: r for r in C.prefix_costs(GLM5, 2, [64, 8192])}
    one = {r.name: r for r in C.prefix_costs(GLM5, 1, 64)}
    big = {r.name: r for r in C.prefix_costs(GLM5, 1, 8192)}
    assert mixed["E1.logits"].bytes == one["E1.logits"].bytes + big["E1.logits"].bytes
    assert mixed["E1.logits"].flops == one["E1.logits"].flops + big["E1.logits"].flops
    # one shared sequence: the index-K cache is read once, for the longest context
    sh = {r.name: r for r in C.prefix_costs(GLM5, 2, [8191, 8192], shared_kv=True)}
    cache = dict(sh["E1.logits"].reads)["idx_k_cache"]
    assert cache == 8192 * 132
    with pytest.raises(ValueError, match="one per query token"):
        C.prefix_costs(GLM5, 3, [10, 20])
    with pytest.raises(ValueError, match=">= 1"):
        C.prefix_costs(GLM5, 1, 0)
    with pytest.raises(ValueError, match="d2"):
        C.prefix_costs(GLM5, 1, 10, d2="fp4")
    with pytest.raises(ValueError, match="b1_c0"):
        C.prefix_costs(GLM5, 1, 10, b1_c0="x")


def test_attn_core_shared_kv_bounds():
    M, t = 16, GLM5.index_topk
    per_seq = C.attn_core_costs(GLM5, M, L)[0]
    shared = C.attn_core_costs(GLM5, M, L, shared_kv=True)[0]
    kv = dict(shared.reads)["kv_cache"] / 1152
    assert t <= kv <= min(L, M * t)
    assert shared.bytes < per_seq.bytes and shared.flops == per_seq.flops
    short = C.attn_core_costs(GLM5, 1, 100)[0]  # fewer tokens than top-k: attends to all of them
    assert dict(short.reads)["kv_cache"] == 100 * 1152


def test_moe_routing_inputs():
    E = GLM5.n_routed_experts
    routing = torch.tensor([[0, 1, 2, 3, 4, 5, 6, 7], [4, 5, 6, 7, 8, 9, 10, 11]])
    by_routing = C.moe_costs(GLM5, 2, routing=routing)
    by_count = C.moe_costs(GLM5, 2, distinct_experts=12)
    assert [r.bytes for r in by_routing] == [r.bytes for r in by_count]
    assert by_routing[4].weight_bytes == 13 * C.fp8_block_weight_bytes(4096, 6144)  # + the shared expert
    with_shared_id = torch.cat([routing, torch.full((2, 1), E)], dim=1)  # SGLang's fused top_k=9 ids
    assert C.total(C.moe_costs(GLM5, 2, routing=with_shared_id)).bytes == C.total(by_routing).bytes
    assert C.total(C.moe_costs(GLM5, 2, routing=routing.tolist())).bytes == C.total(by_routing).bytes
    with pytest.raises(ValueError, match="not both"):
        C.moe_costs(GLM5, 2, routing=routing, distinct_experts=3)
    with pytest.raises(ValueError, match="outside"):
        C.moe_costs(GLM5, 2, distinct_experts=E + 1)
    # activations scale with (token, expert) pairs, weights with distinct experts only
    few, many = C.moe_costs(GLM5, 64, distinct_experts=8), C.moe_costs(GLM5, 64, distinct_experts=200)
    assert few[4].act_bytes == many[4].act_bytes and few[4].weight_bytes < many[4].weight_bytes


def test_layer_kinds():
    dense = C.layer_summary(GLM5, 4, L, layer=0)
    assert [r.name for r in dense.mlp][2] == "MD1.gate_up"
    moe = C.layer_summary(GLM5, 4, L, layer=3)
    assert moe.mlp[1].name == "M1.router"
    assert set(moe.summary()) == {"prefix", "core", "mlp", "layer"}
    assert moe.summary()["layer"]["us"] == pytest.approx(moe.floor_us())
    assert moe.floor_us() == pytest.approx(moe.bytes / C.H200_COPY_BW * 1e6)


# ---- fused ops of our op graph ----------------------------------------------------------------------------------

OPTION_SETS = [dict(), dict(shared_kv=True), dict(d2="fp8"), dict(b1_c0="sglang_fused"), dict(indexer=False)]


@pytest.mark.parametrize("opts", OPTION_SETS)
@pytest.mark.parametrize("M", [1, 16, 256])
def test_fused_ops_cover_every_row(M, opts):
    rows = C.prefix_costs(GLM5, M, L, split_rope=True, **opts)
    fused = C.fused_prefix_costs(GLM5, M, L, **opts)
    expect = ["A0", "B0", "C0", "B1", "D1", "D0", "D2", "E1", "E2"]
    if opts.get("indexer") is False:
        expect = ["A0", "B0", "D0", "D2"]
    assert [f.name for f in fused] == expect
    parts = [p for f in fused for p in f.parts]
    assert len(parts) == len(set(parts))
    assert set(parts) | (set(C.PREFIX_ELIDED) & {r.name for r in rows}) == {r.name for r in rows}
    # weights are conserved (the elided q_lora quant has none); fused never moves more bytes
    assert sum(f.weight_bytes for f in fused) == sum(r.weight_bytes for r in rows)
    assert C.total(fused).bytes < C.total(rows).bytes
    by = {f.name: f for f in fused}
    for f in fused:
        assert f.act_bytes == sum(b for _, b in f.reads) + sum(b for _, b in f.writes)
    # intermediates stay inside: B0 never writes raw q_lora, D0 never reads un-roped q_pe
    assert "q_lora_raw" not in dict(by["B0"].writes) and "q_lora" not in dict(by["B0"].writes)
    assert "q_pe" not in dict(by["D0"].reads) and "q_pe_roped" in dict(by["D0"].writes)
    assert "k_pe" not in dict(by["D2"].reads) and "k_pe_raw" in dict(by["D2"].reads)


def test_split_rope_rows():
    one = {r.name: r for r in C.prefix_costs(GLM5, 16, L)}
    two = {r.name: r for r in C.prefix_costs(GLM5, 16, L, split_rope=True)}
    assert "rope" not in two and "rope.q" not in one
    assert two["rope.q"].flops + two["rope.k"].flops == one["rope"].flops
    assert two["rope.q"].bytes + two["rope.k"].bytes == one["rope"].bytes + 16 * 4 * 64  # cos/sin read twice


def test_fused_op_bytes_by_hand_m16():
    M, H = 16, 6144
    by = {f.name: f for f in C.fused_prefix_costs(GLM5, M, L)}
    x8 = H + 4 * 48
    # A0: reads h_prev + resid_in, writes resid, bf16 x (for C0) and fp8 x (for B0, B1); gamma once
    assert by["A0"].bytes == 2 * H + M * (2 * 2 * H + 2 * H + 2 * H + x8)
    # B0: x8 in; fp8 q_lora (+scales) for D0/D1, normed c_kv and raw k_pe for D0 out; 3 weights
    assert by["B0"].bytes == (C.fp8_block_weight_bytes(2624, H) + 2 * 2048 + 2 * 512
                              + M * (x8 + (2048 + 64) + 2 * 512 + 2 * 64))
    # D0: reads fp8 q_lora and cos/sin; writes q_nope (for D2) and roped q_pe (for the attention core)
    assert by["D0"].bytes == (C.fp8_block_weight_bytes(16384, 2048)
                              + M * ((2048 + 64) + 4 * 64 + 2 * 64 * 192 + 2 * 64 * 64))
    # D2: reads q_nope, c_kv, raw k_pe, cos/sin; writes q_lat and the latent KV entry (1152 B)
    assert by["D2"].bytes == 2 * 64 * 192 * 512 + M * (2 * 64 * 192 + 2 * 512 + 2 * 64 + 4 * 64 + 2 * 64 * 512 + 1152)
    rows = {r.name: r for r in C.prefix_costs(GLM5, M, L)}
    for name in ("C0", "E1", "E2"):  # single-row ops keep their row's bytes
        assert by[name].bytes == rows[by[name].parts[0]].bytes
    assert by["D1"].bytes < rows["D1.quant"].bytes + rows["D1.gemm"].bytes + rows["D1.post"].bytes


def test_fused_a0_on_shared_layer_matches_section_4():
    # With no C0 reading bf16 x (GLM-5.2 shared layer), fused A0 writes only the residual and fp8 x:
    # 0.70 MB at M=16, the number section 4 gives for A0. spec: section 4 quotes 0.70 MB for A0 on a
    # full layer as well, which leaves out the bf16 x that C0 reads (+0.20 MB: 0.90 MB here).
    shared = {f.name: f for f in C.fused_prefix_costs(GLM5, 16, L, indexer=False)}
    full = {f.name: f for f in C.fused_prefix_costs(GLM5, 16, L)}
    assert agrees(shared["A0"].bytes / C.MB, "0.70") and agrees(full["A0"].bytes / C.MB, "0.90")


def test_act_quant_folded():
    sep = C.prefix_costs(GLM5, 16, L)
    fold = C.prefix_costs(GLM5, 16, L, act_quant_separate=False)
    names = [r.name for r in fold]
    assert "A0.norm+quant" in names and not {"A0.quant", "D1.quant", "D0.quant"} & set(names)
    assert names.index("A0.norm+quant") == 0 and names[-2:] == ["E1.logits", "E2.topk"]
    by = {r.name: r for r in fold}
    assert dict(by["D0.gemm"].reads)["q_lora"] == 16 * 2 * 2048  # bf16 q_lora, quantized in the prologue
    fused_a0 = {f.name: f for f in C.fused_prefix_costs(GLM5, 16, L)}["A0"]
    assert by["A0.norm+quant"].bytes == fused_a0.bytes
    assert C.total(fold).bytes < C.total(sep).bytes
    assert C.total(fold).flops == C.total(sep).flops
    assert C.total(C.prefix_costs(GLM5, 1, L, indexer=False, act_quant_separate=False)).bytes > 0


def test_fuse_rejects_stray_rows():
    rows = C.prefix_costs(GLM5, 1, L)
    groups = dict(C.PREFIX_FUSED_OPS)
    groups.pop("E2")
    with pytest.raises(ValueError, match="E2.topk"):
        C.fuse(rows, groups, C.PREFIX_ELIDED)
    with pytest.raises(ValueError, match="unknown row"):
        C.fused_prefix_costs(GLM5, 1, L, groups={**C.PREFIX_FUSED_OPS, "X": ("nope",)})
    # a custom grouping: E1 + E2 fused, logits never reach HBM
    groups = {**C.PREFIX_FUSED_OPS, "E": ("E1.logits", "E2.topk")}
    del groups["E1"], groups["E2"]
    e = {f.name: f for f in C.fused_prefix_costs(GLM5, 16, L, groups=groups)}["E"]
    assert "logits" not in dict(e.reads) and "logits" not in dict(e.writes)


# ---- consistency with the runtime weights and the renderer -------------------------------------------------------


def test_small_config_weights_match_runtime_layout():
    from glm5_fastpath.weights import random_layer

    cfg = Glm5Config.preset("small")
    lw = random_layer(cfg, 1)
    a, ix = lw.attn, lw.attn.indexer
    rows = {r.name: r for r in C.prefix_costs(cfg, 2, 100)}
    assert rows["B0.gemm"].weight_bytes == a.qkv_a.nbytes
    assert rows["D0.gemm"].weight_bytes == a.q_b.nbytes
    assert rows["D1.gemm"].weight_bytes == ix.wq_b.nbytes
    assert rows["B1.gemm"].weight_bytes == ix.wk.nbytes
    assert rows["C0.gemm"].weight_bytes == ix.weights_proj.numel() * 2
    assert rows["D2.bmm"].weight_bytes == a.w_kc.numel() * a.w_kc.element_size()
    core = {r.name: r for r in C.attn_core_costs(cfg, 2, 100)}
    assert core["F1.w_uv"].weight_bytes == a.w_vc.numel() * a.w_vc.element_size()
    assert core["F2.o_proj"].weight_bytes == a.o_proj.nbytes
    w13, w2 = lw.mlp.experts.get(0)
    assert C.expert_bytes(cfg) == w13.nbytes + w2.nbytes


def test_render_markdown():
    rows = C.prefix_costs(GLM5, 16, L)
    md = C.render_markdown(rows, C.SPEC_BW, title="prefix M=16")
    lines = md.strip().splitlines()
    assert lines[0] == "#### prefix M=16" and "t_mem @4.3TB/s (us)" in lines[2]
    assert len(lines) == 2 + 2 + len(rows) + 1
    assert lines[-1].startswith("| **sum** |") and "**95.17**" in lines[-1] and "**22.13**" in lines[-1]
    fused = C.fused_prefix_costs(GLM5, 16, L)
    meas = {f.name: 2 * f.t_mem_us() for f in fused}
    md = C.render_markdown(fused, measured_us=meas)
    assert "x floor" in md and md.count("| 2.00 |") == len(fused) and "**2.00**" in md.splitlines()[-1]
    partial = C.render_markdown(fused, measured_us={"B0": 10.0})
    assert partial.splitlines()[-1].endswith("|  |  |")
