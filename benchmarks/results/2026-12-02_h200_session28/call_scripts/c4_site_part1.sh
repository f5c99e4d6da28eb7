#!/bin/bash
# Session 28 call 4 (issue #9; c1 again on a fresh machine, for c5): the tracked tree (~34 MiB) + the engine site (~25 MB xz) + the JIT cache do not fit one
# call's 64 MiB carry together with the stock site, so the site's first part is parked in build/h200parts/ (ignored, kept
# on the machine while it stays held) and c2 brings the rest. Meanwhile: the fused router + MegaMoE plan's GPU tests
# (tests/moe/test_routed.py, bitwise against the separate kernels; first run in session 27 c1, results not kept).
# run: C=<commit> bash this   (carry .carry/h200site.part.aa .carry/jit_s28.tar.xz;
#                              split -b 19200000 .carry/h200site.tar.xz .carry/h200site.part.)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts
source scripts/h200_lib.sh
DEADLINE=200
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s28.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=40 run_tests routed 150 tests/moe/test_routed.py
h200_pack
