#!/bin/bash
# Session 31 call 3 (issue #9): glm5_fastpath at the default chain (first, so it absorbs the cold caches) and with the
# shared expert during the routing (GLM5_FASTPATH_MOE_OVERLAP=1), each merged with c2's stock run on this machine.
# run: C=<commit> bash this   (carry .carry/jit_s31.tar.xz; the site and c2's stock result from c2 on this machine)
set -uo pipefail
xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
STOCK=build/h200-offline/mode-stock.json
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s31.tar.xz}
export ROUTING_STATS=0 CALLS=${CALLS:-1}
for run in ${RUNS:-default overlap}; do
  export RES=$PWD/build/h200-offline-$run
  if [ -d build/h200-cache/triton ]; then export WORKER_TIMEOUT=${WT2:-260}; else export WORKER_TIMEOUT=${WT1:-420}; fi
  mkdir -p "$RES" && cp "$STOCK" "$RES/"
  unset GLM5_FASTPATH_MOE_OVERLAP
  case $run in overlap*) export GLM5_FASTPATH_MOE_OVERLAP=1 ;; esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|CALLS)' | sort > "$RES/env-fastpath.txt"
  grep -hE "shared expert during|overlap|FP8 input is the quant" "$RES/worker-fastpath.log" | grep glm5_fastpath | sort | uniq -c | head -12
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
