#!/bin/bash
# Prepared for the next session (not run): why the decode ITL p50 was 0.6-1.0 % higher at batch 1-16 with the prefill MoE
# route on (session 30 c3 / c8, both run orders). Two candidate causes:
#   (1) the route changes the prefill's numerics, so every generated token and the experts decode touches differ;
#   (2) the route grew MegaMoE's workspace from 64 to 4096 tokens (decode launches use only the first rows); since
#       session 30's last commits prefill launches have their own workspace (megamoe.workspace_tag), so with the
#       current code (2) cannot apply: a remaining difference points at (1).
# Runs (batch 1 / 8, 8 calls, same machine; needs the engine site on it: park part aa first, as session 30 c6):
#   off    GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0       (workspace 64 tokens, stock prefill MoE)
#   cap256 GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=256     (workspace 256: batch 1's 128-token prefill routed, batch 8's not)
#   on     GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=16384   (workspace 4096)
# all with ROUTING_STATS=1 (SGLang's routed-experts capturer then runs in every pass of all three, +~0.7 % at batch 8,
# session 28; it gives the distinct experts per layer per step: if `on` touches fewer / more experts
# than `off`, cause (1); if cap256 at batch 8 (same tokens as off, small workspace) matches off and on does not, cause (2)).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_sNN.tar.xz)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ 2>/dev/null; cat build/h200parts/h200site.part.* > build/h200site.tar.xz
xz -t build/h200site.tar.xz || { echo "site missing"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s31.tar.xz}
export BS=1,8 CALLS=8 WORKER_TIMEOUT=${WORKER_TIMEOUT:-420} ROUTING_STATS=${ROUTING_STATS:-1}
for run in off cap256 on; do
  export RES=$PWD/build/h200-offline-$run
  mkdir -p "$RES"
  case $run in off) export GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=0 ;; cap256) export GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=256 ;;
               on) export GLM5_FASTPATH_MOE_PREFILL_MAX_TOKENS=16384 ;; esac
  OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine $run rc=$?"
done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
