#!/bin/bash
# Session 20 call 2 (issue #5): B1 partials warm the finish epilogue (dry run) during their event wait; megakernel
# GPU tests, then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=260
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 90 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
