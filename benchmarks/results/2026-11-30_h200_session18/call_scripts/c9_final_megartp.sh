#!/bin/bash
# Session 18 call 9 (issue #5): the megakernel GPU tests at the session's final code (4-page E1 ring again, A0's
# own hidden-size check, wrapped lines: the kernel source hash changed after calls 6 / 8).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 170 tests/attn_pre/megartp/test_megartp_device.py
h200_pack
