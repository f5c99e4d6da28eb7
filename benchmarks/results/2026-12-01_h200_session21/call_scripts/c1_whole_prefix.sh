#!/bin/bash
# Session 21 call 1 (issue #5): session 20's three untested patches applied (E2 and D0 families, the MegaRTP row of
# bench prefix). Megakernel GPU tests (new: test_e2_family, test_d0_family_glm5; the C0 check mend), then #5's
# per-bucket comparison in one run: stock, CMP and the megakernel on the whole prefix, same rotated sets; then the
# megakernel bench with a trace per M (to fit the planner's fixed costs for C0 / D0 / E2).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s21.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s21.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 160 tests/attn_pre/megartp/test_megartp_device.py
step prefix 200 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 1,16,64 \
  --executors stock,cmp,megartp --timeline-modes none --replays 30
step mtrace 90 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" \
  --trace "$H200_OUT/trace"
h200_pack
