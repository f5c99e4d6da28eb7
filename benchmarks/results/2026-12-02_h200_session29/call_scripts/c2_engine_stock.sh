#!/bin/bash
# Session 29 call 2 (issue #9): reassemble the engine site from c1's parked part + this call's, then the stock SGLang
# 0.5.14 engine at batch 1 / 8 / 16 / 32 / 64 (ROUTING_STATS=0: no routed-experts capturer, as session 28).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab [.ac] and .carry/jit_s29.tar.xz)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && ls -la build/h200site.tar.xz && xz -t build/h200site.tar.xz || { echo "site parts missing (c1 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s29.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-540} ROUTING_STATS=0
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz stock
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-stock.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
