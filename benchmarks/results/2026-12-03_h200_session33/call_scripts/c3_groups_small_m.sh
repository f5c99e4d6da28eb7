#!/bin/bash
# Session 33 call 3 (issues #6, #9): MegaMoE's scheduling group size at decode sizes (1-16 tokens), never measured
# there (session 14 measured it at 2048-4096). group_size G: FC1 of group g+1 is listed before FC2 of group g, so FC2
# work of the first experts is available while later experts' FC1 still streams (a shorter FC1 -> FC2 tail?).
# bench moe, settings a / b, ours only, extra configs: the 1-token default (bn8 w4) with G 2 / 4 / 8 and the 2-16
# token default family (w0) with G 4 / 16; plus the trace of G 4 at 1 token (setting b).
# run: C=<commit> bash this   (carry .carry/jit_s33.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step moe-groups 300 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_groups" --settings a,b --tokens 1,2,4,8,16 \
  --no-deepgemm --replays 50 \
  --configs bn8_s6_g2_w4_lf,bn8_s6_g4_w4_lf,bn8_s6_g8_w4_lf,bn8_s6_g4_w0_lf,bn8_s6_g16_w0_lf,bn16_s6_g4_w0_lf
step moe-trace 80 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1 \
  --no-deepgemm --trace --configs bn8_s6_g4_w4_lf
h200_pack
