#!/bin/bash
# For the next session (written in session 35, not run): does the W8 V-up route pay at batch 8 / 16? Session 35's c2
# saw 5.17 against 5.20 ms at batch 8 and 7.99 against 7.94 at 16 in one run each (within the spread); the op chain
# says W8 is 1-7 us per layer faster at 2-16 tokens and 1.7 us slower at 1. Four engines, alternating (A B A B), three
# timed calls per batch size: defaults against W8 from 2 tokens up to 16 (bf16 at 1 token:
# GLM5_FASTPATH_V_UP_W8_MIN_TOKENS=2). Host timing on in all four (the same overhead in each).
# run on a machine that holds the site (after next1 / next2): C=<commit> bash this   (carry .carry/h200site.part.ab
# .carry/jit_s35.tar.xz)
export C=${C:?C=<commit>} BS=${BS:-8,16} CALLS=3 HOST_TIMING=1
W8=GLM5_FASTPATH_V_UP_W8=1,GLM5_FASTPATH_V_UP_MAX_TOKENS=16,GLM5_FASTPATH_V_UP_W8_MIN_TOKENS=2
# then: glm5-fastpath bench compare-runs base=build/h200-offline-base_a,build/h200-offline-base_b \
#         w8=build/h200-offline-w8_a,build/h200-offline-w8_b   (on the returned results)
RUNS="base_a w8_a:$W8 base_b w8_b:$W8" exec bash "$(dirname "$0")/c_engine_ab.sh"
