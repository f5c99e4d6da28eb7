#!/bin/bash
# Prepared in session 25 (issue #9), not run: the FIRST GPU run of the ping-pong sparse-MLA tile (tile="wgmma_pp",
# SparseMlaSplitPingPongTile: written and compiled in session 25, no GPU time left). Its GPU tests first (-x: a hang
# shows as the faulthandler's stack dump after TEST_HANG_S; the mbarrier waits trap after ~9 s instead of hanging),
# then the phases and bench sparse-mla with all three tiles + FlashMLA, then the whole sparse-MLA GPU file.
# If the tests pass and it is faster from 2 tokens: make it the auto choice (ops.sparse_mla.resolve_kernel) and
# re-plan its splits (fewer, longer splits should pay now: --split-kernel wgmma_pp --splits 4,8,16,32).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s25e.tar.xz)
source scripts/h200_lib.sh
DEADLINE=500
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s25e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=30 run_tests pp 120 tests/ops/test_sparse_mla.py -k "pp_" -x
step phases 60 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases" --tiles wgmma,wgmma_pp
step bench 150 python3 -m glm5_fastpath.cli bench sparse-mla --out "$H200_OUT/sparse_mla" --tokens 1,2,4,8,16,32,64 \
  --kernels mma,wgmma,wgmma_pp --split-kernel wgmma_pp --splits 4,8,16,32 --replays 30
run_tests all 150 tests/ops/test_sparse_mla.py
h200_pack
