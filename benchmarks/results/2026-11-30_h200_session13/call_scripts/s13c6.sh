#!/bin/bash
# session 13 call 6: the token-major combine by half-warps + no per-stage proxy fence in pool builds (HEAD) against
# call 5's kernel tree (7e974c7, build/abx/c5) in the same run; the MegaMoE GPU test file at HEAD; bench (a) / (b) with
# DeepGEMM; the trace build at (a) 1024 / 4096.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
run_tests moe 180 tests/moe/test_megamoe.py
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 512,1024,2048,4096"
step a_old 60 env GLM5_FASTPATH_CSRC=$PWD/build/abx/c5/csrc $A --out $H200_OUT/a_old
step a_new 60 $A --out $H200_OUT/a_new
step a_old2 60 env GLM5_FASTPATH_CSRC=$PWD/build/abx/c5/csrc $A --out $H200_OUT/a_old2
step a_dg 120 python3 -m glm5_fastpath.cli bench moe --settings a --out $H200_OUT/a_dg
step b_dg 120 python3 -m glm5_fastpath.cli bench moe --settings b --out $H200_OUT/b_dg
step trace 50 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,4096 --trace --out $H200_OUT/trace
grep -h "M=" $H200_OUT/a_old.log $H200_OUT/a_new.log $H200_OUT/a_old2.log $H200_OUT/a_dg.log $H200_OUT/b_dg.log | cut -c1-250
grep -E "passed|failed|Error" $H200_OUT/gpu-tests-moe.log | tail -8
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
