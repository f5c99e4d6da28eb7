#!/bin/bash
# Session 16 call 6: Nsight Compute on the prefix's FP8 GEMMs at M = 16 with their tuned configs (QKV-A, indexer Q,
# q_b; plain epilogue), the third launch of each, real clocks: memory throughput, warp stalls, occupancy. Why B0
# streams its 16 MB at ~1.5-1.8 TB/s (README of this folder, result 2), for the next session's B0 work (#3 / #4).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session16/call_scripts/gemm_ncu_probe.py
step ncu 130 $NCU -k regex:'^glm5_fp8_gemm_wgmma$' --clock-control none --launch-count 9 --section SpeedOfLight \
  --section MemoryWorkloadAnalysis --section WarpStateStats --section SchedulerStats --section LaunchStats \
  --section Occupancy -o $H200_OUT/gemms -f python3 $P 16
step details 40 $NCU --import $H200_OUT/gemms.ncu-rep --page details --print-details all
h200_pack 8
