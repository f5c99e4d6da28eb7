#!/bin/bash
# Session 38 c5: where the winning router CTA's top-k epilogue spends its ~3.2 us (phase mark 6: logits and bias
# landed), both top-k builds, plus the router's phase-build GPU tests.
# run: C=<commit> bash this   (carry .carry/jit_s38c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s38c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests router-phase 60 tests/ops/test_moe_router.py -k "phase or bitonic"
python3 -m glm5_fastpath.cli bench router --out "$H200_OUT/router_ab" --tokens 1,2,8 --phases --topk-rounds \
  > "$H200_OUT/router-ab.log" 2>&1; echo "router-ab rc=$?"
grep -A40 "Top-k epilogue A/B" "$H200_OUT/router_ab/router.md"
h200_pack
