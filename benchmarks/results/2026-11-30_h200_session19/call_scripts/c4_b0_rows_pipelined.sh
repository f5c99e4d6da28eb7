#!/bin/bash
# Session 19 call 4 (issue #5): call 3's two-level B0 reduce made the tile sums parallel (1-1.5 us at 1-16
# tokens) but its warp-per-row epilogue (fused mode's qkv_a_row) took ~7 us per row pass (one warp's serial
# vectors and IEEE divides): rows 15.9 us at M=1. Level 2 is now B0 split mode's 192-thread row tile on the raw
# rows, the next row's loads in flight while the current one is normalised. The B0 family tests compare bitwise
# with split mode again. Megakernel GPU tests, then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
