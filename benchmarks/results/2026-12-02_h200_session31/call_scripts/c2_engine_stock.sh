#!/bin/bash
# Session 31 call 2 (issue #9): the stock SGLang 0.5.14 engine at batch 1 / 8 / 16 / 32 / 64 (ROUTING_STATS=0), the
# same-session baseline for c3. The whole site travels in this call (site + JIT + tree < 64 MiB).
# run: C=<commit> bash this   (carry .carry/h200site.tar.xz .carry/jit_s31.tar.xz)
set -uo pipefail
mkdir -p build && cp .carry/h200site.tar.xz build/h200site.tar.xz && xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s31.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-420} ROUTING_STATS=0 CALLS=${CALLS:-1}
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz stock
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|CALLS)' | sort > "$RES/env-stock.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
