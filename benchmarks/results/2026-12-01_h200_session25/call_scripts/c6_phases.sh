#!/bin/bash
# Session 25 call 6: where a sparse-MLA call's time goes (benchmarks/sparse_mla_phases.py: split kernel alone, combine
# alone, the op), both tiles, T = 1..64.   run: C=<commit> bash this   (carry .carry/jit_s25.tar.xz)
source scripts/h200_lib.sh
DEADLINE=300
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s25.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step phases 200 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases"
h200_pack
