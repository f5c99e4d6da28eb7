#!/bin/bash
# session 11 call 7: math + epilogue + schedule alone (NOLOAD copy of the tree) vs the normal build, (a)/(b) 1024 / 4096
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a,b --tokens 256,1024,4096 --configs bn128_s6_g512_w0_lf,bn128_s6_g512_w0_lf_p"
step normal 70 $B --out $H200_OUT/normal
step noload 70 env GLM5_FASTPATH_CSRC=$PWD/build/abx/noload/csrc $B --out $H200_OUT/noload
cd "$OUT" && tar -czf r.tgz r && rm -rf r
