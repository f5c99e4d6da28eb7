#!/bin/bash
# Session 30 call 8 (issue #9): on c7's machine, glm5_fastpath at batch 1 and 8 with 8 timed calls per batch size, without
# the prefill MoE route (GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0) and with it (the default), each merged with c7's stock.
# run: C=<commit> bash this   (carry .carry/jit_s30.tar.xz)
set -uo pipefail
xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s30.tar.xz}
export ROUTING_STATS=0 BS=1,8 CALLS=8 WORKER_TIMEOUT=${WORKER_TIMEOUT:-240}
for run in ${RUNS:-noprefill prefill}; do
  export RES=$PWD/build/h200-offline-calls-$run
  mkdir -p "$RES" && cp build/h200-offline-calls/mode-stock.json "$RES/"
  unset GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS
  case $run in noprefill*) export GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0 ;; esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|BS|CALLS)' | sort > "$RES/env-fastpath.txt"
done
cd build && find h200-offline-calls-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
