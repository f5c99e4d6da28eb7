#!/bin/bash
# Session 35 (issue #9): engine A/B of route settings, same machine, same prompts (generalises session 34's c3).
# RUNS is a space-separated list of NAME[:VAR=VAL[,VAR=VAL...]]; each run starts from this environment plus its settings
# (MODE=stock runs the stock engine, default fastpath; LAYERS=2,MODEL=$PWD/build/glm5-2l-dummy a 2-layer model).
# Batch sizes BS (default 1,8,16), 256 output tokens, realistic dummy weights, random routers, no routing-stats capturer.
# The site comes in two parts: a call right before (same machine) left part aa in build/h200parts/, this call brings ab.
# run: C=<commit> RUNS="a b:GLM5_FASTPATH_V_UP_W8=1" bash this   (carry .carry/h200site.part.ab and the JIT seed JIT_CACHE,
# default .carry/jit_s35.tar.xz; session 35's calls c2-c5 ran with .carry/jit_s33b.tar.xz)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
cp .carry/h200site.part.ab build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (part aa not on this machine?)"; exit 3; }
mkdir -p /tmp/site && tar -xJf build/h200site.tar.xz -C /tmp/site
mkdir -p "$OUT/x/tests" build/h200-offline-tests
if [ -n "${ROUTE_TEST:-}" ]; then
  PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider $ROUTE_TEST \
    > build/h200-offline-tests/route-test.log 2>&1; echo "route test rc=$?"; tail -3 build/h200-offline-tests/route-test.log
fi
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT_CACHE:-.carry/jit_s35.tar.xz}
export ROUTING_STATS=0 BS=${BS:-1,8,16}
for spec in ${RUNS:?RUNS=...}; do
  run=${spec%%:*}; sets=; [ "$spec" != "$run" ] && sets=${spec#*:}
  export RES=$PWD/build/h200-offline-$run
  # the first engine on a fresh machine starts in ~175 s (cold DeepGEMM / Triton caches), later ones in ~40 s
  if [ -d build/h200-cache/triton ]; then export WORKER_TIMEOUT=${WT2:-200}; else export WORKER_TIMEOUT=${WT1:-400}; fi
  mkdir -p "$RES"
  (
    IFS=, ; for kv in $sets; do export "$kv"; done; unset IFS
    OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz "${MODE:-fastpath}"; echo "engine $run rc=$?"
    env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|BS)' | sort > "$RES/env-${MODE:-fastpath}.txt"
  )
  grep -hE "V up-projection|act quant taken|FP8 linear|sparse MLA ->|DSA decode metadata" "$RES/worker-fastpath.log" 2>/dev/null | sort | uniq -c | head -16
  grep -hE "^\| [0-9]+ \|" "$RES/offline.md" 2>/dev/null
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' -o -name '*.jsonl' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
