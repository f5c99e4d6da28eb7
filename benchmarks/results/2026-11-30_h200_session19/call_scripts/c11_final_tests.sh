#!/bin/bash
# Session 19 call 11 (issue #5): the review mends (B0 level 2's row copy, the B0 check, bench --tiling errors) on the
# final megakernel: the megakernel GPU tests and the bench once more.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=240
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 60 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json"
h200_pack
