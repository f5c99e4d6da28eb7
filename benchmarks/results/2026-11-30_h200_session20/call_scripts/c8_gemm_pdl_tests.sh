#!/bin/bash
# Session 20 call 8 (issue #3): the standalone skinny GEMMs after this session's SkinnyFinish changes (the straight-line
# cross-warp reduce, the epilogue mark hook): the late-producer PDL tests, graph replays with changing inputs and
# the GPU error cases (plain and rotated epilogues), and the PDL wait-point tests.
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_s20f.tar.xz)
source scripts/h200_lib.sh
DEADLINE=250
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s20f.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests gemm_pdl 120 tests/ops/test_fp8_gemm.py -k "pdl_late_producer or cuda_graph_replay or gpu_error_cases"
run_tests rotate_pdl 70 tests/ops/test_fp8_gemm_rotate.py -k "pdl or graph"
run_tests wait_points 40 tests/ops/test_pdl_wait_points.py
h200_pack
