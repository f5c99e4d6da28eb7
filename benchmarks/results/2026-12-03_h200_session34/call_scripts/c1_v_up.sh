#!/bin/bash
# Session 34 call 1 (issue #9): the fused W_UV + o_proj act quant (ops.mla_v_up_quant), first GPU run.
# 1. GPU tests of the op (reference, strided o, determinism, late producer under PDL, graph replay);
# 2. bench v-up: ours vs SGLang's bf16 bmm (+ our act quant) alone and before o_proj, 1..64 tokens.
# run: C=<commit> bash this   (carry .carry/jit_s33b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests v-up 150 tests/ops/test_mla_v_up.py
step v-up 150 python3 -m glm5_fastpath.cli bench v-up --out "$H200_OUT/v_up" --replays 30
h200_pack
