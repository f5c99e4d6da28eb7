#!/bin/bash
# Session 22 call 3 (issues #5, #4): the megakernel with evict-first weights as its default build, now evict-normal
# on a GEMM tile's earlier token blocks (call 2: evict-first everywhere lost ~1 % at 64 tokens, where each weight
# tile is read once per 16-token block). GPU tests of the default build; alternating rounds default / plain
# (GLM5_FASTPATH_MRTP_W_EVICT_FIRST=0); the whole prefix with stock, CMP and MegaRTP; then CMP with the standalone
# GEMMs and D2 on evict-first weights too (GLM5_FASTPATH_W_EVICT_FIRST=1, variants compiled here first).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=540
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step variants 150 python3 scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \
  --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
for r in 1 2; do
  step ef_$r 35 $B --json "$H200_OUT/ef_$r.json"
  step plain_$r 35 env GLM5_FASTPATH_MRTP_W_EVICT_FIRST=0 $B --json "$H200_OUT/plain_$r.json"
done
P="python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 --timeline-modes none --replays 30"
step prefix 130 $P --out "$H200_OUT/prefix" --executors stock,cmp,megartp
step prefix_sef 100 env GLM5_FASTPATH_W_EVICT_FIRST=1 $P --out "$H200_OUT/prefix_sef" --executors cmp
h200_pack
