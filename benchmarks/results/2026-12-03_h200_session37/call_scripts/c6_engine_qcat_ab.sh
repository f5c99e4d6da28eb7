#!/bin/bash
# Session 37 c6: the q_cat route in the engine, A B at batch 1 / 8 (three timed calls each): base = the defaults,
# qcat = GLM5_FASTPATH_QCAT=1 (no concat_mla_absorb_q / set_mla_kv_buffer per layer). The worker log says
# "DSA decode q / KV store -> ours" when the route took a call. Same machine as c5 (part aa staged there).
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s37.tar.xz)
export JIT_CACHE=.carry/jit_s37.tar.xz C=${C:?C=<commit>} BS=${BS:-1,8} CALLS=${CALLS:-3}
RUNS=${RUNS:-"base qcat:GLM5_FASTPATH_QCAT=1"} timeout ${T:-500} \
  bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh
for r in build/h200-offline-*; do grep -hE "DSA decode q|raised|Traceback|Error" "$r/worker-fastpath.log" 2>/dev/null \
  | sort | uniq -c | head -8; done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
  -size -4M | tar -czf "$OUT/ab.tgz" -T -
