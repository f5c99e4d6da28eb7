#!/bin/bash
# For the next session (written in session 38, not run): engine A/B of GLM5_FASTPATH_MOE_PLAN_ACTIVE at batch 8 / 16
# (where the plan's task phase is longest), on the machine next1 staged part aa on; then, if the budget allows, stock
# against ours in one call (RUNS="stock:MODE=stock ours" BS=1,8,16).
#   C=<commit> RUNS="base pa:GLM5_FASTPATH_MOE_PLAN_ACTIVE=1" bash this    (the first engine starts cold, ~290-360 s)
#   C=<commit> RUNS="pa2:GLM5_FASTPATH_MOE_PLAN_ACTIVE=1 base2 pa3:GLM5_FASTPATH_MOE_PLAN_ACTIVE=1" bash this
# then: glm5-fastpath bench compare-runs base=build/h200-offline-base,build/h200-offline-base2 pa=...,...
# (carry .carry/h200site.part.ab .carry/jit_s39.tar.xz)
export JIT_CACHE=.carry/jit_s39.tar.xz C=${C:?C=<commit>} BS=${BS:-8,16} CALLS=${CALLS:-3}
RUNS=${RUNS:?RUNS=...} timeout ${T:-570} bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh \
  | grep -E "^\||rc="
cd build && find h200-offline-* -type f \( -name '*.json' -o -name '*.md' -o -name '*.log' -o -name '*.txt' \) \
  -size -4M | tar -czf "$OUT/ab.tgz" -T -
