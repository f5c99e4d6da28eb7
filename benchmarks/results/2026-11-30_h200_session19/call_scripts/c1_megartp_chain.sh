#!/bin/bash
# Session 19 call 1 (issue #5): the megakernel's critical chain after session 18's trace.
#  - B0's last arriver sums the splits straight into the row tile's registers (all loads of two splits in flight
#    instead of one L2 round trip per split and pair), no bf16 write-back / barriers between rows;
#  - B1 / D1 finish: the split loads of a fragment in flight together (load_reduced);
#  - A0 row tile: the norm weight and the second read of the row issued with the other loads.
# All three are bitwise the old results (same adds in the same order): the megakernel GPU tests check it against
# the standalone kernels. Then the bench + trace at 1 / 16 / 64 tokens, and the bench with other B0 / D1 / B1 split
# counts (bench --tiling).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
for t in b0_split_k=6 b0_split_k=6,d1_split_k=2 b0_split_k=8,d1_split_k=2,b1_split_k=4; do
  step "bench_${t//[=,]/_}" 60 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --tiling "$t" --json "$H200_OUT/megartp_bench_${t//[=,]/_}.json"
done
h200_pack
