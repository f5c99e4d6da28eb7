#!/bin/bash
# Session 34 call 2 (issue #9): mla_v_up_quant v2 (W_UV slice into shared memory by bulk copies before the PDL
# wait; call 1's register version was 8 us, 2x its floor).
# 0. keep the first part of the SGLang site on the machine (build/h200parts/) for call 3 (the tree + the whole site
#    exceed a call's 64 MiB);
# 1. GPU tests of the op;
# 2. bench v-up: ours vs SGLang's bf16 bmm (+ act quant), alone and in the chain sparse MLA -> W_UV -> o_proj.
# run: C=<commit> bash this   (carry .carry/jit_s33b.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=400
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests v-up 120 tests/ops/test_mla_v_up.py
step v-up 180 python3 -m glm5_fastpath.cli bench v-up --out "$H200_OUT/v_up" --replays 30
h200_pack
