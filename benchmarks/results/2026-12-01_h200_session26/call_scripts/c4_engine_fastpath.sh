#!/bin/bash
# Session 26 call 4 (issue #9; session 25 c5 + torch-profiler breakdowns of 5 decode steps at batch 1 and 8): glm5_fastpath in the same engine on the same warm machine as c3 (site in /tmp/site, c3's
# mode-stock.json in build/h200-offline merged into the report): benchmarks/tables/h200_engine_session16.json, the
# sparse-MLA route with the wgmma tile from 2 tokens and up to 32 tokens (the defaults at this commit).
# run: C=<commit> bash this   (carry the JIT cache: .carry/jit_s26.tar.xz, or JIT=<path>; c10-c12 reran c3-c5 at 90c9f21 with JIT=.carry/jit_s25c.tar.xz)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s26.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-540} PROFILE_STEPS=${PROFILE_STEPS:-5} PROFILE_BS=${PROFILE_BS:-1,8}
[ -f "$RES/mode-stock.json" ] || echo "warning: no mode-stock.json from c4 on this machine"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC)' | sort > "$RES/env-fastpath.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
