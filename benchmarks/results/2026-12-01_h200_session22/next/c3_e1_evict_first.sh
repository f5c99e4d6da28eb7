#!/bin/bash
# Prepared in session 22 (issue #5), not run: the megakernel's E1 family with its index-K cache pages loaded
# evict-first (GLM5_FASTPATH_MRTP_E1_EVICT_FIRST=1) on top of the evict-first weights (the default build). With the
# weights evict-first, E1's cache stream (18 MB at 16 sequences of 8192 tokens, 72 MB at 64) is the step's largest
# normal-priority stream, and at 64 tokens it alone exceeds L2: the weights' hint gained 25 % / 18 % at 1 / 16 tokens
# and nothing at 64. GPU tests with it, alternating rounds, a traced step.
# JIT cache: .carry/jit_s22e.tar.xz holds both builds for bdc4efe's csrc (refresh it if csrc changed since).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22e.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
E1="env GLM5_FASTPATH_MRTP_E1_EVICT_FIRST=1"
step gpu-tests-e1ef 150 $E1 python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider tests/attn_pre/megartp/test_megartp_device.py
for r in 1 2; do
  step base_$r 35 $B --json "$H200_OUT/base_$r.json"
  step e1ef_$r 35 $E1 $B --json "$H200_OUT/e1ef_$r.json"
done
step e1ef_trace 50 $E1 $B --json "$H200_OUT/e1ef_trace.json" --trace "$H200_OUT/trace"
h200_pack
