#!/bin/bash
# Session 31 call 1 (issues #9, #6): where the decode MoE layer's router -> plan -> MegaMoE chain spends its time.
# The trace build now stamps the plan kernel's phases (megamoe.cuh plan_stamp; summary["plan"]); bench moe --trace at
# 1 / 8 / 16 tokens (setting b: the engine's 256 experts + shared), and bench moe-layer's chains (separate / fused
# router + plan) at the same token counts, ours only.
# run: C=<commit> bash this   (carry .carry/jit_s31.tar.xz)
source scripts/h200_lib.sh
DEADLINE=480
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s31.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step moe-trace 200 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b,a --tokens 1,8,16 \
  --no-deepgemm --trace
step moe-layer 200 python3 -m glm5_fastpath.cli bench moe-layer --out "$H200_OUT/moe_layer" --tokens 1,8,16 \
  --no-stock --replays 30 --rounds 3
h200_pack
