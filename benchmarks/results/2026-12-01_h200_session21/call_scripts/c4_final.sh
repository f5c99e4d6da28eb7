#!/bin/bash
# Session 21 call 4 (issue #5): the session's final megakernel (B1 in 4 K splits by default, call 3's best tiling):
# GPU tests; #5's per-bucket table (stock, CMP, MegaRTP on the whole prefix, same run, same rotated sets); list vs
# round-robin placement; the traced step.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=480
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step prefix 150 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 1,16,64 \
  --executors stock,cmp,megartp --timeline-modes none --replays 30
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
step list 40 $B --json "$H200_OUT/list.json"
step round_robin 40 $B --scheduler round_robin --json "$H200_OUT/round_robin.json"
step mtrace 60 $B --json "$H200_OUT/mtrace.json" --trace "$H200_OUT/trace"
h200_pack
