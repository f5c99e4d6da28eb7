#!/bin/bash
# For the next session (written in session 36, not run): (1) a profile of the defaults at batch 1 / 8 (5 decode steps):
# now that batch 1 is GPU-paced, trace_breakdown's step timeline (profile-fastpath-b1/breakdown_timeline.md) shows
# each kernel of one step with its exposed time and the idle gap before it; (2) the opt-in schedule skip
# (GLM5_FASTPATH_DSA_METADATA_SCHEDULE=skip) A B A B with host timing at batch 1 / 8: its host time per step (the
# DSA init_forward_metadata_out_graph probe) and ITL. The worker log says "schedule not refreshed" when it skipped.
# run on the machine next2 used: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s36.tar.xz)
export JIT_CACHE=${JIT_CACHE:-.carry/jit_s36.tar.xz} C=${C:?C=<commit>} BS=1,8 CALLS=3
SK=GLM5_FASTPATH_DSA_METADATA_SCHEDULE=skip,HOST_TIMING=1
RUNS="prof:PROFILE_STEPS=5,CALLS=1 rf_a:HOST_TIMING=1 sk_a:$SK rf_b:HOST_TIMING=1 sk_b:$SK" \
  bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh
# the profile's traces too (~100 KB each: trace_breakdown can re-cut them later, e.g. with another --layer-marker)
(cd build && find h200-offline-prof -name '*.trace.json.gz' | tar -czf "$OUT/traces.tgz" -T -)
# then: glm5-fastpath bench compare-runs refresh=build/h200-offline-rf_a,build/h200-offline-rf_b \
#         skip=build/h200-offline-sk_a,build/h200-offline-sk_b
