#!/bin/bash
# Session 29 call 1 (issues #9, #6): park the engine site's first part in build/h200parts/ (tracked tree ~34 MiB + site
# ~38 MB + JIT cache exceed one call's 64 MiB carry; c2 brings the rest); then
#   1. A0's GPU tests (the norm route runs A0 inside the engine from c3 on; its csrc is unchanged since its last GPU run);
#   2. MegaMoE's GPU tests for the FC2 L2 prefetch (l2_fc2: bitwise the same as without it) and the name tests;
#   3. bench moe, ours only, settings a / b at 1-32 tokens: every default config of those buckets with and without _l2,
#      three rounds (the A/B that decides whether default_config takes l2_fc2).
# run: C=<commit> bash this   (carry .carry/h200site.part.aa .carry/jit_s29.tar.xz;
#                              split -b 19200000 .carry/h200site.tar.xz .carry/h200site.part.)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/ && ls -la build/h200parts
source scripts/h200_lib.sh
DEADLINE=560
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s29.tar.xz; export GLM5_FASTPATH_COMMIT=$C
TEST_HANG_S=40 run_tests a0 100 tests/ops/test_add_rmsnorm_quant.py
TEST_HANG_S=60 run_tests l2fc2 200 tests/moe/test_megamoe.py -k "l2_fc2"
CFGS=bn8_s6_g512_w4_lf,bn8_s6_g512_w4_lf_l2,bn8_s6_g512_w0_lf,bn8_s6_g512_w0_lf_l2,bn16_s6_g512_w0_lf,bn16_s6_g512_w0_lf_l2,bn32_s6_g512_w0_lf,bn32_s6_g512_w0_lf_l2
for r in 1 2 3; do
  step "bench-moe-r$r" 70 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_l2_r$r" --settings a,b \
    --tokens 1,2,4,8,16,32 --no-deepgemm --configs $CFGS
done
h200_pack
