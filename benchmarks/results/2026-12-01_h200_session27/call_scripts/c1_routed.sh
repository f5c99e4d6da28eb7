#!/bin/bash
# Session 27 call 1 (issue #9 / #6): the fused router + MegaMoE plan (moe/routed.py, csrc/moe/router_plan.cu), first GPU
# run. Its tests (bitwise against the separate router -> act quant -> plan -> MegaMoE kernels), the router's file (its
# kernels moved into router_kernels.cuh) and MegaMoE's file (the plan body now takes its thread count), then
# `bench moe-layer` (fused vs separate vs SGLang-style stock with DeepGEMM fp8_mega_moe, same run).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s27.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s27.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=40 run_tests routed 150 tests/moe/test_routed.py -x
step moe_layer 150 python3 -m glm5_fastpath.cli bench moe-layer --out "$H200_OUT/moe_layer" --tokens 1,2,4,8,16,32 \
  --replays 30 --rounds 3
run_tests router 90 tests/ops/test_moe_router.py
run_tests megamoe 130 tests/moe/test_megamoe.py
h200_pack
