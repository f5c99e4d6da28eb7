#!/bin/bash
# Session 20 call 1 (issue #5): the megakernel GPU tests at session 19's review mend (1912ca3, not GPU-run there)
# plus this session's epilogue marks, then the traced bench at 1 / 16 / 64 tokens: where B1's 14-15 us finish
# epilogue goes (marks inside SkinnyFinish's epilogue: entry, LayerNorm stats, affine + RoPE, rotated rows).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20.tar.xz)
source scripts/h200_lib.sh
DEADLINE=260
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 90 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
