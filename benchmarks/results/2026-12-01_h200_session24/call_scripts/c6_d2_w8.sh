#!/bin/bash
# Session 24 c6 (issues #3 / #4): D2 on W_UK in the checkpoint's FP8 form (W8A16, GLM5_FASTPATH_D2_WEIGHTS=fp8; half of
# D2's weight bytes, q_lat bitwise the bf16 build's). (1) the W8 kernel's GPU tests (bitwise vs the bf16 op on the
# dequantized weight, every M, PDL late producer, graph replay) and the bf16 D2 tests; (2) CMP GPU tests with fp8 D2
# (every bucket, modes bitwise, late producer); (3) bench prefix-ops at 1 / 16 / 64 with fp8 D2 and stock, then D2
# alone with bf16 (same call); (4) bench prefix: stock + two CMP modes with fp8 D2, then the same modes with bf16.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=530
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests d2 80 tests/ops/test_d2_absorb_w8.py tests/ops/test_d2_absorb.py
TEST_HANG_S=80 GLM5_FASTPATH_D2_WEIGHTS=fp8 run_tests cmp_d2fp8 90 tests/attn_pre/cmp/test_cmp_executor_gpu.py \
  -k "every_bucket or modes_agree or late_producer"
step prefix_ops_fp8 110 env GLM5_FASTPATH_D2_WEIGHTS=fp8 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16,64 \
  --out "$H200_OUT/prefix_ops_fp8"
step prefix_ops_bf16 40 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16,64 --ops D2 --no-stock --no-profile \
  --out "$H200_OUT/prefix_ops_bf16"
step prefix_fp8 110 env GLM5_FASTPATH_D2_WEIGHTS=fp8 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 \
  --timeline-modes none --replays 30 --modes full,multistream_pdl_prologue --out "$H200_OUT/prefix_fp8"
step prefix_bf16 70 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 --timeline-modes none --replays 30 --no-stock \
  --modes full,multistream_pdl_prologue --out "$H200_OUT/prefix_bf16"
h200_pack
