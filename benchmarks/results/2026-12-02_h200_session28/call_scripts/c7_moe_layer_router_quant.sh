#!/bin/bash
# Session 28 call 7 (issue #6 / #9): `bench moe-layer` with a third chain, router_quant (the router kernel also writes
# MegaMoE's FP8 input: router + quant -> plan -> MegaMoE, 3 kernels; GLM5_FASTPATH_ROUTER_QUANT=1), next to the
# separate default (4) and the fused router + plan (2), stock in the same run. Five rounds for tighter medians.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s28.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s28.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step moe_layer 240 python3 -m glm5_fastpath.cli bench moe-layer --out "$H200_OUT/moe_layer" --tokens 1,2,4,8,16,32 \
  --replays 30 --rounds 5
h200_pack
