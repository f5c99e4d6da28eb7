#!/bin/bash
# Session 33 call 1 (issues #6, #9): MegaMoE CTA pairs (MegaMoEConfig.pair, name suffix _c), first GPU run.
# 1. GPU tests: the pair build bitwise equal to the unpaired one (1-33 tokens, 25 launches each), graph replay;
# 2. bench moe, settings a / b, 1-16 tokens: the pair build against the unpaired one, with split-K (w4) and without
#    (w0), on the routed experts (columns ours@NAME), ours only;
# 3. the trace build of the default vs the pair config at 1 / 8 tokens, setting b (FC1 split hand-off, fc1_done spins);
# 4. (if time is left) bench moe-layer at 1 / 8 tokens: the separate chain vs the overlap (session 32's measurement,
#    whose raw files did not land).
# run: C=<commit> bash this   (carry .carry/jit_s33.tar.xz)
source scripts/h200_lib.sh
DEADLINE=570
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests pair 150 tests/moe/test_megamoe.py -x -k pair
step moe-pair 200 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_pair" --settings a,b --tokens 1,2,4,8,16 \
  --no-deepgemm --replays 30 \
  --configs bn8_s6_g512_w4_lf,bn8_s6_g512_w4_lf_c,bn16_s6_g512_w4_lf,bn16_s6_g512_w4_lf_c,bn8_s6_g512_w0_lf_c,bn16_s6_g512_w0_lf_c
step moe-trace 80 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1,8 \
  --no-deepgemm --trace --configs bn8_s6_g512_w4_lf_c
step moe-layer 120 python3 -m glm5_fastpath.cli bench moe-layer --out "$H200_OUT/moe_layer" --tokens 1,8 \
  --no-stock --replays 30 --rounds 1 --overlap-grids default
h200_pack
