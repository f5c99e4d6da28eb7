#!/bin/bash
# Session 30 call 3 (issue #9): glm5_fastpath without the prefill MoE route (GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0:
# session 29's stack; first, so it absorbs the cold caches) and with it (the default), each merged with c2's stock run
# (carried as build/stock_c2/mode-stock.json when this runs on another machine; same machine: build/h200-offline).
# run: C=<commit> bash this   (carry .carry/jit_s30.tar.xz [build/stock_c2]; the site from c1 + c2 on this machine)
set -uo pipefail
[ -s build/h200site.tar.xz ] || { cp .carry/h200site.part.a[b-z] build/h200parts/ 2>/dev/null; \
  cat build/h200parts/h200site.part.* > build/h200site.tar.xz; }
xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
STOCK=build/stock_c2/mode-stock.json; [ -s "$STOCK" ] || STOCK=build/h200-offline/mode-stock.json
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s30.tar.xz}
export ROUTING_STATS=0
for run in ${RUNS:-noprefill prefill}; do
  export RES=$PWD/build/h200-offline-$run
  if [ -d build/h200-cache/triton ]; then export WORKER_TIMEOUT=${WT2:-260}; else export WORKER_TIMEOUT=${WT1:-420}; fi
  mkdir -p "$RES" && cp "$STOCK" "$RES/"
  unset GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS
  case $run in noprefill*) export GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0 ;; esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-fastpath.txt"
  grep -hE "prefill|FP8 input is the quant|FP8 linear" "$RES/worker-fastpath.log" | grep glm5_fastpath | sort | uniq -c | head -12
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
