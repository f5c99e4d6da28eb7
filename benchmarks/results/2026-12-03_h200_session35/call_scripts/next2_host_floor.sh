#!/bin/bash
# For the next session (written in session 35, not run): the pace of SGLang's host loop at batch 1. The same engines on
# a 2-layer model (1 dense + 1 MoE: ~1/5 of the 8-layer step's GPU work, the same host work per step), stock then
# glm5_fastpath (one merged report, RES h200-offline-l2), then the 8-layer model with glm5_fastpath's defaults for
# reference; batch 1 and 8, three timed calls each. If the 2-layer ITL at batch 1 is near the 8-layer one (~2.0 ms),
# the host paces batch 1. Every run also times SGLang's scheduler loop without a profiler (HOST_TIMING=1:
# bench/host_timing.py; the report's "Host loop" tables: loop period, GPU wait, host busy share, stages). Then a
# profile of the 2-layer fastpath engine (host ranges per step).
# run right after next1_gpu_tests.sh: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s35.tar.xz)
export C=${C:?C=<commit>} BS=1,8 CALLS=3 HOST_TIMING=1
M2=$PWD/build/glm5-2l-dummy
RUNS="l2:MODE=stock,LAYERS=2,MODEL=$M2 l2:LAYERS=2,MODEL=$M2 l8 l2prof:LAYERS=2,MODEL=$M2,PROFILE_STEPS=5,CALLS=1" \
  exec bash "$(dirname "$0")/c_engine_ab.sh"
