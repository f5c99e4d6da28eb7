#!/bin/bash
# session 11 call 6: all MegaMoE GPU tests + the full table (default configs) vs DeepGEMM at the final kernel commit
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests moe 150 tests/moe/test_megamoe.py
step moe_full 300 python3 -m glm5_fastpath.cli bench moe --settings a,b --out $H200_OUT/moe_full
cd "$OUT" && tar -czf r.tgz r && rm -rf r
