#!/bin/bash
# Session 19 call 2 (issue #5): call 1's trace left the split-K epilogues (B1 / D1's SkinnyFinish, B0's rows) as
# the long instructions on the critical path (a B1 last arriver 19 us after its partial at 1 token). The trace
# build now stamps four phase marks per split-K instruction (partial / staged / summed / epilogue); production
# SASS unchanged. Megakernel GPU tests, then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
