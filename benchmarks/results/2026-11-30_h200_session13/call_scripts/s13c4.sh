#!/bin/bash
# session 13 call 4: the new default (token-major wide + pool from an expected largest routed expert of 128 tokens;
# warpgroup 1 skips its wgmma when a block holds <= 64 tokens): the whole MegaMoE GPU test file, bench (a) every
# bucket and (b) 256-4096 against DeepGEMM fp8_mega_moe (same run), the trace build at (a) 1024 / 4096.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
run_tests moe 240 tests/moe/test_megamoe.py
step a 150 python3 -m glm5_fastpath.cli bench moe --settings a --configs bn64_s5_g512_w0_lf,bn128_s6_g512_w0_lf_p --out $H200_OUT/a
step b 100 python3 -m glm5_fastpath.cli bench moe --settings b --tokens 256,512,1024,2048,4096 --configs bn64_s5_g512_w0_lf,bn128_s6_g512_w0_lf_p_t --out $H200_OUT/b
step trace 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,4096 --trace --out $H200_OUT/trace
grep -h "M=" $H200_OUT/a.log $H200_OUT/b.log | cut -c1-250
grep -E "passed|failed|Error" $H200_OUT/gpu-tests-moe.log | tail -8
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
