#!/bin/bash
# session 13 call 5: the math warps copy the token pool too, the wide combine loads every slot at once. The MegaMoE
# GPU test file; bench (a) / (b) against DeepGEMM (same run); call 4's kernel tree (3498f47, build/abx/c4) in the same
# run without DeepGEMM; the trace build at (a) 1024 / 4096.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
run_tests moe 180 tests/moe/test_megamoe.py
step a_new 120 python3 -m glm5_fastpath.cli bench moe --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/a_new
step a_old 90 env GLM5_FASTPATH_CSRC=$PWD/build/abx/c4/csrc python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 512,1024,2048,4096 --out $H200_OUT/a_old
step b_new 90 python3 -m glm5_fastpath.cli bench moe --settings b --tokens 1024,2048,4096 --out $H200_OUT/b_new
step trace 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,4096 --trace --out $H200_OUT/trace
grep -h "M=" $H200_OUT/a_new.log $H200_OUT/a_old.log $H200_OUT/b_new.log | cut -c1-250
grep -E "passed|failed|Error" $H200_OUT/gpu-tests-moe.log | tail -8
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
