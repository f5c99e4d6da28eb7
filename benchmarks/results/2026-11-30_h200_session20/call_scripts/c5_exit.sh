#!/bin/bash
# Session 20 call 5 (issue #5): the megakernel's exit without an awaited atomic (every CTA stores the epoch it ran,
# a relaxed red counts exits). Megakernel GPU tests (epoch / state semantics included), then the bench (framework
# cost of empty plans + the subgraph) alternating this commit's kernel and the previous one
# (build/abx/s20exit_old/csrc = 6125703's csrc: the atomic exit), the first run traced.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20e.tar.xz .carry/jit_s20d.tar.xz build/abx/s20exit_old)
source scripts/h200_lib.sh
DEADLINE=400
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
tar -xJf .carry/jit_s20d.tar.xz -C "$GLM5_FASTPATH_CACHE_DIR"  # the old tree's kernels
OLD="env GLM5_FASTPATH_CSRC=$PWD/build/abx/s20exit_old/csrc"
run_tests mrtp 120 tests/attn_pre/megartp/test_megartp_device.py
step new1 70 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new1.json" --trace "$H200_OUT/trace"
step old1 40 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old1.json"
step new2 40 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/new2.json"
step old2 40 $OLD python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/old2.json"
h200_pack
