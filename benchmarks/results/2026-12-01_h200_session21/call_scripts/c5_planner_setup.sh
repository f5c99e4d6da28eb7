#!/bin/bash
# Session 21 call 5 (issue #5): the planner with prologue (setup) costs refitted on call 4's trace, and the
# insertion scheduler. GPU tests (plans changed), then list / insertion / round-robin in one run, the whole-prefix
# table (stock, CMP, MegaRTP with the list plan) and a traced step.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
for s in list insertion round_robin; do step $s 40 $B --scheduler $s --json "$H200_OUT/$s.json"; done
step prefix 130 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 1,16,64 \
  --executors stock,cmp,megartp --timeline-modes none --replays 30
step mtrace 50 $B --json "$H200_OUT/mtrace.json" --trace "$H200_OUT/trace"
h200_pack
