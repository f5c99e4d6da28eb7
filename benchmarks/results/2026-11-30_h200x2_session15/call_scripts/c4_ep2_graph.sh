#!/bin/bash
# Session 15, call 4 (nvidia-h200-x2): EP2 bench with CUDA-graph timing (ours and DeepGEMM) and the fixed floor; small
# counts also with the split-K builds (bn16 / bn8, split waves 4).
# run: C=<commit> bash .../c4_ep2_graph.sh (carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step ep2 300 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm --ep-iters 20 --tokens 1,8,16,32,64,128,256,512,1024,2048,4096 --out $H200_OUT/ep2
step ep2_b16w4 90 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours --ep-iters 20 --ep-config bn16_s6_g512_w4_lf_p --tokens 1,8,16,32 --out $H200_OUT/ep2_b16w4
step ep2_b8w4 90 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours --ep-iters 20 --ep-config bn8_s6_g512_w4_lf_p --tokens 1,8 --out $H200_OUT/ep2_b8w4
for f in $H200_OUT/ep2*/megamoe_ep_bench.md; do echo "== $f"; grep "^| [0-9]" $f | awk -F'|' '{print $2,$3,$4,$5,$6,$8,$9,$10,$15,$16,$18}'; done
h200_pack
