#!/bin/bash
# Session 34 call 5: the op's and the route's GPU tests after the two test fixes (no SGLang site: the route's GPU test
# needs none since prometheus_client became optional in that file).
# run: C=<commit> bash this   (carry .carry/jit_s33b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=150
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests v-up 60 tests/ops/test_mla_v_up.py
run_tests v-up-route 60 tests/integrations/sglang/test_v_up_route.py
h200_pack
