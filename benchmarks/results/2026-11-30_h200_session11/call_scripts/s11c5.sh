#!/bin/bash
# session 11 call 5: pool build GPU tests (bitwise vs cp.async), bench with the _p configs
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests pool 120 tests/moe/test_megamoe.py -k "pool"
B="python3 -m glm5_fastpath.cli bench moe"
step moe_p 200 $B --settings a,b --tokens 128,256,512,1024,4096 --configs bn64_s5_g512_w0_lf_p,bn128_s6_g512_w0_lf_p,bn32_s6_g512_w0_lf_p --out $H200_OUT/moe_p
step moe_p_small 50 $B --no-deepgemm --settings a,b --tokens 1,8,32 --configs bn8_s6_g512_w4_lf_p,bn32_s6_g512_w0_lf_p --out $H200_OUT/moe_p_small
cd "$OUT" && tar -czf r.tgz r && rm -rf r
