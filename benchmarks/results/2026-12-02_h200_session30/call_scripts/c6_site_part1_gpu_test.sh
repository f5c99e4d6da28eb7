#!/bin/bash
# Session 30 call 6: a fresh machine: park the engine site's first part for c7, and the moe-prefill bench's GPU test
# (MegaMoE at a 200-token prefill chunk, ours only: no site here).
# run: C=<commit> bash this   (carry .carry/h200site.part.aa .carry/jit_s30.tar.xz)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts
source scripts/h200_lib.sh
DEADLINE=200
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s30.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=60 run_tests moe_prefill 120 tests/bench/test_moe_prefill_bench.py
h200_pack
