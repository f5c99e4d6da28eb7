#!/bin/bash
# session 12 call 1: pipelined fold (HEAD) vs session 11's kernel tree (build/abx/s12/head = 097aa42 csrc):
# bitwise A/B, bench A/B (routed experts), all MegaMoE GPU tests
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
step bitwise 150 python3 scripts/megamoe_bitwise_ab.py --a $PWD/build/abx/s12/head/csrc --b $PWD/csrc --out $H200_OUT/bitwise --tokens 1,8,64,256,1024,4096
B="python3 -m glm5_fastpath.cli bench moe --settings a,b --tokens 8,128,256,1024,4096"
step bench_new 90 $B --out $H200_OUT/bench_new
step bench_old 70 env GLM5_FASTPATH_CSRC=$PWD/build/abx/s12/head/csrc $B --no-deepgemm --out $H200_OUT/bench_old
run_tests moe 170 tests/moe/test_megamoe.py
cd "$OUT" && tar -czf r.tgz r && rm -rf r
