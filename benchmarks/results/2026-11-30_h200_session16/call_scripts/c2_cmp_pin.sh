#!/bin/bash
# Session 16, call 2 (nvidia-h200): D1 as B0's same-stream PDL consumer (pin:D1=0: its weights prefetched while B0
# runs; D0 / D2 on a side stream), against call 1's best composites and the named modes; M = 16, 1, 64.
# run: C=<commit> bash .../c2_cmp_pin.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=585
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests pin 100 tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "composite and pin"
MODES="full,multistream_pdl_prologue,full+pin:D1=0,multistream_pdl_prologue+pin:D1=0,full+pin:D1=0+after:D1>D0"
MODES="$MODES,full+after:D1>D0,full+after:D1>D0+cap:D0=96,full+pin:D1=0+cap:D0=96"
step prefix 400 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 16,1,64 \
  --modes "$MODES" --timeline-modes "full+pin:D1=0,multistream_pdl_prologue+pin:D1=0,full+pin:D1=0+cap:D0=96"
h200_pack
