#!/bin/bash
# Session 20 call 9 (issue #5), branch c0-family: the megakernel's C0 family (session 18's untested patch, adapted).
# Megakernel GPU tests (the new C0 family test; the subgraph with C0), then the bench on the larger subgraph.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20g.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20g.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 120 tests/attn_pre/megartp/test_megartp_device.py
step bench 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json"
h200_pack
