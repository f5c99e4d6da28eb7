#!/bin/bash
# session 12 call 8: Nsight Compute on one MegaMoE launch at (a) 1024 tokens, bn64 (default) and bn128 + pool:
# pipe utilisation (tensor / shared memory), warp stall reasons, shared-memory wavefronts
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session12/call_scripts/megamoe_ncu_probe.py
step warm 60 python3 $P 1024 bn64_s5_g512_w0_lf   # JIT compile outside the profiler
step warm_p 60 python3 $P 1024 bn128_s6_g512_w0_lf_p
$NCU --query-metrics --chip gh100 > $H200_OUT/ncu_metrics.txt 2>&1
M=$(awk '{print $1}' $H200_OUT/ncu_metrics.txt | grep -E '^(sm__pipe_tensor_op_gmma_cycles_active|sm__pipe_tensor_cycles_active|sm__inst_executed_pipe_tensor_op_gmma|sm__pipe_shared_cycles_active|l1tex__data_pipe_lsu_wavefronts_mem_shared|smsp__inst_executed_op_shared_ld|l1tex__data_bank_conflicts_pipe_lsu_mem_shared)$' | sed 's/$/.avg.pct_of_peak_sustained_active/' | paste -sd, -)
el "metrics: $M"
S="--section SpeedOfLight --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section MemoryWorkloadAnalysis_Tables --section WarpStateStats --section SchedulerStats --section InstructionStats --print-details all"
for c in bn64_s5_g512_w0_lf bn128_s6_g512_w0_lf_p; do
  step ncu_$c 150 $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 $S ${M:+--metrics $M} python3 $P 1024 $c
done
grep -E "ERR|Error|error" $H200_OUT/ncu_*.log | head -5
grep -E "Tensor|tensor|Shared|shared|Stall|Issue Slots|Throughput|Busy" $H200_OUT/ncu_bn64*.log | head -60
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.txt' \) -size -4M | tar -czf r.tgz -T - && rm -rf r
