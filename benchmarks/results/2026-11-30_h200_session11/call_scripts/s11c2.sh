#!/bin/bash
# session 11 call 2: trace build, (a) 256 / 1024: bn64 vs bn128 (current tree) and bn64 of HEAD~ (inline trap)
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
step trace_cur 120 python3 build/abx/trace_cmp.py 256,1024 bn64_s5_g512_w0_lf,bn128_s6_g512_w0_lf
step trace_prev 60 env GLM5_FASTPATH_CSRC=$PWD/build/abx/prev/csrc python3 build/abx/trace_cmp.py 1024 bn64_s5_g512_w0_lf
cd "$OUT" && tar -czf r.tgz r && rm -rf r
