#!/bin/bash
# session 12 call 2 (call 1's tarball came back too big: the bitwise dumps; only logs / json / md travel now):
# bench A/B of the pipelined fold (HEAD csrc) vs session 11's tree (build/abx/s12/head), routed experts
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe"
OLD="env GLM5_FASTPATH_CSRC=$PWD/build/abx/s12/head/csrc"
step new_a 120 $B --settings a --tokens 128,256,512,1024,2048,4096 --out $H200_OUT/new_a
step old_a 50 $OLD $B --no-deepgemm --settings a --tokens 128,256,512,1024,2048,4096 --out $H200_OUT/old_a
step new_b 50 $B --no-deepgemm --settings b --tokens 8,128,1024,4096 --out $H200_OUT/new_b
step old_b 50 $OLD $B --no-deepgemm --settings b --tokens 8,128,1024,4096 --out $H200_OUT/old_b
for f in new_a old_a new_b old_b; do echo "== $f"; grep "M=" $H200_OUT/$f.log; done
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -2M | tar -czf r.tgz -T - && rm -rf r
