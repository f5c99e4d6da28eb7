#!/bin/bash
# Prepared for a session that is lent nvidia-h200-x4 or -x8 (NOT run: session 15 had only nvidia-h200 / -x2). Issue #8's
# remaining acceptance: correctness at EP4 (EP8 if lent) on real GPUs and the bench at that EP size against DeepGEMM.
# prepare here: warm the JIT cache for the EP builds (GLM-5 dims: bn8/16/32/64 pool, bn64 token-major pool, each with
#   and without ep=True; small dims 512/128: bn64 token-major pool) into .carry/jit_ep.tar.xz (session 15's /tmp/warm*.py
#   recipe: M.kernel_spec(H, I, bn, stages, lean, pool, 0, tm, ep=...) through jit.compiler.compile_kernel)
# run: C=<commit> bash this   (kind nvidia-h200-x4 or -x8; carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
N=$(nvidia-smi -L | wc -l); [ "$N" -ge 8 ] && N=8
run_tests all 240 tests/moe/ep/test_ep_kernel.py -k "all_ranks"
step ep$N 240 python3 -m glm5_fastpath.cli bench moe --ep $N --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 8 --tokens 1,8,16,32,64,128,256,512,1024 --out $H200_OUT/ep$N
h200_pack
