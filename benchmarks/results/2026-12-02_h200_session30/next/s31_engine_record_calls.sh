#!/bin/bash
# Prepared for the next session (not run): the engine record at every batch size with 4 timed calls per batch size (the
# single-call batch-1 figure moves by up to 10 % between identical runs; 8 calls gave 451.8-452.1 tok/s in session 30),
# stock then glm5_fastpath on one machine (two calls: MODE=stock, then MODE=fastpath; ~400 s / ~250 s with CALLS=4).
# run: MODE=stock|fastpath C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_sNN.tar.xz after a call that
#      parked part aa, as session 30 c6)
set -uo pipefail
[ -s build/h200site.tar.xz ] || { cp .carry/h200site.part.a[b-z] build/h200parts/ 2>/dev/null; \
  cat build/h200parts/h200site.part.* > build/h200site.tar.xz; }
xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s31.tar.xz}
export RES=$PWD/build/h200-offline-record ROUTING_STATS=0 CALLS=${CALLS:-4} WORKER_TIMEOUT=${WORKER_TIMEOUT:-420}
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz "${MODE:?MODE=stock|fastpath}"; echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING|CALLS)' | sort > "$RES/env-$MODE.txt"
cd build && find h200-offline-record -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
