#!/bin/bash
# Prepared in session 22, carried to sessions 23 and 24 (issue #9), not run; session 18 calls 2-4 with a refreshed JIT cache: the SGLang 0.5.14 offline engine on the 8-layer GLM-5-shaped dummy model (realistic
# dummy weights, random routers), batch 1 / 8 / 16 / 32 / 64, one engine mode per call on one warm machine (the
# Triton / DeepGEMM / our JIT caches in build/ survive between calls while the machine stays held):
#   C=<commit> MODE=stock    bash this                  call 2 (cold caches)
#   C=<commit> MODE=fastpath bash this                  call 3: benchmarks/tables/h200_engine_session16.json
#   C=<commit> MODE=fastpath LINEAR=16 bash this        call 4: the same + GLM5_FASTPATH_FP8_LINEAR=1 up to 16 tokens
#                                                       (o_proj + dense down on our skinny GEMM; session 10 per kernel)
# Each fastpath run merges with call 2's mode-stock.json (copied into its own results folder). PROFILE=1 adds
# torch-profiler traces of 5 decode steps at batch 1 (exposed time per kernel category).
# Carry: .carry/h200site.tar.xz (38.2 MB since session 22) and the JIT cache (scripts/refresh_jit_cache.py for the commit).
# Since session 22 the fastpath mode runs the standalone prefix GEMMs / D2 evict-first at batch <= 16
# (h200_sglang_offline.sh compiles those variants after seeding the cache).
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json
export REALISTIC_DUMMY=1 JIT_CACHE=${JIT_CACHE:-.carry/jit_s24c.tar.xz}
MODE=${MODE:?MODE=stock|fastpath}
BASE=$PWD/build/h200-offline
if [ -n "${LINEAR:-}" ]; then
  export GLM5_FASTPATH_FP8_LINEAR=1 GLM5_FASTPATH_FP8_LINEAR_MAX_TOKENS=$LINEAR
  export RES=$PWD/build/h200-offline-linear$LINEAR
else
  export RES=$BASE
fi
mkdir -p "$RES"
[ "$RES" != "$BASE" ] && cp "$BASE"/mode-stock.json "$RES"/ 2>/dev/null
if [ "${PROFILE:-0}" = 1 ]; then export PROFILE_STEPS=5 PROFILE_BS=1; fi
export WORKER_TIMEOUT=${WORKER_TIMEOUT:-520}
OUT=$OUT/x scripts/h200_sglang_offline.sh .carry/h200site.tar.xz "$MODE"
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|PROFILE)' | sort > "$RES/env-$MODE${LINEAR:+-linear$LINEAR}.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.png' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
