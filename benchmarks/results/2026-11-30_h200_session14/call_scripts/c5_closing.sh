#!/bin/bash
# Session 14 call 5, the closing state (default: bn64 token-major pool + end combine from an expected largest routed
# expert of 64 tokens): the MegaMoE GPU test file, bench (a) and (b) at every bucket against DeepGEMM fp8_mega_moe in the
# same run, the threshold region once more (ours alone), the trace of the new default, and (a) against DeepGEMM again.
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/dgsite.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
B="python3 -m glm5_fastpath.cli bench moe"
run_tests moe 200 tests/moe/test_megamoe.py
step a_dg 120 $B --settings a --out $H200_OUT/a_dg
step b_dg 120 $B --settings b --out $H200_OUT/b_dg
CF=bn64_s5_g512_w0_lf,bn64_s5_g512_w0_lf_t,bn64_s5_g512_w0_lf_p_t_e
step thr 60 $B --no-deepgemm --settings a,b --tokens 128,192,1024,1536 --configs $CF --out $H200_OUT/thr
step trace 40 $B --no-deepgemm --settings a --tokens 1024,4096 --trace --out $H200_OUT/trace
step a_dg2 120 $B --settings a --out $H200_OUT/a_dg2
grep -h "M=" $H200_OUT/a_dg.log $H200_OUT/b_dg.log $H200_OUT/a_dg2.log | grep -v trace | cut -c1-200
sed -n '/| setting | tokens | config/,$p' $H200_OUT/thr/megamoe_bench.md | grep "^| [ab] " | cut -d'|' -f2-6
grep -E "passed|failed" $H200_OUT/gpu-tests-moe.log | tail -2; grep FAILED $H200_OUT/gpu-tests-moe.log | head
h200_pack
