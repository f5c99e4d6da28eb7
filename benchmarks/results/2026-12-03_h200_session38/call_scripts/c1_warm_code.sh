#!/bin/bash
# For the next session (written in session 37, not run): stage part aa of the SGLang site for the engine calls right
# after (same machine), then GLM5_FASTPATH_MOE_WARM_CODE (the router decode kernel's / MegaMoE plan kernel's dry warm-up
# before their PDL wait): its GPU tests, the router / plan phase marks cold against warm (does the top-k epilogue's
# 3.4 us and the plan body's 5.3 us at 1 token shrink when the code is warm?), the decode MoE layer A B A B, and
# benchmarks/cold_code.py (each short op after an L2 flush against back to back) with and without the warm-up builds.
# run: C=<commit> bash this   (carry .carry/jit_s38.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=540
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s38.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench"
run_tests warm 150 tests/moe/test_warm_code.py
# D2's q_cat op again: its launch moved into ops.d2_absorb._launch after session 37's GPU run (review)
run_tests d2-qcat 90 tests/ops/test_d2_absorb_qcat.py
GLM5_FASTPATH_MOE_WARM_CODE=1 run_tests warm-router-decode 90 tests/ops/test_moe_router.py -k "decode or phase"
for w in 0 1; do
  GLM5_FASTPATH_MOE_WARM_CODE=$w step router-w$w 60 $B router --out "$H200_OUT/router_w$w" --tokens 1,2,4,8 --phases
  GLM5_FASTPATH_MOE_WARM_CODE=$w step moe-trace-w$w 60 $B moe --out "$H200_OUT/moe_trace_w$w" --settings b \
    --tokens 1,8 --no-deepgemm --trace
done
for r in a b; do for w in 0 1; do
  GLM5_FASTPATH_MOE_WARM_CODE=$w step moe-layer-$r-w$w 45 $B moe-layer --tokens 1,8 --no-stock --out "$H200_OUT/moe_layer_${r}_w$w"
done; done
# what a cold L2 / cold code costs the short ops, with and without the warm-up builds (benchmarks/cold_code.py)
for w in 0 1; do
  GLM5_FASTPATH_MOE_WARM_CODE=$w step cold-code-w$w 90 python3 benchmarks/cold_code.py --ops router,router8,a0,d2,moe \
    --out "$H200_OUT/cold_code_w$w"
done
grep -h "M=1\|M=8" "$H200_OUT"/moe-layer-*.log | cut -c1-220
h200_pack
