#!/bin/bash
# Session 14 call 7: Nsight Compute on the new large-load default (bn64_s5_g512_w0_lf_p_t_e) at setting (a) 4096 tokens
# (routed experts only): speed of light, compute workload (pipe utilisation), warp states, memory workload, source
# counters (per-SASS stall samples). For the next K-loop step (docs/megamoe_large_m.md, Session 14, Next).
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session13/call_scripts/megamoe_ncu_probe.py
c=bn64_s5_g512_w0_lf_p_t_e
step ncu 240 $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 --section SpeedOfLight \
  --section ComputeWorkloadAnalysis --section WarpStateStats --section MemoryWorkloadAnalysis --section SourceCounters \
  --section LaunchStats --section Occupancy -o $H200_OUT/$c -f python3 $P 4096 $c
step details 60 $NCU --import $H200_OUT/$c.ncu-rep --page details --print-details all
step raw 60 $NCU --import $H200_OUT/$c.ncu-rep --page raw --csv
step src 60 $NCU --import $H200_OUT/$c.ncu-rep --page source --csv --print-source sass
gzip -f $H200_OUT/src.log $H200_OUT/raw.log
grep -E "Tensor|Pipe|Issue Slot|Stall|Throughput|Duration" $H200_OUT/details.log | head -60
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log.gz' -o -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
