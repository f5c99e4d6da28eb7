#!/bin/bash
# Session 20 call 7 (issue #5): the A0 row tile's norm + quant pass as one rolled loop (its code runs cold at the start
# of every launch). Megakernel GPU tests (A0 bitwise against the standalone cluster kernel), then the bench alternating
# this commit's kernel and the previous code (build/abx/s20a0_old/csrc = 00267eb's csrc, whitespace apart the same as
# the parent commit's), the first run traced.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20f.tar.xz .carry/jit_s20e.tar.xz build/abx/s20a0_old)
source scripts/h200_lib.sh
DEADLINE=330
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20f.tar.xz; export GLM5_FASTPATH_COMMIT=$C
tar -xJf .carry/jit_s20e.tar.xz -C "$GLM5_FASTPATH_CACHE_DIR"  # the old tree's kernels
OLD="env GLM5_FASTPATH_CSRC=$PWD/build/abx/s20a0_old/csrc"
run_tests mrtp 120 tests/attn_pre/megartp/test_megartp_device.py
step new1 60 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new1.json" --trace "$H200_OUT/trace"
step old1 35 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old1.json"
step new2 35 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new2.json"
step old2 35 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old2.json"
h200_pack
