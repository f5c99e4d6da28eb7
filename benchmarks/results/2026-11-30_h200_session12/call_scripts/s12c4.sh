#!/bin/bash
# session 12 call 4: stage ping-pong of the math warpgroups. base = the checkout (GLM5_MEGAMOE_PINGPONG 0, SASS =
# 097aa42); pp1 / pp2 = the same with the define's default 1 (signal after the first half's wgmma) / 2 (after issue).
# Bitwise A/B base vs pp1 / pp2, then bench A/B (routed experts, no DeepGEMM).
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,1024,4096"
Bb="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 8,128,1024"
for v in base pp1 pp2 base2; do
  case $v in base|base2) T=$PWD/csrc ;; *) T=$PWD/build/abx/s12/$v/csrc ;; esac
  step a_$v 60 env GLM5_FASTPATH_CSRC=$T $A --out $H200_OUT/a_$v
done
for v in base pp1 pp2; do
  case $v in base) T=$PWD/csrc ;; *) T=$PWD/build/abx/s12/$v/csrc ;; esac
  step b_$v 40 env GLM5_FASTPATH_CSRC=$T $Bb --out $H200_OUT/b_$v
done
for v in pp1 pp2; do
  step bitwise_$v 70 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $PWD/build/abx/s12/$v/csrc --out /tmp/bw_$v --tokens 1,33,256,1024
  cp /tmp/bw_$v/bitwise_ab.json $H200_OUT/bitwise_$v.json 2>/dev/null; rm -rf /tmp/bw_$v
done
for f in $H200_OUT/a_*.log $H200_OUT/b_*.log; do echo "== $f"; grep "M=" $f; done
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -2M | tar -czf r.tgz -T - && rm -rf r
