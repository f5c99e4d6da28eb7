#!/bin/bash
# Session 14 call 8: GLM5_MEGAMOE_TM_PIPE=1 (tree tp1 = HEAD's csrc with the macro set): the narrow token-major K loop as
# two n64 wgmma groups per stage, half A folded while half B runs. Bitwise A/B against HEAD, the token-major GPU tests on
# tp1, then ours alone HEAD vs tp1 at (a) 256-4096 (two rounds) and (b) 2048 / 4096.
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz build/abx/tp1)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
step bitwise 90 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $T/tp1/csrc --out $H200_OUT/bitwise --tokens 512,4096
GLM5_FASTPATH_CSRC=$T/tp1/csrc run_tests tp1 90 tests/moe/test_megamoe.py -k "token_major and 64"
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
for r in 1 2; do
  step head_$r 40 $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/head_$r
  step tp1_$r 40 env GLM5_FASTPATH_CSRC=$T/tp1/csrc $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/tp1_$r
done
step b_head 40 $B --settings b --tokens 2048,4096 --out $H200_OUT/b_head
step b_tp1 40 env GLM5_FASTPATH_CSRC=$T/tp1/csrc $B --settings b --tokens 2048,4096 --out $H200_OUT/b_tp1
tail -2 $H200_OUT/bitwise.log; grep -E "passed|failed" $H200_OUT/gpu-tests-tp1.log | tail -1
for f in $H200_OUT/*.log; do case $f in *steps.log|*bitwise*|*gpu-tests*) continue;; esac; echo "$(basename $f .log) $(grep -o "ours= *[0-9.]*" $f | tr -s ' ' | sed 's/ours= //' | paste -sd' ')"; done
h200_pack
