#!/bin/bash
# Session 22 call 2 (issue #5): the megakernel's weight loads (GEMM families, D2's W_UK) with an L2 evict-first
# hint (GLM5_FASTPATH_MRTP_W_EVICT_FIRST=1), so the ~70 MB of weights streamed per step do not evict the kernel's
# ~600 KB of code and the step's activations from L2 (the code runs cold at ~50 ns per 128-byte line: session 20).
# GPU tests with the hint; alternating rounds plain / evict-first; call 1's E2 cost refit against the reverted
# constants in the same run (--cost); traced step with the hint; the whole prefix (CMP, MegaRTP) with the hint.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=480
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
EF="env GLM5_FASTPATH_MRTP_W_EVICT_FIRST=1"
step gpu-tests-ef 160 $EF python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider \
  tests/attn_pre/megartp/test_megartp_device.py
for r in 1 2; do
  step plain_$r 35 $B --json "$H200_OUT/plain_$r.json"
  step ef_$r 35 $EF $B --json "$H200_OUT/ef_$r.json"
done
step e2refit 35 $B --cost E2.fixed=9.5,E2.cold=1 --json "$H200_OUT/e2refit.json"
step ef_trace 50 $EF $B --json "$H200_OUT/ef_trace.json" --trace "$H200_OUT/trace"
step prefix_ef 120 $EF python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix_ef" --ms 1,16,64 \
  --executors cmp,megartp --timeline-modes none --replays 30
h200_pack
