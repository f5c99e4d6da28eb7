#!/bin/bash
# Session 14 call 9: the MegaMoE GPU test file at the final kernel (csrc = 763c503: the end-combine flag test in pool
# builds only, after the c5 closing run at bbe92a6).
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
DEADLINE=250 h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
DEADLINE=250 run_tests moe 200 tests/moe/test_megamoe.py
grep -E "passed|failed" $H200_OUT/gpu-tests-moe.log | tail -1; grep FAILED $H200_OUT/gpu-tests-moe.log | head
h200_pack
