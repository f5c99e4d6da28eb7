#!/bin/bash
# Session 23 call 2 (issue #5): dynamic dispatch's claim policy. Call 1 claimed the next task as soon as the
# current one had its inputs (slower than the static list at 1 / 16 tokens: 74 / 99 against 66 / 92 us; faster
# at 64: 264 against 274). Now each list entry carries a claim delay (its estimated run time minus a lead), so a
# CTA claims near the end of its task. GPU tests, then the megakernel bench: list, and dynamic with leads 1.5 us
# (default), 3 us, at readiness (call 1's policy) and at done; list and lead 1.5 twice; a traced lead-1.5 step.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=540
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
run_tests dynamic 150 tests/attn_pre/megartp/test_megartp_dynamic.py
step list_1 35 $B --scheduler list --json "$H200_OUT/list_1.json"
step lead1.5_1 35 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/lead1.5_1.json"
step lead3 35 $B --scheduler dynamic --claim-lead 3 --json "$H200_OUT/lead3.json"
step done 35 $B --scheduler dynamic --claim-lead done --json "$H200_OUT/done.json"
step ready 35 $B --scheduler dynamic --claim-lead ready --json "$H200_OUT/ready.json"
step list_2 35 $B --scheduler list --json "$H200_OUT/list_2.json"
step lead1.5_2 35 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/lead1.5_2.json"
step trace 60 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/trace.json" --trace "$H200_OUT/trace"
h200_pack
