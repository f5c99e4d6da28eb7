#!/bin/bash
# Session 17, calls 5 and 6 (nvidia-h200; call 6 after the spin backoff + WKB template fix): two dependent prefix GEMMs in one persistent launch (ops.fp8_gemm_chain). GPU tests
# (bitwise equal to two forced-config launches, repeated launches, graph replays), then bench gemm-chain at 1 / 16
# tokens for B0 -> D1 (qkv_a > index_q) and B0 -> D0 (qkv_a > q_b) against the two launches with PDL off / on.
# run: C=<commit> bash .../c5_chain.sh   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests chain 150 tests/ops/test_fp8_gemm_chain.py
step chain 200 python3 -m glm5_fastpath.cli bench gemm-chain --out "$H200_OUT/chain" --tokens 1,16
h200_pack
