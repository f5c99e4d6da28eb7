#!/bin/bash
# Session 22 call 4 (issues #5, #4, #3): the final code. The megakernel loads weights evict-first on every pass
# again (call 3's evict-normal on earlier token blocks was slower); the standalone GEMMs and D2 load them
# evict-first at M <= 16 (GLM5_FASTPATH_W_EVICT_FIRST=auto). GPU tests of the megakernel and of the CMP executor
# (its buckets <= 16 now run the evict-first builds), then the whole prefix, stock / CMP / MegaRTP, same run.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz)
source scripts/h200_lib.sh
DEADLINE=520
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step variants 120 python3 scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \
  --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu
run_tests mrtp 130 tests/attn_pre/megartp/test_megartp_device.py
run_tests cmp 150 tests/attn_pre/cmp/test_cmp_executor_gpu.py
step prefix 170 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,32,64 --timeline-modes none --replays 30 \
  --out "$H200_OUT/prefix" --executors stock,cmp,megartp
h200_pack
