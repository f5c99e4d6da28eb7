#!/bin/bash
# Session 14 call 2: (1) the narrow token-major build's GPU tests again (the test's combine count fixed for 256-row tiles),
# (2) bn64 token-major pool against the wide token-major pool default at setting (a) 1024-4096 and (b) 4096,
# (3) the combine-warps A/B (trees build/abx/cwoff, build/abx/cw from ../../2026-11-30_h200_session13/next/).
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz build/abx/cwoff build/abx/cw)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
run_tests tmn 100 tests/moe/test_megamoe.py -k "token_major"
CF=bn64_s5_g512_w0_lf,bn64_s5_g512_w0_lf_p,bn64_s5_g512_w0_lf_p_t,bn128_s6_g512_w0_lf_p_t
for r in 1 2; do
  step a_$r 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,2048,4096 --configs $CF --out $H200_OUT/a_$r
done
step b_1 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 4096 --configs $CF --out $H200_OUT/b_1
step bitwise_cw 90 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $T/cw/csrc --out $H200_OUT/bitwise_cw --tokens 512,4096
GLM5_FASTPATH_CSRC=$T/cw/csrc run_tests cw 100 tests/moe/test_megamoe.py -k "token_major and (False-128 or True-128)"
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 512,1024,4096"
for r in 1 2; do
  step head_$r 40 $A --out $H200_OUT/head_$r
  step cwoff_$r 40 env GLM5_FASTPATH_CSRC=$T/cwoff/csrc $A --out $H200_OUT/cwoff_$r
  step cw_$r 40 env GLM5_FASTPATH_CSRC=$T/cw/csrc $A --out $H200_OUT/cw_$r
done
for f in $H200_OUT/[ab]_[12]/megamoe_bench.md; do echo "== $f"; sed -n '/| setting | tokens | config/,$p' $f | grep "^| [ab] " | cut -d'|' -f2-6; done
for f in $H200_OUT/*_[12].log; do echo "$(basename $f) $(grep -o "ours= *[0-9.]*" $f | tr -s ' ' | paste -sd' ')"; done
h200_pack
