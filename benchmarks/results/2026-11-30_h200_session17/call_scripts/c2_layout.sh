#!/bin/bash
# Session 17, call 2 (nvidia-h200): k-block-major weights for the skinny FP8 GEMM (every weight TMA box one contiguous
# 16 KB). GPU tests (bitwise equal to row-major across the plain and fused ops), then bench gemm-layout (row vs kb, full
# GEMM and loads-only ring) at 1 / 16 / 64 tokens, and the per-CTA phases of both layouts at 16.
# run: C=<commit> bash .../c2_layout.sh   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests kblock 120 tests/ops/test_fp8_gemm.py -k "kblock"
run_tests layout 60 tests/bench/test_gemm_layout.py tests/bench/test_gemm_phases.py
step layout 200 python3 -m glm5_fastpath.cli bench gemm-layout --out "$H200_OUT/layout" --tokens 1,16,64 \
  --shapes qkv_a,index_q,q_b,o_proj
step phases 60 python3 -m glm5_fastpath.cli bench gemm-phases --out "$H200_OUT/phases" --tokens 16 --layouts row,kb
h200_pack
