#!/bin/bash
# session 13 call 8: the closing state (token-major wide + pool default from an expected largest routed expert of 128,
# math warps in the pool copy, no per-stage proxy fence in pool builds): the MegaMoE GPU test file, then bench (a) and
# (b) at every bucket against DeepGEMM fp8_mega_moe in the same run.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
run_tests moe 150 tests/moe/test_megamoe.py
step a_dg 120 python3 -m glm5_fastpath.cli bench moe --settings a --out $H200_OUT/a_dg
step b_dg 120 python3 -m glm5_fastpath.cli bench moe --settings b --out $H200_OUT/b_dg
grep -h "M=" $H200_OUT/a_dg.log $H200_OUT/b_dg.log | cut -c1-250
grep -E "passed|failed|Error" $H200_OUT/gpu-tests-moe.log | tail -8
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
