#!/bin/bash
# Session 15, call 10 (nvidia-h200): EP8 as 8 simulated ranks on one GPU (small and GLM-5 dims, both combine modes).
# run: C=<commit> bash .../c10_sim_ep8.sh (carry .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests ep8 200 tests/moe/ep/test_ep_kernel.py -k "sim_ep8"
h200_pack
