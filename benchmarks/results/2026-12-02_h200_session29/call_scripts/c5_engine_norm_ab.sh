#!/bin/bash
# Session 29 call 5 (issue #9): reassemble the site (c4's part + this call's), then glm5_fastpath without the norm route
# (GLM5_FASTPATH_NORM=sglang, session 28's stack; first, so it absorbs the fresh machine's cold caches) and with it,
# each merged with c2's stock run (build/stock_c2/mode-stock.json, carried: c2 ran on the first machine of this
# session; the stock path runs none of our code).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s29b.tar.xz build/stock_c2)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (c4 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s29b.tar.xz}
export ROUTING_STATS=0
for run in ${RUNS:-nonorm norm}; do
  export RES=$PWD/build/h200-offline-$run
  # the first engine on a fresh machine starts in ~175 s (cold DeepGEMM / Triton caches), later ones in ~40 s
  if [ -d build/h200-cache/triton ]; then export WORKER_TIMEOUT=${WT2:-260}; else export WORKER_TIMEOUT=${WT1:-420}; fi
  mkdir -p "$RES" && cp build/stock_c2/mode-stock.json "$RES/"
  unset GLM5_FASTPATH_NORM GLM5_FASTPATH_FP8_LINEAR GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS
  case $run in
    nonorm*) export GLM5_FASTPATH_NORM=sglang ;;
    linear*) export GLM5_FASTPATH_FP8_LINEAR=1 GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS=16 ;;
  esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-fastpath.txt"
  grep -hE "add \+ RMSNorm|Q0 takes|FP8 input is the quant|FP8 linear" "$RES/worker-fastpath.log" | sort | uniq -c | head -12
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
