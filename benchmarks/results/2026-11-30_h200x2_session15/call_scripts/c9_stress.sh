#!/bin/bash
# Session 15, call 9 (nvidia-h200-x2): two real ranks, 200 back-to-back calls each bitwise against the single-GPU
# kernel, then CUDA-graph replays with new inputs; both combine modes.
# run: C=<commit> bash .../c9_stress.sh (carry .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests stress 300 tests/moe/ep/test_ep_kernel.py -k "stress"
h200_pack
