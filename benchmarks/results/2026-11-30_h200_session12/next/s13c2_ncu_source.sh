#!/bin/bash
# Prepared for the next session (not run; the ncu flags of the source page are unverified here: no ncu on the CPU
# box): per-SASS-instruction warp-stall sampling of one MegaMoE launch at (a) 1024 tokens, to see which instructions
# of the math warps' K loop (the trace's "fold issue" and "rest") the warps stall on. ~150 s.
#   run: C=<commit> bash benchmarks/results/2026-11-30_h200_session12/next/s13c2_ncu_source.sh   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session12/call_scripts/megamoe_ncu_probe.py
for c in bn64_s5_g512_w0_lf bn128_s6_g512_w0_lf_p; do
  step warm_$c 60 python3 $P 1024 $c
  step ncu_$c 120 $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 --section SourceCounters \
    --section WarpStateStats -o $H200_OUT/$c -f python3 $P 1024 $c
  step src_$c 60 $NCU --import $H200_OUT/$c.ncu-rep --page source --csv --print-source sass
  gzip -k $H200_OUT/src_$c.log 2>/dev/null
done
ls -la $H200_OUT
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log.gz' -o -name 'steps.log' -o -name 'ncu_*.log' -o -name '*.ncu-rep' \) -size -20M | tar -czf r.tgz -T - && rm -rf r
