#!/bin/bash
# Session 20 call 3 (issues #5, #3, #4): the cross-warp reduce of SkinnyFinish as straight-line code (B1's epilogue
# 2338 -> 1164 SASS instructions; call 2 showed cold code costs the megakernel ~50 ns per 128-byte line).
#  1. GPU tests of the standalone B1 / D1 GEMM epilogues (plain and rotated) and the megakernel;
#  2. megakernel bench + trace at this commit (B1 partials warm the epilogue, call 2), then the same without the
#     warm-up (build/abx/s20nowarm/csrc: kWarmEpilogue = false), untraced;
#  3. CMP whole prefix at this commit and at d10218f's csrc (build/abx/s20old/csrc, the old reduce), same run.
# run: C=<commit> bash this
#   (carry .carry/empty.tar.xz .carry/jit_s20c.tar.xz .carry/jit_s20b.tar.xz build/abx/s20old build/abx/s20nowarm)
source scripts/h200_lib.sh
DEADLINE=520
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
tar -xJf .carry/jit_s20b.tar.xz -C "$GLM5_FASTPATH_CACHE_DIR"  # d10218f's kernels (the old-reduce tree's keys)
run_tests gemm 150 tests/ops/test_fp8_gemm.py tests/ops/test_fp8_gemm_rotate.py -k "d1_indexer_q or b1_indexer_k or small_preset or rotated_small or mma_and_wgmma_agree"
run_tests mrtp 120 tests/attn_pre/megartp/test_megartp_device.py
step bench 70 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
step bench_nowarm 70 env GLM5_FASTPATH_CSRC=$PWD/build/abx/s20nowarm/csrc python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench_nowarm.json"
step bench2 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench_2.json"
step cmp_new 60 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/cmp_new" --ms 1,16,64 --no-stock \
  --modes full,multistream_pdl_prologue --timeline-modes none --replays 30
step cmp_old 60 env GLM5_FASTPATH_CSRC=$PWD/build/abx/s20old/csrc python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/cmp_old" \
  --ms 1,16,64 --no-stock --modes full,multistream_pdl_prologue --timeline-modes none --replays 30
step cmp_new2 60 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/cmp_new2" --ms 1,16,64 --no-stock \
  --modes full,multistream_pdl_prologue --timeline-modes none --replays 30
h200_pack
