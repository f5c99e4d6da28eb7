#!/bin/bash
# Session 20 call 6 (issues #5, #4, #3): the session's final code, same run: the megakernel on its subgraph (two
# rounds), CMP's whole prefix against the stock kernel sequence (stocksite: DeepGEMM + sgl_kernel), and the per-op
# table for B1 / D1 (whose epilogue reduce changed this session) against stock.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s20e.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s20e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step megartp1 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_1.json"
step prefix 150 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 1,16,64 \
  --modes full,multistream_pdl_prologue --timeline-modes none --replays 30
step megartp2 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_2.json"
step prefix_ops 150 python3 -m glm5_fastpath.cli bench prefix-ops --out "$H200_OUT/prefix_ops" --m 1,16,64 --ops B1,D1 \
  --budget-s 140
h200_pack
