#!/bin/bash
# Session 24 c5 (issue #5): session 23's prepared hang hunt, two rounds. Session 23 c5: test_megartp_device.py hung
# once in test_subgraph_b0_b1_d1_d2_epochs[8-queues] (no error record; four reruns passed). Since then the workers'
# slot wait is bounded (error kind 6, kErrSlotTimeout), not yet run on a GPU: these runs are its first. run_tests dumps
# every thread's Python stack into the log when a test passes TEST_HANG_S (60 s). Then the dynamic-dispatch tests,
# and the in-flight cap's bitwise digest (c4's digest step failed on the script's scale shape).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24.tar.xz; export GLM5_FASTPATH_COMMIT=$C
for r in 1 2; do run_tests mrtp_$r 150 tests/attn_pre/megartp/test_megartp_device.py; done
run_tests dynamic 60 tests/attn_pre/megartp/test_megartp_dynamic.py
for n in 0 3; do step digest$n 30 env GLM5_FASTPATH_FP8_GEMM_INFLIGHT=$n python3 benchmarks/skinny_output_digest.py --out "$H200_OUT/digest$n.json"; done
step compare3 10 python3 benchmarks/skinny_output_digest.py --compare "$H200_OUT/digest0.json" "$H200_OUT/digest3.json"
h200_pack
