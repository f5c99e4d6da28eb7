#!/bin/bash
# Session 23 call 5 (issue #5): the final code. The megakernel GPU tests (static plans: the kernel ABI and the
# worker loop changed for dynamic dispatch) and the dynamic-dispatch GPU tests; the megakernel bench, list and
# dynamic (default lead 1.5 us, run-time terms), same run.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=330
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
run_tests mrtp 130 tests/attn_pre/megartp/test_megartp_device.py
run_tests dynamic 70 tests/attn_pre/megartp/test_megartp_dynamic.py
step list 40 $B --scheduler list --json "$H200_OUT/list.json"
step dynamic 40 $B --scheduler dynamic --json "$H200_OUT/dynamic.json"
h200_pack
