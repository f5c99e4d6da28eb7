#!/bin/bash
# Prepared for the next session (not run): where MegaMoE's ~10 us above its floor at 1-2 tokens goes (1.14x / 1.17x at
# 1 token in settings a / b, session 29 c1; at its floor from 8 tokens in b). The trace build records per task the
# claim, the fc1_done spin of FC2 tasks, first stage, MMA and epilogue times (megamoe.TRACE_COLUMNS); summarize_trace
# gives the kernel span, the spin total and the tail. Questions: how long the plan kernel's hand-off leaves the SMs idle
# before the first claim; how much of the span FC2 tasks spend spinning on their expert's last FC1 tiles; how long the
# last tasks run alone. The session-29 L2 prefetch of FC2 weights (spin time -> HBM) was 7-11 % slower, so the answer
# is probably not bandwidth during the spin.
# run: C=<commit> bash this   (carry .carry/jit_sNN.tar.xz; no site needed: ours only)
source scripts/h200_lib.sh
DEADLINE=300
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s30.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step "moe-trace" 240 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings a,b \
  --tokens 1,2,4,8 --no-deepgemm --trace --trace-save-max-tokens 8
h200_pack
