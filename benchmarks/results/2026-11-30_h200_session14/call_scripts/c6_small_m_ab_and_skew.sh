#!/bin/bash
# Session 14 call 6: (1) small-M A/B of the combine refactor (combine_tile, end-combine flag) against session 13's kernel
# (tree old147 = 147a91a's csrc; non-pool builds, default configs): their SASS differs in register allocation;
# (2) GLM5_MEGAMOE_TM_SKEW: warpgroup 1 of the token-major builds starts each K loop 150 / 300 / 600 clocks later
# (trees sk150 / sk300 / sk600 = HEAD's csrc with the macro set), at (a) 512-4096 and (b) 2048 / 4096.
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz build/abx/{old147,sk150,sk300,sk600})
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
for r in 1 2; do
  step old_$r 40 env GLM5_FASTPATH_CSRC=$T/old147/csrc $B --settings a,b --tokens 1,8,16,64,128 --out $H200_OUT/old_$r
  step head_$r 40 $B --settings a,b --tokens 1,8,16,64,128 --out $H200_OUT/head_$r
done
S="$B --settings a --tokens 512,1024,2048,4096"
for r in 1 2; do
  step s0_$r 40 $S --out $H200_OUT/s0_$r
  for v in 150 300 600; do step s${v}_$r 40 env GLM5_FASTPATH_CSRC=$T/sk$v/csrc $S --out $H200_OUT/s${v}_$r; done
done
step b_s0 40 $B --settings b --tokens 2048,4096 --out $H200_OUT/b_s0
step b_s300 40 env GLM5_FASTPATH_CSRC=$T/sk300/csrc $B --settings b --tokens 2048,4096 --out $H200_OUT/b_s300
for f in $H200_OUT/*.log; do case $f in *steps.log) continue;; esac; echo "$(basename $f .log) $(grep -o "ours= *[0-9.]*" $f | tr -s ' ' | sed 's/ours= //' | paste -sd' ')"; done
h200_pack
