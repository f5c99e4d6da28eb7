#!/bin/bash
# Session 19 call 10 (issue #9; prepared in session 18): why is the FP8-linear route (o_proj + dense down on our act
# quant + skinny GEMM) ~350 us per decode step SLOWER in the engine at batch 1 (session 18 c4: ITL 2.56 against
# 2.21 ms), when per kernel it is faster (c7: o_proj 30.7 us, dense down 23.0 us at M = 1, against DeepGEMM's ~33 us
# mean in c3's profile)? Torch-profiler breakdown of 5 decode steps at batch 1 with the route on; compare its
# breakdown.md (per-kernel exposed time, idle gaps) with session 18's c3_a29d54c_fastpath/profile-fastpath-b1/.
# Suspects: our GEMM's cluster launch (2-CTA cluster reduce at M = 1) waiting for free SM pairs while PDL-launched
# neighbours hold SMs; or the route's act quant / GEMM pair breaking SGLang's fusions around o_proj.
# run: C=<commit> bash this   (carry .carry/h200site.tar.xz .carry/jit_s19b.tar.xz; ~6 min on a cold machine)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json
export REALISTIC_DUMMY=1 JIT_CACHE=.carry/jit_s19b.tar.xz BS=1 PROFILE_STEPS=5 PROFILE_BS=1 WORKER_TIMEOUT=520
export GLM5_FASTPATH_FP8_LINEAR=1 GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS=16
export RES=$PWD/build/h200-offline-linear-profile
OUT=$OUT/x scripts/h200_sglang_offline.sh .carry/h200site.tar.xz fastpath
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
