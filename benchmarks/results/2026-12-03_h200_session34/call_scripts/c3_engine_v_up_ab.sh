#!/bin/bash
# Session 34 call 3 (issue #9): the engine A/B of the V-up route: glm5_fastpath with GLM5_FASTPATH_V_UP=0 (session 29's
# stack; first, so it absorbs the fresh machine's cold caches) then with the route (default), same machine, same prompts.
# Batch 1 / 8 / 16 / 32 (BS), 256 output tokens, realistic dummy weights, random routers, no routing-stats capturer.
# The site comes in two parts: c2 left part aa in build/h200parts/ (same machine, called right after), this call brings ab.
# Before the engines: the V-up route's GPU test (needs the site on the path).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s33b.tar.xz)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
cp .carry/h200site.part.ab build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (c2 not on this machine?)"; exit 3; }
mkdir -p /tmp/site && tar -xJf build/h200site.tar.xz -C /tmp/site
mkdir -p "$OUT/x/tests"
PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider \
  tests/integrations/sglang/test_v_up_route.py > build/h200-offline-route-test.log 2>&1; echo "route test rc=$?"
mkdir -p build/h200-offline-tests && mv build/h200-offline-route-test.log build/h200-offline-tests/
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=.carry/jit_s33b.tar.xz
export ROUTING_STATS=0 BS=${BS:-1,8,16,32}
for run in ${RUNS:-vup_off vup_on}; do
  export RES=$PWD/build/h200-offline-$run
  # the first engine on a fresh machine starts in ~175 s (cold DeepGEMM / Triton caches), later ones in ~40 s
  if [ -d build/h200-cache/triton ]; then export WORKER_TIMEOUT=${WT2:-200}; else export WORKER_TIMEOUT=${WT1:-400}; fi
  mkdir -p "$RES"
  unset GLM5_FASTPATH_V_UP
  case $run in vup_off*) export GLM5_FASTPATH_V_UP=0 ;; esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|BS)' | sort > "$RES/env-fastpath.txt"
  grep -hE "V up-projection|act quant taken|FP8 linear|sparse MLA ->" "$RES/worker-fastpath.log" | sort | uniq -c | head -12
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
