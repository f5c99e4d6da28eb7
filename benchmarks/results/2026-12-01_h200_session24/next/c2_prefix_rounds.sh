#!/bin/bash
# Prepared in session 24 (issue #4), not run: the stock chain at M = 16 took 79-89 us across calls (sessions 23-24), so
# #4's ">= 1.8x stock" flips between calls. Three rounds of stock + the two best CMP modes in one call, 100 replays
# each, at 1 / 16 tokens, to state the ratio with its spread.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
for r in 1 2 3; do
  step prefix_$r 170 python3 -m glm5_fastpath.cli bench prefix --ms 1,16 --timeline-modes none --replays 100 \
    --modes full,multistream_pdl_prologue --out "$H200_OUT/prefix_$r"
done
h200_pack
