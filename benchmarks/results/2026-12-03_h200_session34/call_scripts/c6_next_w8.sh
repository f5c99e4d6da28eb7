#!/bin/bash
# For the next session (written in session 34, not run): the fixed op / route GPU tests, the W8 form of the V-up kernel
# (ops.mla_v_up_quant_w8: W_UV from SGLang's FP8 kv_b_proj, half the bytes and half the shared memory; must be bitwise
# the bf16 form on SGLang's w_vc), and bench v-up with its ours_w8 / chain_ours_w8 columns.
# If the W8 form is bitwise and faster: an engine A/B with GLM5_FASTPATH_V_UP_W8=1 against without (c3's script with
# RUNS naming the two runs and the env set per run; the site in two parts as in c2 / c3).
# run: C=<commit> bash this   (carry a JIT seed, e.g. .carry/jit_s33b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests v-up 90 tests/ops/test_mla_v_up.py
run_tests v-up-route 60 tests/integrations/sglang/test_v_up_route.py
step v-up 150 python3 -m glm5_fastpath.cli bench v-up --out "$H200_OUT/v_up" --replays 30
h200_pack
