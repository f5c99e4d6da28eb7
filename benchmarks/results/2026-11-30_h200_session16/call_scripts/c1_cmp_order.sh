#!/bin/bash
# Session 16, call 1 (nvidia-h200): CMP ordering edges and grid caps (attn_pre/cmp/modes.py composites).
# GPU tests of the composite modes (bitwise = serial), then bench prefix at M = 16, 1, 64 with the candidates
# against full / multistream_pdl_prologue and the stock graph (stocksite: DeepGEMM + sgl_kernel, its fused top-k as stock E2).
# run: C=<commit> bash .../c1_cmp_order.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=585
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests composite 170 tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "composite"
MODES="full,multistream_pdl_prologue,full+after:D1>D0,multistream_pdl_prologue+after:D1>D0,full+cap:D0=64,full+cap:D0=32,full+after:D1>D0+prio:B1/E1/E2,full+after:D1>D0+cap:D0=96"
step prefix 380 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 16,1,64 \
  --modes "$MODES" --timeline-modes "full,full+after:D1>D0,full+cap:D0=64"
h200_pack
