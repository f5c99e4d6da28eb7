#!/bin/bash
# Session 20 call 4 (issue #5): the calibrated scheduler cost model with reduce-group finishes (host only; the kernel
# is call 3's no-warm-up build). Megakernel GPU tests, then the bench alternating this commit's planner and the
# previous one's (build/abx/s20sched_old = 80c6486's glm5_fastpath + csrc on PYTHONPATH), traced once each.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20d.tar.xz build/abx/s20sched_old)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
OLD="env PYTHONPATH=$PWD/build/abx/s20sched_old:$PYTHONPATH"
run_tests mrtp 120 tests/attn_pre/megartp/test_megartp_device.py
step new1 70 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new1.json" --trace "$H200_OUT/trace_new"
step old1 70 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old1.json" --trace "$H200_OUT/trace_old"
step new2 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new2.json"
step old2 40 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old2.json"
h200_pack
