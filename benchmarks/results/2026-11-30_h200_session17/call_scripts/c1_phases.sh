#!/bin/bash
# Session 17, call 1 (nvidia-h200): the per-CTA phase breakdown of the prefix GEMMs (bench gemm-phases) at 1 / 16 /
# 64 tokens, its GPU test, and the tune smoke test (now --rounds 2; unrun since session 16's edit).
# run: C=<commit> bash .../c1_phases.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests phases 100 tests/bench/test_gemm_phases.py
step phases 150 python3 -m glm5_fastpath.cli bench gemm-phases --out "$H200_OUT/phases" --tokens 1,16,64 --launches 7
run_tests tune 150 tests/test_tune.py -k gpu_tune_with_moe_smoke
h200_pack
