#!/bin/bash
# Prepared in session 23 (issue #5), not run. Session 23 c5: test_megartp_device.py hung once in
# test_subgraph_b0_b1_d1_d2_epochs[8-queues] (no error record; four reruns passed). Run the megakernel file three
# times; run_tests dumps every thread's Python stack into the log when a test passes TEST_HANG_S (60 s), so a
# recurrence shows whether the host sits in a CUDA synchronize (a kernel that never ends: an unbounded spin or a
# mismatched CTA barrier) or elsewhere. Then the dynamic-dispatch tests.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz, or a refreshed cache)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
for r in 1 2 3; do
  run_tests mrtp_$r 150 tests/attn_pre/megartp/test_megartp_device.py
done
run_tests dynamic 70 tests/attn_pre/megartp/test_megartp_dynamic.py
h200_pack
