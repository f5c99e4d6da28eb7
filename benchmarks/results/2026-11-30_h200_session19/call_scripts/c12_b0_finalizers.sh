#!/bin/bash
# Session 19 call 12 (issue #5): B0 row finalisers as plan tasks (the design article's B0 finalizer tiles): the
# partials only sum their weight tiles; one finaliser per token row waits for the M block's partials (an intra-op
# event) and runs split mode's row tile on its row; D0 / D1 / D2 wait for the finalisers of the rows they read.
# Call 8's trace had the 16 rows in series on one CTA (16.5 us at 16 tokens, 60 us at 64). Megakernel GPU tests,
# then the traced bench at 1 / 16 / 64 tokens.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19d.tar.xz)
source scripts/h200_lib.sh
DEADLINE=260
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19d.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 90 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
