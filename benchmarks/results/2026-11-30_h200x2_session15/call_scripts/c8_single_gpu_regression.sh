#!/bin/bash
# Session 15, call 8 (nvidia-h200): the single-GPU MegaMoE GPU test file after this session's kernel changes (Params grew
# by the EP block; the non-EP persistent kernels' SASS is byte-identical, the plan kernels differ by a few reordered
# instructions), plus the EP simulated-rank tests on this machine.
# run: C=<commit> bash .../c8_single_gpu_regression.sh (carry .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
DEADLINE=590
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests megamoe 420 tests/moe/test_megamoe.py
run_tests ep_sim 100 tests/moe/ep/test_ep_kernel.py -k "sim"
h200_pack
