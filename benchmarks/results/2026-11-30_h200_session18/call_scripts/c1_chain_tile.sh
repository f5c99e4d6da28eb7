#!/bin/bash
# Session 18 call 1 (prepared in session 17: compiled for sm_90a and
# CPU-tested, NOT yet run on a GPU). The gemm chain with TILE dependencies (GLM5_CHAIN_TILE: A tile-major, B's k block
# g gated on A's tile g only) against the grid-wide chain and two PDL launches: does a consumer that trails the
# producer tile by tile hide the ~4 us per-hop latency that session 17 measured after a grid-wide dependency?
# First the chain GPU tests (grid and tile cases: bitwise = two forced-config launches, repeated launches, graph
# replays, counters back at 0) and the GEMM diagnostics' GPU tests, then bench gemm-chain (B0 -> D1 and B0 -> D0 at 1 / 16 tokens, with phases). ~2 min.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests chain 120 tests/ops/test_fp8_gemm_chain.py
# the review commit 0c3c4f9 moved the phase-array reads onto Module.copy_global and the benches onto bench/gemm_inputs
# after the last GPU call: re-run their GPU tests
run_tests diag 90 tests/bench/test_gemm_phases.py tests/bench/test_gemm_layout.py
step chain 150 python3 -m glm5_fastpath.cli bench gemm-chain --out "$H200_OUT/chain" --tokens 1,16
h200_pack
