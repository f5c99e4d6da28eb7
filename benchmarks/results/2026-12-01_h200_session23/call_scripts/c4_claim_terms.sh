#!/bin/bash
# Session 23 call 4 (issue #5): what a dynamic claim delay's run-time estimate includes (GLM5_FASTPATH_MRTP_CLAIM_TERMS:
# run = call 3's delays; cold = + the first-of-a-run cost, now the default; finish = + the reduce group's finish).
# Call 3's lead-1.5 trace at 16 tokens queued E2 behind E2 and D1 behind a B1 last arriver. Megakernel bench,
# list and each term set at lead 1.5 us, list and the default twice; GPU tests of the dynamic path; a traced step.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
D="$B --scheduler dynamic --claim-lead 1.5"
step list_1 40 $B --scheduler list --json "$H200_OUT/list_1.json"
step run 40 env GLM5_FASTPATH_MRTP_CLAIM_TERMS=run $D --json "$H200_OUT/run.json"
step cold_1 40 env GLM5_FASTPATH_MRTP_CLAIM_TERMS=cold $D --json "$H200_OUT/cold_1.json"
step finish 40 env GLM5_FASTPATH_MRTP_CLAIM_TERMS=finish $D --json "$H200_OUT/finish.json"
step list_2 40 $B --scheduler list --json "$H200_OUT/list_2.json"
step cold_2 40 env GLM5_FASTPATH_MRTP_CLAIM_TERMS=cold $D --json "$H200_OUT/cold_2.json"
run_tests dynamic 80 tests/attn_pre/megartp/test_megartp_dynamic.py
step trace 60 $D --ms 1,16 --json "$H200_OUT/trace.json" --trace "$H200_OUT/trace"
h200_pack
