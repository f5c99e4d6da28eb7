#!/bin/bash
# Session 26 call 3 (issue #9; copy of session 25 c4): reassemble the engine site from c2's part + this call's two, then the stock SGLang 0.5.14
# engine at batch 1 / 8 / 16 / 32 / 64 (session 24's next/c1_engine.sh, MODE=stock).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/h200site.part.ac and the JIT cache: .carry/jit_s26.tar.xz, or JIT=<path>)
set -uo pipefail
cp .carry/h200site.part.ab .carry/h200site.part.ac build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && ls -la build/h200site.tar.xz || { echo "site parts missing (c3 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 JIT_CACHE=${JIT:-.carry/jit_s26.tar.xz}
export RES=$PWD/build/h200-offline WORKER_TIMEOUT=${WORKER_TIMEOUT:-520}
mkdir -p "$RES"
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz stock
echo "engine rc=$?"
env | grep -E '^(GLM5_|FASTPATH_CONFIG|REALISTIC)' | sort > "$RES/env-stock.txt"
cd "$(dirname "$RES")" && find "$(basename "$RES")" -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
