#!/bin/bash
# Session 30 call 1 (issues #9, #6): park the engine site's first part in build/h200parts/ (c2 brings the rest), then
# MegaMoE's trace build at 1-8 tokens (session 29's prepared next/s30c1_moe_trace_1token.sh): where MegaMoE's ~10 us
# above its floor at 1-2 tokens goes (plan hand-off, FC2 spin on fc1_done, tail).
# run: C=<commit> bash this   (carry .carry/h200site.part.aa .carry/jit_s30.tar.xz;
#                              split -b 19200000 .carry/h200site.tar.xz .carry/h200site.part.)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts
source scripts/h200_lib.sh
DEADLINE=400
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s30.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step "moe-trace" 240 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings a,b \
  --tokens 1,2,4,8 --no-deepgemm --trace --trace-save-max-tokens 8
h200_pack
