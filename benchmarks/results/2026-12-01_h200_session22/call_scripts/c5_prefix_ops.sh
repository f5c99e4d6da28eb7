#!/bin/bash
# Session 22 call 5 (issue #3): the per-op table (ours and stock, same run) at M = 1 / 16 / 64 with the final code
# (standalone GEMMs and D2 evict-first at M <= 16), then the same with GLM5_FASTPATH_W_EVICT_FIRST=0 (plain loads).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz)
source scripts/h200_lib.sh
DEADLINE=250
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step variants 60 python3 scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \
  --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu
step prefix_ops 110 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16,64 --out "$H200_OUT/prefix_ops"
step prefix_ops_plain 100 env GLM5_FASTPATH_W_EVICT_FIRST=0 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16 \
  --out "$H200_OUT/prefix_ops_plain"
h200_pack
