#!/bin/bash
# Prepared in session 21 for the next session (issue #5), not run: the megakernel's GEMM families with 8 weight
# stages in flight against the default 6, alternating, same run; then the whole prefix with the better one.
# Refresh the JIT cache first (python scripts/refresh_jit_cache.py .carry/jit_s21c.tar.xz --out .carry/jit_s22.tar.xz)
# and add the 8-stage builds: GLM5_FASTPATH_MRTP_GEMM_STAGES=8 compile of device.kernel_spec(cfg, trace) into a cache
# dir passed with --add.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
step gpu-tests-s8 160 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider \
  tests/attn_pre/megartp/test_megartp_device.py
for r in 1 2; do
  step s6_$r 40 $B --json "$H200_OUT/s6_$r.json"
  step s8_$r 40 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_$r.json"
done
step s8_trace 50 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_trace.json" --trace "$H200_OUT/trace"
h200_pack
