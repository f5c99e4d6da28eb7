#!/bin/bash
# For the next session (written in session 37, not run): engine A/B of the session-37 opt-in routes at batch 1 / 8, three
# timed calls each, on the machine next1 staged part aa on. RUNS is session 35's c_engine_ab.sh format. Two calls:
#   C=<commit> RUNS="base qcat:GLM5_FASTPATH_QCAT=1" bash this                      (the first engine starts cold, ~290 s)
#   C=<commit> RUNS="warm:GLM5_FASTPATH_MOE_WARM_CODE=1 both:GLM5_FASTPATH_QCAT=1,GLM5_FASTPATH_MOE_WARM_CODE=1 base2" bash this
# then: glm5-fastpath bench compare-runs base=build/h200-offline-base,build/h200-offline-base2 qcat=... warm=... both=...
# The worker log says "DSA decode q / KV store -> ours" when the q_cat route took a call.
# (carry .carry/h200site.part.ab .carry/jit_s38.tar.xz)
export JIT_CACHE=.carry/jit_s38.tar.xz C=${C:?C=<commit>} BS=${BS:-1,8} CALLS=${CALLS:-3}
RUNS=${RUNS:?RUNS=...} timeout ${T:-570} bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh \
  | grep -E "^\||rc=|DSA decode q"
for r in build/h200-offline-*; do grep -hE "DSA decode q|raised|Traceback" "$r/worker-fastpath.log" 2>/dev/null \
  | sort | uniq -c | head -6; done
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
  -size -4M | tar -czf "$OUT/ab.tgz" -T -
