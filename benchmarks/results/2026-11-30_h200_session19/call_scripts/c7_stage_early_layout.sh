#!/bin/bash
# Session 19 call 7 (issue #5): call 4 had D1 on the critical path at 16 tokens (18.8 us: partial 6.7, staging
# 3.0, sum 2.1, epilogue 5.9) and B1 at 1 token. Every B1 / D1 partial now stages the first token block's
# epilogue inputs (positions, slots, w_raw, RoPE rows) right after its event wait, under its K loop, as the
# standalone kernel does, so the last arriver finds them ready. Megakernel GPU tests, then the traced bench at
# 1 / 16 / 64 tokens. Call 5 failed 14 B1 / D1 tests: the staged inputs sat where the plain mainloop keeps its
# scale arrays. Call 6 (mainloop instantiated with D1's epilogue) crashed: that tile stages D1's inputs itself.
# Now the plain tile on the carve-up with the largest finish scratch (SkinnyGemmTile kLayoutEpi).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s19.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s19.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 150 tests/attn_pre/megartp/test_megartp_device.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json" --trace "$H200_OUT/trace"
h200_pack
