#!/bin/bash
# session 12 call 7: the trace GPU tests with the new K-loop columns; the wide block's K loop (bn128, bn128 + pool)
# traced at (a) 1024 tokens next to bn64 (per-stage cycles per MAC: does a wider wgmma N relieve the K loop?)
source scripts/h200_lib.sh
# kernel-only tests and --no-deepgemm: the SGLang / DeepGEMM site is not carried (an empty archive instead)
h200_setup "$OUT/r" .carry/empty.tar.xz ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
run_tests trace 120 tests/moe/test_megamoe.py -k "trace or diag"
step trace_wide 120 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024 --trace --trace-save-max-tokens 1024 --configs bn128_s6_g512_w0_lf,bn128_s6_g512_w0_lf_p --out $H200_OUT/trace_wide
tail -3 $H200_OUT/gpu-tests-trace.log; grep "M=" $H200_OUT/trace_wide.log | cut -c1-300
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.pt' \) -size -4M | tar -czf r.tgz -T - && rm -rf r
