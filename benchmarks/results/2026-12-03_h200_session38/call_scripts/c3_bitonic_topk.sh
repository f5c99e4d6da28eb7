#!/bin/bash
# Session 38 c3: the router's bitonic top-k epilogue (commit 01c496e+) against the round loop it replaced
# (GLM5_ROUTER_TOPK_ROUNDS build), same call: GPU tests (bitwise equal builds + the router file), bench router with
# phase marks for both builds, the decode MoE layer A B A B by GLM5_FASTPATH_ROUTER_TOPK_ROUNDS. Stages part aa of the
# SGLang site for the engine call after it (same machine).
# run: C=<commit> bash this   (carry .carry/jit_s38b.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=420
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s38b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench"
run_tests router 150 tests/ops/test_moe_router.py
step router-ab 90 $B router --out "$H200_OUT/router_ab" --tokens 1,2,4,8,16,32 --phases --topk-rounds
for r in a b; do for w in 0 1; do
  GLM5_FASTPATH_ROUTER_TOPK_ROUNDS=$w step moe-layer-$r-rounds$w 45 $B moe-layer --tokens 1,8 --no-stock \
    --out "$H200_OUT/moe_layer_${r}_rounds$w"
done; done
grep -h "M=1\|M=8" "$H200_OUT"/moe-layer-*.log | cut -c1-200
grep -A30 "Top-k epilogue A/B" "$H200_OUT/router_ab/router.md"
h200_pack
