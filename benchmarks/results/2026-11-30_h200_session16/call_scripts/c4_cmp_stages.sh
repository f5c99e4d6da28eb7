#!/bin/bash
# Session 16, call 4 (nvidia-h200): D0 with fewer ring stages (stages:D0=N: less shared memory, so E1's 38 KB CTAs
# fit beside a resident D0 CTA) on top of pin:D1=0, against the call-3 winners; M = 16, 1, 2, 4, 8, 32, two rounds
# (100 replays, no stock: call 3 measured it), the timeline of the stage-capped mode at M = 16.
# run: C=<commit> bash .../c4_cmp_stages.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=585
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests stages 90 tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "composite and stages"
MODES="full,multistream_pdl_prologue,full_prio_index,full+pin:D1=0,full+pin:D1=0+stages:D0=4,full+pin:D1=0+stages:D0=3"
MODES="$MODES,full+stages:D0=4,multistream_pdl_prologue+pin:D1=0+stages:D0=4,multistream"
for r in 1 2; do
  TL=none; [ $r = 1 ] && TL="full+pin:D1=0+stages:D0=4,full+pin:D1=0+stages:D0=3"
  step round$r 150 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round$r" --no-stock --replays 100 \
    --ms 16,1,2,4,8,32 --modes "$MODES" --timeline-modes "$TL"
done
h200_pack
