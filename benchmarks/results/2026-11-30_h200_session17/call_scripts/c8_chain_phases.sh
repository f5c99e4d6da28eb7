#!/bin/bash
# Session 17, call 8 (nvidia-h200): the gemm chain's phase build (call 7 could not read its marks: the array sat in an
# anonymous namespace), B0 -> D1 at 1 / 16 tokens; the persistent GEMM's bitwise GPU test (the chain reuses its ring).
# run: C=<commit> bash .../c8_chain_phases.sh   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=240
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step chain 90 python3 -m glm5_fastpath.cli bench gemm-chain --out "$H200_OUT/chain" --tokens 1,16 --pairs "qkv_a>index_q"
run_tests persistent 90 tests/ops/test_fp8_gemm.py -k "persistent_bitwise"
h200_pack
