#!/bin/bash
# Session 31 call 1 (issues #9, #6): the shared expert overlapped with the routing (moe/overlap.py), first run.
# 1. its GPU tests (bitwise against the one-launch chain, grids, alternating launches, graph replays + late producer);
# 2. where the plan kernel's time goes (the trace build now stamps its phases: summary["plan"]), 1 / 8 tokens, setting b;
# 3. bench moe-layer at 1 / 8 / 16 tokens: separate (the route's default chain) vs overlap with the shared launch on
#    88 (default) / 64 / 110 CTAs, ours only.
# run: C=<commit> bash this   (carry .carry/jit_s31.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s31.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests overlap 170 tests/moe/test_overlap.py -x
step moe-trace 100 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1,8 \
  --no-deepgemm --trace
step moe-layer 230 python3 -m glm5_fastpath.cli bench moe-layer --out "$H200_OUT/moe_layer" --tokens 1,8,16 \
  --no-stock --replays 30 --rounds 2 --overlap-grids default,64,110
h200_pack
