#!/bin/bash
# Prepared in session 22 (issue #5), not run: the planner's costs refitted on call 2's evict-first trace (the
# megakernel's default build since session 22), compared in one call through `bench --cost` (process-local
# overrides; nothing changes in the defaults until a set wins in two rounds). Model estimates (list, us) at
# 1 / 16 / 64 tokens: current 83 / 106 / 271, R1 76 / 99 / 242 (measured c2 / c4: 66 / 92-97 / 269-272).
#   R1: GEMM families, A0, C0, E1 fixed costs scaled to the evict-first trace medians (call 2, 1-16 tokens)
#   R2: R1 + E2 fixed 12.5 / cold 1 (E2's measured ~14 us first run; session 22 call 1's E2-only refit lost 14 us
#       at 1 token because the E path lost its priority over D0: watch E1's queue placement in the trace)
# JIT cache: refresh .carry/jit_s22d.tar.xz for the commit (scripts/refresh_jit_cache.py) if csrc changed.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s22d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
R1="A0.fixed=2.8,B0.fixed=6.6,B1.fixed=4.6,C0.fixed=4.8,D0.fixed=6.2,D1.fixed=4.9,E1.fixed=5.2"
R2="$R1,E2.fixed=12.5,E2.cold=1"
for r in 1 2; do
  step base_$r 35 $B --json "$H200_OUT/base_$r.json"
  step r1_$r 35 $B --cost "$R1" --json "$H200_OUT/r1_$r.json"
  step r2_$r 35 $B --cost "$R2" --json "$H200_OUT/r2_$r.json"
done
step r1_trace 50 $B --cost "$R1" --json "$H200_OUT/r1_trace.json" --trace "$H200_OUT/trace"
h200_pack
