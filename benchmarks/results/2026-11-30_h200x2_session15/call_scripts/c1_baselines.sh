#!/bin/bash
# Session 15, call 1 (nvidia-h200-x2): the EP foundation on real GPUs: NVLink topology, symmetric memory smoke,
# tests/moe/ep on the GPU machine, and the EP2 baselines (staged NCCL pipeline, DeepGEMM fp8_mega_moe).
# run: C=<commit> bash benchmarks/results/2026-11-30_h200x2_session15/call_scripts/c1_baselines.sh (carry .carry/dgsite.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/empty.tar.xz; export GLM5_FASTPATH_COMMIT=$C
nvidia-smi topo -m > $H200_OUT/topo.txt 2>&1; nvidia-smi nvlink -s > $H200_OUT/nvlink.txt 2>&1
step symm 90 python3 benchmarks/results/2026-11-30_h200x2_session15/call_scripts/symm_smoke.py
step ep_tests 120 python3 -m pytest -q -p no:cacheprovider tests/moe/ep
step ep2_base 300 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls staged,deepgemm --tokens 1,8,64,256,1024 --out $H200_OUT/ep2_base
h200_pack
