#!/bin/bash
# Session 25 call 8: the wgmma tile merging the splits inside 2-8-CTA clusters (DSMEM; WGMMA_CLUSTER=auto): the whole sparse-MLA GPU file,
# the phases (both combines timed apart) and bench sparse-mla (mma, wgmma, FlashMLA).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s25c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s25c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests cluster 90 tests/ops/test_sparse_mla.py -k "cluster or wgmma_matches" -x
step phases 60 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases"
step bench 90 python3 -m glm5_fastpath.cli bench sparse-mla --out "$H200_OUT/sparse_mla" --tokens 1,2,4,8,16,32,64 \
  --kernels mma,wgmma --replays 30
run_tests all 150 tests/ops/test_sparse_mla.py
h200_pack
