#!/bin/bash
# Session 16, call 5 (nvidia-h200): closing checks. The CMP GPU test file (every bucket and M below it, 1000 replays,
# late producer, composite modes incl. full+pin:D1=0), then the shipped table's old and new CMP modes at 1 / 2 / 4 / 8
# tokens in two fresh rounds (100 replays) with the stock graph in the first.
# run: C=<commit> bash .../c5_closing.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=500
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests cmp 300 tests/attn_pre/cmp/test_cmp_executor_gpu.py
MODES="multistream_pdl_prologue,full,full+pin:D1=0,full_prio_index"
step round1 90 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round1" --replays 100 \
  --ms 1,2,4,8 --modes "$MODES" --timeline-modes none
step round2 60 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round2" --replays 100 --no-stock \
  --ms 1,2,4,8 --modes "$MODES" --timeline-modes none
h200_pack
