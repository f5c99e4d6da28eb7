#!/bin/bash
# Session 36's six calls on one warm H200 (commit 81048a0), in order. Scripts from session 35's call_scripts/.
# c1 (carry .carry/jit_s35.tar.xz .carry/h200site.part.aa):
#   C=81048a0 bash benchmarks/results/2026-12-03_h200_session35/call_scripts/next1_gpu_tests.sh
# c2 (carry .carry/jit_s35.tar.xz .carry/h200site.part.ab; right after c1, same machine):
#   C=81048a0 bash benchmarks/results/2026-12-03_h200_session35/call_scripts/next2_host_floor.sh
# c3 (same carry as c2):
#   C=81048a0 bash benchmarks/results/2026-12-03_h200_session35/call_scripts/next4_dsa_metadata_ab.sh
# c4: stock, the DSA metadata route, defaults; batch 1 / 8 / 16, three timed calls each
#   export C=81048a0 BS=1,8,16 CALLS=3
#   RUNS="stock:MODE=stock dsa1:GLM5_FASTPATH_DSA_METADATA=1 base1" bash .../session35/call_scripts/c_engine_ab.sh
# c5: RUNS="dsa2:GLM5_FASTPATH_DSA_METADATA=1 base2" (BS=1,8,16 CALLS=3)
# c6: RUNS="base3 dsa3:GLM5_FASTPATH_DSA_METADATA=1" (BS=1 CALLS=3)
# then here: glm5-fastpath bench compare-runs base=<the five base dirs> dsa=<the five dsa dirs> --out compare_runs
