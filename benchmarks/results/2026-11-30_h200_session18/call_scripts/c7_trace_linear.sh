#!/bin/bash
# Session 18 call 7. (1) Issue #5: one traced megakernel step of the supported subgraph A0+B0+B1+D1+D2+E1 at
# 1 and 16 tokens (KV 8192): where the 139 us at M = 16 go (critical path, hidden ops; Chrome trace JSON).
# (2) Issue #9: calls 3 / 4 showed the FP8-linear route (o_proj + dense down on our act quant + skinny GEMM)
# 350 us per step SLOWER in the engine at batch 1, although session 10 measured it 1.23x faster per kernel at
# M = 1; `bench fp8-linear` re-times both per kernel in this run.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step trace 120 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16 --launches 5 --replays 5 --trace "$H200_OUT/trace"
step linear 200 python3 -m glm5_fastpath.cli bench fp8-linear --out "$H200_OUT/fp8_linear" --ms 1,8,16 --shapes o_proj,dense_down
h200_pack
