#!/bin/bash
# Session 19 call 9 (issue #5): the session's final megakernel (supported subgraph A0 + B0 + B1 + D1 + D2 + E1) and
# the CMP executor's whole prefix in the same run, for context (MegaRTP cannot run C0 / D0 / E2 yet, so the two
# rows are not the same work): megartp bench at 1 / 16 / 64 tokens (two rounds), then bench prefix (CMP modes
# full and multistream_pdl_prologue, no stock row, no timeline) at the same token counts.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=280
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step megartp1 60 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench_1.json"
step megartp2 60 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench_2.json"
step cmp 150 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/cmp" --ms 1,16,64 --no-stock \
  --modes full,multistream_pdl_prologue --timeline-modes none --replays 30
h200_pack
