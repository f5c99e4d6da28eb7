#!/usr/bin/env bash
# One lent-H200 call (<= 10 min): the whole GPU test suite in a few groups (one pytest per group, each under its own
# time limit, so a slow or hung group still leaves the others' logs), then optional benchmarks while the deadline
# allows. Results in OUTDIR (tar it at the end of the device command).
#   usage: scripts/h200_gpu_suite.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
#   env:   DEADLINE (s, default 570); BENCH=1 adds bench fp8-linear and bench router after the tests.
# A JIT cache built from other sources makes the groups compile (session 8, call 1: two groups ran out of time).
set -uo pipefail
source "$(dirname "$0")/h200_lib.sh"
h200_setup "$@"
run_tests gemm 140 tests/ops/test_fp8_gemm.py tests/ops/test_fp8_gemm_rotate.py
run_tests moe 140 tests/moe tests/ops/test_moe_router.py tests/ops/test_act_quant.py
run_tests ops 150 tests/ops/test_e2_topk.py tests/ops/test_e1_indexer_logits.py tests/ops/test_sparse_mla.py \
  tests/ops/test_add_rmsnorm_quant.py tests/ops/test_c0_head_gate.py tests/ops/test_d2_absorb.py \
  tests/ops/test_sm90_primitives.py tests/ops/test_l2_prefetch.py tests/ops/test_pdl_wait_points.py
run_tests rest 300 tests/attn_pre tests/integrations tests/ref tests/graph tests/test_tune.py tests/bench
if [ "${BENCH:-0}" = 1 ]; then
  export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false  # the stock path JIT-compiles only the M it runs
  step fp8_linear 120 python3 -m glm5_fastpath.cli bench fp8-linear --out "$H200_OUT/fp8_linear"
  step router 45 python3 -m glm5_fastpath.cli bench router --tokens 1,2,4,8,16,32 --out "$H200_OUT/router"
fi
el "done"
