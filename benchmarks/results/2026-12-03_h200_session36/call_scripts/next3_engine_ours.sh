#!/bin/bash
# For the next session (written in session 36, not run): ours at #9's batch sizes, merged with next2's stock run
# (same RES build/h200-offline-all; the report has both modes, the speedups and the greedy-token comparison).
# run on the machine next2 used: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s36.tar.xz)
export JIT_CACHE=${JIT_CACHE:-.carry/jit_s36.tar.xz} C=${C:?C=<commit>} BS=1,8,16,32,64 CALLS=3
RUNS="all" exec bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh
