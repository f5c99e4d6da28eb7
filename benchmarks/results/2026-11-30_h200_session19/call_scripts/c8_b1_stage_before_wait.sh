#!/bin/bash
# Session 19 call 8 (issue #5): call 7 staged B1 / D1's finish inputs in every partial right after the event wait:
# the last arriver's staging fell to ~0.4 us but the partial grew by the same round trip (D1 at 16 tokens 6.7 ->
# 9.7 us). Now B1 stages before its wait (its inputs are step inputs: positions, slots, RoPE rows) and D1 in its
# finish again (its w_raw comes from C0). Megakernel GPU tests, then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
