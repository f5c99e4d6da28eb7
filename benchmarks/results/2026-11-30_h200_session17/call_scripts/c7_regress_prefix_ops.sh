#!/bin/bash
# Session 17, call 7 (nvidia-h200): (1) bench gemm-chain with the chain's phase build (where its time goes), B0 -> D1
# at 1 / 16 tokens; (2) regression after the session's fp8_gemm changes (kernel cache keyed by the spec, the load_w
# refactor: production SASS byte-identical): the whole fp8_gemm GPU test file and the CMP executor's bitwise mode
# tests; (3) bench prefix-ops (issue #3's per-op table, ours and stock in one run) at M = 1 / 16 / 64.
# run: C=<commit> bash .../c7_regress_prefix_ops.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step chain 90 python3 -m glm5_fastpath.cli bench gemm-chain --out "$H200_OUT/chain" --tokens 1,16 --pairs "qkv_a>index_q"
run_tests fp8_gemm 200 tests/ops/test_fp8_gemm.py
run_tests cmp 100 tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "bitwise"
step prefix_ops 160 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16,64 --out "$H200_OUT/prefix_ops"
h200_pack
