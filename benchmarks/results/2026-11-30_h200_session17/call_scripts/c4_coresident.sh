#!/bin/bash
# Session 17, call 4 (nvidia-h200): co-residency of D1 with B0 at 16 tokens. B0's CTAs (114 KB smem, 133 regs x 288)
# leave room for a second CTA of <= ~110 KB, but D1's 8-stage config takes 144 KB, so its PDL-launched CTAs cannot
# start (and prefetch weights) on B0's SMs. At 1-4 tokens D1's config is 74 KB, where full+pin:D1=0 gained 2.5-4.8 %.
# Stage caps on D1 (stages:D1=4 -> 74 KB, =6 -> 109 KB), with / without the pin; two rounds at M = 16, one at 8 / 32.
# run: C=<commit> bash .../c4_coresident.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
MODES="multistream_pdl_prologue,multistream,full+pin:D1=0,full+pin:D1=0+stages:D1=4,full+pin:D1=0+stages:D1=6"
MODES="$MODES,multistream_pdl_prologue+pin:D1=0+stages:D1=4,full+pin:D1=0+stages:D1=4+stages:D0=5,full+stages:D1=4"
MODES="$MODES,full+pin:D1=0+stages:D1=4+stages:B0=4,multistream_pdl_prologue+stages:D1=4"
step round1 170 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round1" --replays 100 --ms 16 \
  --modes "$MODES" --timeline-modes "full+pin:D1=0,full+pin:D1=0+stages:D1=4"
step round2 120 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round2" --no-stock --replays 100 \
  --ms 16,8,32 --modes "$MODES" --timeline-modes none
h200_pack
