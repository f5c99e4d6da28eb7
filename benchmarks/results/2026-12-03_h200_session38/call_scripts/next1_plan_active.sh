#!/bin/bash
# For the next session (written in session 38, not run): GLM5_FASTPATH_MOE_PLAN_ACTIVE (MegaMoE's plan deals the active
# experts over its warps in the task phase): its GPU tests (task list and outputs against the default build), the plan
# phases in the trace build with and without it (does the task phase drop from ~4 us at 8 tokens toward 1?), and the
# decode MoE layer chain A B A B at 1 / 8 / 16 tokens. Stages part aa of the SGLang site for next2 (same machine).
# run: C=<commit> bash this   (carry a refreshed JIT seed as .carry/jit_s39.tar.xz and .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=480
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s39.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench"
run_tests plan-active 200 tests/moe/test_megamoe.py -k plan_active
for w in 0 1; do
  GLM5_FASTPATH_MOE_PLAN_ACTIVE=$w step moe-trace-pa$w 90 $B moe --out "$H200_OUT/moe_trace_pa$w" --settings b \
    --tokens 1,8,16,32 --trace
done
for r in a b; do for w in 0 1; do
  GLM5_FASTPATH_MOE_PLAN_ACTIVE=$w step moe-layer-$r-pa$w 50 $B moe-layer --tokens 1,8,16 --no-stock \
    --out "$H200_OUT/moe_layer_${r}_pa$w"
done; done
grep -ho "plan body [0-9.]* us ([^)]*)" "$H200_OUT"/moe_trace_pa*/megamoe_bench.md
grep -h "M=1:\|M=8:\|M=16:" "$H200_OUT"/moe-layer-*.log | cut -c1-200
h200_pack
