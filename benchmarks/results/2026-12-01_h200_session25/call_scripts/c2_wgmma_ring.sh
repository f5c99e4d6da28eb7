#!/bin/bash
# Session 25 call 2: the wgmma tile after c1 (op argument `tile` for torch.compile, auto = wgmma from 2 tokens, warp-skipped
# O rescale, 2 blocks per split minimum) and its 4-stage ring build (partial-S exchange inside the ring): GPU tests of both
# builds, the whole sparse-MLA file, the route's CPU tests, then bench sparse-mla for both builds against mma + FlashMLA.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=570
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests wgmma 170 tests/ops/test_sparse_mla.py -k wgmma -x
step bench3 120 python3 -m glm5_fastpath.cli bench sparse-mla --out "$H200_OUT/sparse_mla_w3" --tokens 1,2,4,8,16,32,64 \
  --kernels mma,wgmma --replays 30
GLM5_FASTPATH_SPARSE_MLA_WGMMA_STAGES=4 step bench4 120 python3 -m glm5_fastpath.cli bench sparse-mla \
  --out "$H200_OUT/sparse_mla_w4" --tokens 1,2,4,8,16,32,64 --kernels wgmma --replays 30
run_tests all 150 tests/ops/test_sparse_mla.py
h200_pack
