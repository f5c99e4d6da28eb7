#!/bin/bash
# Session 14 call 4: the end combine (config suffix _e): its GPU tests (bitwise vs the per-task combine, graph replay),
# the token-major / pool tests again (the combine refactor changed every build), then ours alone with and without it.
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
run_tests endc 150 tests/moe/test_megamoe.py -k "end_combine or token_major or pool_equals or graph_replay"
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
CF=bn64_s5_g512_w0_lf_p_t,bn64_s5_g512_w0_lf_p_t_e,bn128_s6_g512_w0_lf_p_t,bn128_s6_g512_w0_lf_p_t_e
for r in 1 2; do
  step a_$r 70 $B --settings a --tokens 256,512,1024,2048,4096 --configs $CF --out $H200_OUT/a_$r
  step b_$r 60 $B --settings b --tokens 1024,2048,4096 --configs bn64_s5_g512_w0_lf_p_t,bn64_s5_g512_w0_lf_p_t_e --out $H200_OUT/b_$r
done
for f in $H200_OUT/*_[12]/megamoe_bench.md; do echo "== $f"; sed -n '/| setting | tokens | config/,$p' $f | grep "^| [ab] " | cut -d'|' -f2-6; done
grep -E "passed|failed" $H200_OUT/gpu-tests-endc.log | tail -3; grep FAILED $H200_OUT/gpu-tests-endc.log | head
h200_pack
