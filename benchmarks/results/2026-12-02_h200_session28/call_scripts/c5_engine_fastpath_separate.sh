#!/bin/bash
# Session 28 call 5 (issue #9): glm5_fastpath in the engine at the default MoE chain again (the fused router + plan
# measured slower in c3 and went opt-in: router -> act quant -> plan -> MegaMoE), ROUTING_STATS=0, merged with c2's
# stock run (its mode-stock.json is committed in c2_98f7ece_stock/ and copied into the results dir: a fresh machine
# after c3), profiled at batch 1 / 8. Then a second fastpath run WITH the routed-experts capturer (ROUTING_STATS=1, its
# own results dir: a different run key) for the distinct experts per MoE layer.
# run: C=<commit> bash this   (c4 first on the same machine; carry .carry/h200site.part.ab .carry/jit_s28.tar.xz)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (c4 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s28.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-300} PROFILE_STEPS=5 PROFILE_BS=1,8 ROUTING_STATS=0
mkdir -p "$RES" && cp benchmarks/results/2026-12-02_h200_session28/c2_98f7ece_stock/mode-stock.json "$RES/"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC|ROUTING)' | sort > "$RES/env-fastpath.txt"
export RES=$PWD/build/h200-offline-rs ROUTING_STATS=1 PROFILE_STEPS=0 PROFILE_BS=
mkdir -p "$RES"
OUT=$OUT/y scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath
echo "engine (routing stats) rc=$?"
cd build && find h200-offline h200-offline-rs -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
