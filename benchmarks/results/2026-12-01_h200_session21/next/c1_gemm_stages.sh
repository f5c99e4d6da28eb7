#!/bin/bash
# Prepared in session 21 for the next session (issue #5), not run: the megakernel's GEMM families with 8 weight
# stages in flight against the default 6: GPU tests with 8, two alternating rounds, a traced step with 8.
# .carry/jit_s21d.tar.xz (built at the end of session 21 for 7250444's csrc, with the 8-stage GLM-5 builds, production
# and trace) needs no refresh unless csrc changed since; otherwise refresh it (scripts/refresh_jit_cache.py) and add
# the 8-stage builds (compile device.kernel_spec(cfg, trace) with GLM5_FASTPATH_MRTP_GEMM_STAGES=8 into a cache dir
# passed with --add).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s21d.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s21d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
step gpu-tests-s8 160 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider \
  tests/attn_pre/megartp/test_megartp_device.py
for r in 1 2; do
  step s6_$r 40 $B --json "$H200_OUT/s6_$r.json"
  step s8_$r 40 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_$r.json"
done
step s8_trace 50 env GLM5_FASTPATH_MRTP_GEMM_STAGES=8 $B --json "$H200_OUT/s8_trace.json" --trace "$H200_OUT/trace"
h200_pack
