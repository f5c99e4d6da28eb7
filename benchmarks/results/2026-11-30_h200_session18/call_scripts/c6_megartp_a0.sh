#!/bin/bash
# Session 18 call 6 (issue #5): the megakernel with its A0 family as well (A0AddRmsNormQuantRowTile: one row per
# pass of the 256 workers, the cluster kernel's partial-sum order). The megakernel GPU test file (A0 alone bitwise
# vs the standalone cluster kernel; the supported subgraph A0+B0+B1+D1+D2+E1; the executor through the staging
# buffers; trace; graph replays), the standalone A0 op's GPU tests, then the megakernel bench.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=480
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 240 tests/attn_pre/megartp/test_megartp_device.py
run_tests a0 90 tests/ops/test_add_rmsnorm_quant.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json"
h200_pack
