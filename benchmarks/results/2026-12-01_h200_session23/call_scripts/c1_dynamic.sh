#!/bin/bash
# Session 23 call 1 (issue #5): MegaRTP dynamic dispatch. The CTAs claim instructions from one topologically
# ordered list at run time (scheduler "dynamic") instead of running per-SM queues placed on the host, against the
# head-of-line blocking the session-22 trace showed (94.7 us at 16 tokens against a ~59 us chain). GPU tests of
# the dynamic path (bitwise = static outputs) and of the megakernel (static regression); the megakernel bench,
# list vs dynamic in two alternating rounds; traced dynamic steps.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23.tar.xz)
source scripts/h200_lib.sh
DEADLINE=540
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
run_tests dynamic 150 tests/attn_pre/megartp/test_megartp_dynamic.py
for r in 1 2; do
  step list_$r 35 $B --scheduler list --json "$H200_OUT/list_$r.json"
  step dynamic_$r 35 $B --scheduler dynamic --json "$H200_OUT/dynamic_$r.json"
done
step dynamic_trace 60 $B --scheduler dynamic --json "$H200_OUT/dynamic_trace.json" --trace "$H200_OUT/trace"
run_tests mrtp 130 tests/attn_pre/megartp/test_megartp_device.py
h200_pack
