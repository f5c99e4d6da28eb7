#!/bin/bash
# session 11 call 8: where the no-load time goes: no loads (noload), + no epilogues (noepi), + no folds (nofold), bn64, (a)
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,1024,4096"
step normal 45 $B --out $H200_OUT/normal
for t in noload noepi nofold; do step $t 45 env GLM5_FASTPATH_CSRC=$PWD/build/abx/$t/csrc $B --out $H200_OUT/$t; done
cd "$OUT" && tar -czf r.tgz r && rm -rf r
