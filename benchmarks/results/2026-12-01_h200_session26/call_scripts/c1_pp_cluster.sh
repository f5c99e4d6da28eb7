#!/bin/bash
# Session 26 call 1 (issue #9): the first GPU run of the ping-pong sparse-MLA tile (tile="wgmma_pp", session 25's
# next/c2) and the wgmma tile's batched-DSMEM cluster merge (session 25's next/c1), in one call.
# Tests first (-x; a hang dumps stacks after TEST_HANG_S), then phases (split / combine timed apart) and the op bench
# with all tiles + FlashMLA, then the whole sparse-MLA GPU file.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s26.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s26.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=30 run_tests pp 100 tests/ops/test_sparse_mla.py -k "pp_" -x
step phases 60 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases" --tiles wgmma,wgmma_pp
step bench 130 python3 -m glm5_fastpath.cli bench sparse-mla --out "$H200_OUT/sparse_mla" --tokens 1,2,4,8,16,32,64 \
  --kernels mma,wgmma,wgmma_pp --split-kernel wgmma_pp --splits 4,8,16,32 --replays 30
run_tests cluster 60 tests/ops/test_sparse_mla.py -k "cluster or wgmma_matches" -x
for c in 8 2; do
  step phases_c$c 40 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases_c$c" --max-cluster $c --tiles wgmma \
    --cluster-mode auto
done
run_tests all 120 tests/ops/test_sparse_mla.py
h200_pack
