#!/bin/bash
# session 11 call 1: wide mode (bn128) GPU tests, bitwise A/B of the narrow builds vs HEAD (out-of-line trap lifts
# the 168-register cap), bench wide vs bn64 vs DeepGEMM at 256-4096 tokens
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests wide 170 tests/moe/test_megamoe.py -k "wide or trace_run"
step bitwise_ab 80 python3 scripts/megamoe_bitwise_ab.py --a build/abx/prev/csrc --b csrc --out $H200_OUT/bitwise_ab --tokens 1,3,40,128,1024
rm -rf $H200_OUT/bitwise_ab/a $H200_OUT/bitwise_ab/b
B="python3 -m glm5_fastpath.cli bench moe"
step moe_wide 200 $B --settings a,b --tokens 256,512,1024,2048,4096 --configs bn128_s6_g512_w0_lf --out $H200_OUT/moe_wide
step moe_a_prev 40 env GLM5_FASTPATH_CSRC=$PWD/build/abx/prev/csrc $B --no-deepgemm --settings a --tokens 16,128,1024 --out $H200_OUT/moe_a_prev
step moe_a_cur 40 $B --no-deepgemm --settings a --tokens 16,128,1024 --out $H200_OUT/moe_a_cur
cd "$OUT" && tar -czf r.tgz r && rm -rf r
