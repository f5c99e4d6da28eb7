#!/bin/bash
# Session 23 call 3 (issues #5, #4): dynamic dispatch with the claim split into phases across a GEMM
# instruction's CTA-wide barriers (call 2's delayed claim before the joins stalled GEMM tiles and deadlocked at
# claim-at-done). GPU tests; the megakernel bench: list, dynamic with leads 1.5 / 3 us, at readiness, at done;
# list and lead 1.5 again; a traced lead-1.5 step; then the whole prefix, stock / CMP / MegaRTP list / MegaRTP
# dynamic (default lead), same run.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=570
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
run_tests dynamic 120 tests/attn_pre/megartp/test_megartp_dynamic.py
step list_1 30 $B --scheduler list --json "$H200_OUT/list_1.json"
step lead1.5_1 30 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/lead1.5_1.json"
step lead3 30 $B --scheduler dynamic --claim-lead 3 --json "$H200_OUT/lead3.json"
step done 30 $B --scheduler dynamic --claim-lead done --json "$H200_OUT/done.json"
step ready 30 $B --scheduler dynamic --claim-lead ready --json "$H200_OUT/ready.json"
step list_2 30 $B --scheduler list --json "$H200_OUT/list_2.json"
step lead1.5_2 30 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/lead1.5_2.json"
step trace 45 $B --scheduler dynamic --claim-lead 1.5 --json "$H200_OUT/trace.json" --trace "$H200_OUT/trace"
step variants 40 python3 scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \
  --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu
step prefix 170 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 --timeline-modes none --replays 30 \
  --out "$H200_OUT/prefix" --executors stock,cmp,megartp,megartp_dynamic
h200_pack
