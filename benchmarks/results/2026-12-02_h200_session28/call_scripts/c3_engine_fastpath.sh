#!/bin/bash
# Session 28 call 3 (issue #9; session 26 c4 with ROUTING_STATS=0 and the fused router + MegaMoE plan, the MoE
# executor's default since 8de215a): glm5_fastpath in the same engine on the same warm machine as c2 (site in
# /tmp/site, c2's mode-stock.json in build/h200-offline merged into the report), torch-profiler breakdowns of 5 decode
# steps at batch 1 and 8. Then `bench moe-layer` (fused vs separate kernels vs SGLang's router + quant + DeepGEMM
# fp8_mega_moe, from the same site).
# run: C=<commit> bash this   (carry the JIT cache: .carry/jit_s28.tar.xz, or JIT=<path>)
set -uo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s28.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-480} PROFILE_STEPS=${PROFILE_STEPS:-5} PROFILE_BS=${PROFILE_BS:-1,8}
export ROUTING_STATS=0
[ -f "$RES/mode-stock.json" ] || echo "warning: no mode-stock.json from c2 on this machine"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-fastpath.txt"
export PYTHONPATH=/tmp/site:$PWD GLM5_FASTPATH_CACHE_DIR=$PWD/build/h200-cache/glm5
mkdir -p "$RES/moe_layer"
timeout 150 python3 -m glm5_fastpath.cli bench moe-layer --out "$RES/moe_layer" --tokens 1,2,4,8,16,32 --replays 30 \
  --rounds 3 > "$RES/moe_layer/run.log" 2>&1; echo "moe-layer rc=$?"; tail -3 "$RES/moe_layer/run.log"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
