#!/bin/bash
# Session 30 call 7 (issue #9): the stock engine at batch 1 and 8 with 8 timed calls per batch size (CALLS=8: a single
# batch-1 call moves by up to 10 % between identical runs, session 29), the baseline of c8.
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s30.tar.xz)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (c6 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s30.tar.xz}
export RES=$PWD/build/h200-offline-calls WORKER_TIMEOUT=${WORKER_TIMEOUT:-420} ROUTING_STATS=0 BS=1,8 CALLS=8
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz stock
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|BS|CALLS)' | sort > "$RES/env-stock.txt"
cd build && find h200-offline-calls -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
