#!/bin/bash
# Session 15, call 3 (nvidia-h200-x2): EP2 benchmark, ours (in-kernel EP MegaMoE, default_ep_config per count) vs
# DeepGEMM fp8_mega_moe on the same 2-rank group vs the staged NCCL pipeline; slowest rank; routed experts only.
# run: C=<commit> bash .../c3_ep2_bench.sh (carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step ep2 420 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm,staged --ep-iters 30 --tokens 1,8,16,32,64,128,256,512,1024,2048,4096 --out $H200_OUT/ep2
step ep2_b16 120 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours --ep-iters 30 --ep-config bn16_s6_g512_w4_lf_p --tokens 1,8,16,32 --out $H200_OUT/ep2_b16
h200_pack
