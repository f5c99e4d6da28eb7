#!/bin/bash
# Session 29 call 3 (issue #9): on c2's warm machine (site in /tmp/site, c2's mode-stock.json in build/h200-offline):
#   1. the norm route's GPU test (A0 against sgl_kernel's fused_add_rmsnorm, the kernel SGLang runs) and the CPU tests
#      of the route against this site's real sglang 0.5.14 package;
#   2. glm5_fastpath with the norm route (GLM5_FASTPATH_NORM default: ours)      -> build/h200-offline-norm
#   3. glm5_fastpath without it (GLM5_FASTPATH_NORM=sglang: session 28's stack)   -> build/h200-offline-nonorm
# each merged with c2's stock run (its mode-stock.json copied into both results dirs).
# run: C=<commit> bash this   (carry .carry/jit_s29.tar.xz)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s29.tar.xz}
export WORKER_TIMEOUT=${WORKER_TIMEOUT:-300} ROUTING_STATS=0
STOCK=$PWD/build/h200-offline/mode-stock.json
[ -f "$STOCK" ] || echo "warning: no mode-stock.json from c2 on this machine"
mkdir -p build/norm_tests
(export PYTHONPATH=/tmp/site:$PWD GLM5_FASTPATH_CACHE_DIR=$PWD/build/h200-cache/glm5
 timeout 120 python3 -m pytest -v -rfEs -p no:cacheprovider tests/integrations/sglang/test_norm_route.py \
   > build/norm_tests/pytest.log 2>&1; echo "norm tests rc=$?"; tail -4 build/norm_tests/pytest.log)
for run in ${RUNS:-norm nonorm}; do
  export RES=$PWD/build/h200-offline-$run
  mkdir -p "$RES" && cp "$STOCK" "$RES/" 2>/dev/null
  if [ "$run" = nonorm ]; then export GLM5_FASTPATH_NORM=sglang; else unset GLM5_FASTPATH_NORM; fi
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
  env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-fastpath.txt"
done
cd build && find h200-offline-* norm_tests -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
