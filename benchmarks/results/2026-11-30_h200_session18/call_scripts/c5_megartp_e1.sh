#!/bin/bash
# Session 18 call 5 (issue #5): the MegaRTP megakernel with its new E1 family (E1IndexerLogitsTile on the 256
# workers, q / cache rows packed until the MMA step). The whole megakernel GPU test file (families alone: D2,
# B0, B1, D1, E1 bitwise vs the standalone kernels; the supported subgraph B0+B1+D1+D2+E1 with cross-SM
# events, epochs, CUDA-graph replays, trace; the executor), the standalone E1 op's GPU tests (the tile's new
# template option must leave them unchanged), then the megakernel bench (framework cost, subgraph per M).
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=540
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests mrtp 260 tests/attn_pre/megartp/test_megartp_device.py
run_tests e1 150 tests/ops/test_e1_indexer_logits.py
step bench 100 python3 -m glm5_fastpath.attn_pre.megartp.bench --ms 1,16,64 --json "$H200_OUT/megartp_bench.json"
h200_pack
