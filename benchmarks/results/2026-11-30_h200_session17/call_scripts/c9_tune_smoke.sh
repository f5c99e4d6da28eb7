#!/bin/bash
# Session 17, call 9 (nvidia-h200): the GPU tune smoke test (now `--rounds 2 --modes full,full+pin:D1=0`; call 1 cut
# it at 150 s with all eleven modes), then the rest of the wgmma option bitwise tests call 7 did not reach.
# run: C=<commit> bash .../c9_tune_smoke.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=330
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests tune 170 tests/test_tune.py -k gpu_tune_with_moe_smoke
run_tests options 150 tests/ops/test_fp8_gemm.py -k "wgmma_options_bitwise_equal"
h200_pack
