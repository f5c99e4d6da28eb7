#!/bin/bash
# session 13 call 2: when the K loop reads its column scales (GLM5_MEGAMOE_NARROW_SCALES; the wide builds read them
# before the wgmma issue in n0-n2). Trees: head (042bec7's csrc), n0 / n1 / n2 (the working tree's csrc with the macro
# default 0 / 1 / 2). Bitwise A/B against head, bench (a) 256-4096 with both bn64 and bn128 + pool per tree, (b) 1024,
# Nsight Compute source counters of n2.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
step bitwise_n2 100 python3 scripts/megamoe_bitwise_ab.py --a $T/head/csrc --b $T/n2/csrc --out $H200_OUT/bitwise_n2 --tokens 64,256,1024
step bitwise_n1 60 python3 scripts/megamoe_bitwise_ab.py --a $T/head/csrc --b $T/n1/csrc --out $H200_OUT/bitwise_n1 --tokens 64,256
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,512,1024,2048,4096 --configs bn64_s5_g512_w0_lf,bn128_s6_g512_w0_lf_p"
for t in head n2 n0 n1 head; do
  step a_$t 75 env GLM5_FASTPATH_CSRC=$T/$t/csrc $A --out $H200_OUT/a_$t
done
for t in head n2; do
  step b_$t 40 env GLM5_FASTPATH_CSRC=$T/$t/csrc python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 1024 --out $H200_OUT/b_$t
done
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session13/call_scripts/megamoe_ncu_probe.py
for c in bn64_s5_g512_w0_lf bn128_s6_g512_w0_lf_p; do
  step ncu_$c 60 env GLM5_FASTPATH_CSRC=$T/n2/csrc $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 --section SourceCounters -o $H200_OUT/$c -f python3 $P 1024 $c
  step src_$c 40 $NCU --import $H200_OUT/$c.ncu-rep --page source --csv --print-source sass
  gzip -f $H200_OUT/src_$c.log
done
grep -h "M=" $H200_OUT/a_*.log $H200_OUT/b_*.log | cut -c1-250
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log.gz' -o -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
