#!/bin/bash
# Session 33 call 4 (issues #6, #9): the token pool + end combine (one grid-wide combine pass after the last task instead
# of per-FC2-task combine counters, 2.4 us per FC2 task in the 1-token trace) at decode sizes, where only bn64 was ever
# measured with it (session 14). bench moe, settings a / b, 1 / 2 / 4 / 8 tokens, ours only; trace of bn8 pool + end
# combine at 1 token (setting b).
# run: C=<commit> bash this   (carry .carry/jit_s33.tar.xz)
source scripts/h200_lib.sh
DEADLINE=500
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step moe-endc 240 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_endc" --settings a,b --tokens 1,2,4,8 \
  --no-deepgemm --replays 50 \
  --configs bn8_s6_g512_w4_lf_p,bn8_s6_g512_w4_lf_p_e,bn8_s6_g512_w0_lf_p_e,bn16_s6_g512_w4_lf_p_e
step moe-trace 80 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1 \
  --no-deepgemm --trace --configs bn8_s6_g512_w4_lf_p_e
h200_pack
