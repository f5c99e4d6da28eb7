#!/bin/bash
# session 11 call 3: full MegaMoE GPU tests at 03e4c0f, narrow builds bitwise + timing vs 51fcb41, (a) 256/512 configs vs DeepGEMM
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests moe 230 tests/moe/test_megamoe.py
step bitwise_ab 60 python3 scripts/megamoe_bitwise_ab.py --a build/abx/prev/csrc --b csrc --out $H200_OUT/bitwise_ab --tokens 1,3,40,128,1024
rm -rf $H200_OUT/bitwise_ab/a $H200_OUT/bitwise_ab/b
B="python3 -m glm5_fastpath.cli bench moe"
step moe_a_prev 40 env GLM5_FASTPATH_CSRC=$PWD/build/abx/prev/csrc $B --no-deepgemm --settings a --tokens 16,128,1024 --out $H200_OUT/moe_a_prev
step moe_a_cur 40 $B --no-deepgemm --settings a --tokens 16,128,1024 --out $H200_OUT/moe_a_cur
step moe_a_cfg 90 $B --settings a --tokens 256,512 --configs bn32_s6_g512_w0_lf,bn64_s5_g4_w0_lf,bn64_s5_g8_w0_lf,bn128_s6_g512_w0_lf --out $H200_OUT/moe_a_cfg
cd "$OUT" && tar -czf r.tgz r && rm -rf r
