#!/bin/bash
# For the next session (written in session 36, not run): #9's batch sizes with the session-36 defaults (DSA metadata
# route on), stock first (this call), then ours (next3_engine_ours.sh, same machine: its run merges both modes into one
# report with the speedups and the greedy-token comparison). Three timed calls per batch size.
# run right after next1: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s36.tar.xz)
export JIT_CACHE=${JIT_CACHE:-.carry/jit_s36.tar.xz} C=${C:?C=<commit>} BS=1,8,16,32,64 CALLS=3
RUNS="all:MODE=stock" exec bash benchmarks/results/2026-12-03_h200_session35/call_scripts/c_engine_ab.sh
