#!/bin/bash
# Session 22 call 1 (issue #5): (1) the megakernel's GEMM families with 8 weight stages in flight against the
# default 6 (session 21's prepared next/c1_gemm_stages.sh): GPU tests with 8, alternating rounds; (2) the planner
# with E2's cold cost refitted (COLD_US E2 9 -> 1, FIXED_US E2 7.5 -> 9.5): list against insertion, alternating.
# Traced step with 8 stages at the end.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22.tar.xz)
source scripts/h200_lib.sh
DEADLINE=450
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
step gpu-tests-s8 170 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider \
  tests/attn_pre/megartp/test_megartp_device.py
for r in 1 2; do
  step s6_list_$r 35 $B --json "$H200_OUT/s6_list_$r.json"
  step s8_list_$r 35 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_list_$r.json"
  step s6_ins_$r 35 $B --scheduler insertion --json "$H200_OUT/s6_ins_$r.json"
done
step s8_trace 50 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_trace.json" --trace "$H200_OUT/trace"
h200_pack
