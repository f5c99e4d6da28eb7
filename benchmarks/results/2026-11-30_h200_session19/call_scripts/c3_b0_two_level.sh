#!/bin/bash
# Session 19 call 3 (issue #5): call 2's phase trace put B0's last arriver at 27 us (M=16) / 109 us (M=64): one
# CTA reading the M block's whole split workspace and normalising the rows one after another. Now a two-level
# reduce (each weight tile's last split sums the tile; the last tile reducer runs fused mode's warp-per-row
# epilogue with the norm weights in shared memory). The B0 family tests now compare bitwise with the
# standalone fused-mode kernel. Megakernel GPU tests, then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
