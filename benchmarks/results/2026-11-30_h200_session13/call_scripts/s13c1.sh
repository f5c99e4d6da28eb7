#!/bin/bash
# session 13 call 1: (1) Nsight Compute per-SASS-instruction stall sampling (SourceCounters) of one MegaMoE launch at
# (a) 1024 tokens, bn64 and bn128 + pool; (2) the wide builds' per-thread column-scale layout (session 12's prepared
# patch, tree build/abx/ws): bitwise A/B, bench at (a) 1024-4096, trace, the wide / pool GPU tests on the patched tree.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session13/call_scripts/megamoe_ncu_probe.py
WS="env GLM5_FASTPATH_CSRC=$PWD/build/abx/ws/csrc"
for c in bn64_s5_g512_w0_lf bn128_s6_g512_w0_lf_p; do
  step warm_$c 60 python3 $P 1024 $c
  step ncu_$c 120 $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 --section SourceCounters \
    --section WarpStateStats -o $H200_OUT/$c -f python3 $P 1024 $c
  step src_$c 60 $NCU --import $H200_OUT/$c.ncu-rep --page source --csv --print-source sass
  gzip -f $H200_OUT/src_$c.log
done
step bitwise 120 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $PWD/build/abx/ws/csrc --out $H200_OUT/bitwise --tokens 64,1024,4096
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,2048,4096"
step base 60 $A --out $H200_OUT/base
step ws 60 $WS $A --out $H200_OUT/ws
step base2 60 $A --out $H200_OUT/base2
step ws_trace 60 $WS python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024 --trace --trace-save-max-tokens 1024 --out $H200_OUT/ws_trace
GLM5_FASTPATH_CSRC=$PWD/build/abx/ws/csrc run_tests wide 100 tests/moe/test_megamoe.py -k "wide or pool"
grep "M=" $H200_OUT/base.log $H200_OUT/ws.log $H200_OUT/base2.log | cut -c1-200
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log.gz' -o -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
