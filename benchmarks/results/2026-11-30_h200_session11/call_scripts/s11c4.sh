#!/bin/bash
# session 11 call 4: act_tma GPU tests (bitwise vs cp.async), bench with the _at configs
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests act_tma 120 tests/moe/test_megamoe.py -k "act_tma"
B="python3 -m glm5_fastpath.cli bench moe"
step moe_at 200 $B --settings a,b --tokens 128,256,512,1024,2048,4096 --configs bn64_s5_g512_w0_lf_at,bn128_s6_g512_w0_lf_at --out $H200_OUT/moe_at
step moe_at_small 60 $B --no-deepgemm --settings a,b --tokens 1,8,32 --configs bn8_s6_g512_w4_lf_at,bn32_s6_g512_w0_lf_at --out $H200_OUT/moe_at_small
cd "$OUT" && tar -czf r.tgz r && rm -rf r
