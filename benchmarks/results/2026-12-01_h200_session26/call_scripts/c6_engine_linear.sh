#!/bin/bash
# Session 26 call 6 (issue #9): why the FP8-linear route (o_proj / dense down on our act quant + skinny GEMM,
# GLM5_FASTPATH_FP8_LINEAR=1) made the engine step ~350 us slower at batch 1 in session 18 although the kernel is
# faster alone (tuned table: o_proj 28.2-28.8 us at 1-16 tokens against DeepGEMM's ~34 in the c4 profile).
# glm5_fastpath only, batch 1 / 8, the route on, torch-profiler breakdowns at both; compare with c4 (same commit
# family, route off).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/h200site.part.ac .carry/jit_s26.tar.xz; c5 first)
set -uo pipefail
cp .carry/h200site.part.ab .carry/h200site.part.ac build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && ls -la build/h200site.tar.xz || { echo "site parts missing (c5 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s26.tar.xz}
export GLM5_FASTPATH_FP8_LINEAR=1 GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS=64 BS=1,8
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-400} PROFILE_STEPS=5 PROFILE_BS=1,8
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath
echo "engine rc=$?"
grep -h -i "fp8 linear" "$RES"/worker-fastpath.log | head -20
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC)' | sort > "$RES/env-fastpath.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
