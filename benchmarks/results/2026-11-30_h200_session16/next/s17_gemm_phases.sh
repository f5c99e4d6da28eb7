#!/bin/bash
# Prepared for the next session (not run in session 16: the device budget was spent): the per-CTA phase breakdown
# of the prefix GEMMs (bench gemm-phases), to find where QKV-A's ~5 us beyond its bytes goes (launch spread, first
# TMA round trip, streaming, cluster reduce, epilogue). ~2 min of device time.
# Refresh the JIT archive first (csrc changed in session 16: every cache key moved):
#   GLM5_FASTPATH_CACHE_DIR=/tmp/jitpre python3 scripts/compile_check.py --cache-dir /tmp/jitpre && \
#   tar -C /tmp/jitpre -cJf .carry/jit_pre.tar.xz .
# run: C=<commit> bash this   (carry .carry/empty.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests phases 120 tests/bench/test_gemm_phases.py
step phases 150 python3 -m glm5_fastpath.cli bench gemm-phases --out "$H200_OUT/phases" --tokens 1,16,64
h200_pack
