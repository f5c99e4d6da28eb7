#!/bin/bash
# Session 25 call 1 (issue #9: the decode step's attention core): the 64-head wgmma split tile of sparse_mla_decode.
# GPU tests of the new tile, then `bench sparse-mla` with both tiles + FlashMLA in one run, a split sweep of the wgmma
# tile, then the whole sparse-MLA GPU test file (the mma tile must be unchanged).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz: sgl_kernel.flash_mla for the stock column)
source scripts/h200_lib.sh
DEADLINE=570
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests wgmma 150 tests/ops/test_sparse_mla.py -k wgmma -x
step bench 200 python3 -m glm5_fastpath.cli bench sparse-mla --out "$H200_OUT/sparse_mla" --tokens 1,2,4,8,16,32,64,128 \
  --kernels mma,wgmma --split-kernel wgmma --splits 4,8,16,32,64 --replays 30
run_tests all 200 tests/ops/test_sparse_mla.py
h200_pack
