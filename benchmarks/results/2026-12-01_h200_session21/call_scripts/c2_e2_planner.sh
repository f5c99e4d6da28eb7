#!/bin/bash
# Session 21 call 2 (issue #5): the megakernel's E2 code shrunk (kItems 16 -> 8, the general path's store loop rolled
# over set bits) and the planner refitted on call 1's trace (per-op fixed costs, D0 per token block, a cold cost
# per run of an op on a queue, same-op queue reuse). GPU tests: megakernel (E2 family bitwise vs standalone) and the
# standalone E2 (its general path changed). Then A/B in one run, alternating: the new tree, the kernel before
# (build/abx/base: kItems 16, unrolled), kItems 16 rolled (build/abx/i16r), the old planner (build/abx/oldpy with
# the new csrc). Then the whole prefix: stock, CMP, MegaRTP same run; the traced megakernel.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz build/abx)
source scripts/h200_lib.sh
DEADLINE=570
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s21c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
run_tests e2 90 tests/ops/test_e2_topk.py
B="python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64"
for r in 1 2; do
  step new$r 40 $B --json "$H200_OUT/new$r.json"
  step base$r 40 env GLM5_FASTPATH_CSRC=$PWD/build/abx/base/csrc $B --json "$H200_OUT/base$r.json"
  step i16r$r 40 env GLM5_FASTPATH_CSRC=$PWD/build/abx/i16r/csrc $B --json "$H200_OUT/i16r$r.json"
  step oldplan$r 40 env GLM5_FASTPATH_CSRC=$PWD/csrc PYTHONPATH=$PWD/build/abx/oldpy:$SITE $B --json "$H200_OUT/oldplan$r.json"
done
step prefix 150 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/prefix" --ms 1,16,64 \
  --executors stock,cmp,megartp --timeline-modes none --replays 30
step mtrace 60 $B --json "$H200_OUT/mtrace.json" --trace "$H200_OUT/trace"
h200_pack
