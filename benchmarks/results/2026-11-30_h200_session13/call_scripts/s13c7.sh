#!/bin/bash
# session 13 call 7: which of call 6's two changes costs what. Trees: c5 (7e974c7: base), cmb (e03e5b1: + half-warp
# combine), fen (c5 + no per-stage proxy fence in pool builds), HEAD (both). bench (a) 512-4096, interleaved twice.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 512,1024,2048,4096"
for r in 1 2; do
  for t in c5 cmb fen head; do
    if [ $t = head ]; then step ${t}_$r 40 $A --out $H200_OUT/${t}_$r
    else step ${t}_$r 40 env GLM5_FASTPATH_CSRC=$PWD/build/abx/$t/csrc $A --out $H200_OUT/${t}_$r; fi
  done
done
for f in $H200_OUT/*_[12].log; do echo "$(basename $f) $(grep "M=" $f | awk '{print $NF=""; print}' | grep -o "ours= *[0-9.]*" | tr -s ' ' | paste -sd' ')"; done
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
