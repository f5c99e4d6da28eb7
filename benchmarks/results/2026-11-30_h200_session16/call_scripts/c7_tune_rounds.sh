#!/bin/bash
# Session 16 call 7: `tune --rounds 2 --moe off` at bucket 1 on the H200 (the new rounds path end to end: round 1 with
# the stock graph, round 2 without, the merged report and table).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=150
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step tune 140 python3 -m glm5_fastpath.cli tune --moe off --rounds 2 --buckets 1 --replays 50 --out "$H200_OUT/tune/t.json"
h200_pack
