#!/bin/bash
# Session 18 call 8 (issue #5): call 7's trace showed one megakernel E1 window (8 pages, 67 KB) taking 6.7-8.7 us
# on its CTA with a 4-page ring (latency-bound: two DRAM round trips in series). kE1Stages = 8 puts the whole
# window in flight. The megakernel GPU tests, then the bench + trace at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=330
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 120 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
