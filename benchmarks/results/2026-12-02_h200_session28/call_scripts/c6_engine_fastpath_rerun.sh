#!/bin/bash
# Session 28 call 6 (issue #9): c5's first run stopped at its 300 s worker timeout after batch 1 (a fresh machine: the
# engine's start-up took 173 s with cold DeepGEMM / Triton caches, 37 s warm), so the same fastpath run again on the
# same warm machine, without the profiler (ROUTING_STATS=0, merged with c2's stock run that c5 copied into the results
# dir). The inline command of the call, kept as a script:
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>} FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json REALISTIC_DUMMY=1 \
  JIT_CACHE=.carry/jit_s28.tar.xz RES=$PWD/build/h200-offline WORKER_TIMEOUT=400 ROUTING_STATS=0
rm -f build/h200-offline/mode-fastpath.json
mkdir -p build/prev && cp -r build/h200-offline/profile-fastpath-b1 build/h200-offline/worker-fastpath.log build/prev/ 2>/dev/null
OUT=$OUT/x scripts/h200_sglang_offline.sh build/h200site.tar.xz fastpath; echo "engine rc=$?"
cd build && find h200-offline prev -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) -size -4M \
  | tar -czf "$OUT/r.tgz" -T -
