#!/bin/bash
# Session 24 c3 (issue #4): (1) L2 residency probe v2 (graph-replayed reads); (2) the l2:OP=F CMP modifier's GPU
# tests; (3) bench prefix with D0 / D1 weights prefetched into L2 at the start of the prefix (line form), same run as
# stock and the plain modes; (4) the bulk form of the same for three modes.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz)
source scripts/h200_lib.sh
DEADLINE=570
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step l2probe 80 python3 benchmarks/l2_residency_probe.py --out "$H200_OUT/l2probe"
run_tests l2mod 70 tests/attn_pre/cmp/test_cmp_l2_prefetch.py
step prefix_line 250 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 --timeline-modes none --replays 30 \
  --out "$H200_OUT/prefix_line" \
  --modes full,full+l2:D0=0.5,full+l2:D0=1,full+l2:D1=1+l2:D0=0.5,multistream_pdl_prologue,multistream_pdl_prologue+l2:D1=1+l2:D0=0.5
step prefix_bulk 140 env GLM5_FASTPATH_CMP_L2_BULK=1 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 \
  --timeline-modes none --replays 30 --no-stock --out "$H200_OUT/prefix_bulk" \
  --modes full,full+l2:D0=0.5,full+l2:D1=1+l2:D0=0.5
h200_pack
