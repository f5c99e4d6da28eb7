#!/bin/bash
# Session 15, call 2 (nvidia-h200-x2): first run of the in-kernel EP MegaMoE. Simulated ranks on one GPU first (the
# whole protocol on one device, most diagnostic), then real ranks on the two GPUs.
# run: C=<commit> bash .../c2_ep_first.sh (carry .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests sim1 120 tests/moe/ep/test_ep_kernel.py -x -k "sim_ranks and tokens0 and bn64_s5_g512_w0_lf_p_t"
run_tests sim 200 tests/moe/ep/test_ep_kernel.py -x -k "sim"
run_tests two 200 tests/moe/ep/test_ep_kernel.py -k "two_ranks"
h200_pack
