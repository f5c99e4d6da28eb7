#!/bin/bash
# Session 33 call 2 (issues #6, #9): MegaMoE CTA pairs with the first finisher handing its partial to the second
# (c1 measured the fixed rank-1 -> rank-0 direction: rank 0 waited for the slower half).
# 1. GPU tests: pair bitwise vs unpaired (1-33 tokens, 25 launches each), graph replay;
# 2. bench moe, settings a / b, 1 / 2 / 4 tokens (split-K region): unpaired vs pair, bn8 / bn16, ours only;
# 3. the trace build of the default vs the pair config at 1 token, setting b.
# run: C=<commit> bash this   (carry .carry/jit_s33b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests pair 150 tests/moe/test_megamoe.py -x -k pair
step moe-pair 200 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_pair" --settings a,b --tokens 1,2,4 \
  --no-deepgemm --replays 50 \
  --configs bn8_s6_g512_w4_lf,bn8_s6_g512_w4_lf_c,bn16_s6_g512_w4_lf,bn16_s6_g512_w4_lf_c
step moe-trace 80 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1 \
  --no-deepgemm --trace --configs bn8_s6_g512_w4_lf_c,bn16_s6_g512_w4_lf_c
h200_pack
