#!/bin/bash
# Session 37 c5: stage part aa of the SGLang site (for c6 right after, same machine), then the GPU tests of D2's
# q_cat form (new) and of the plain D2 op (its header changed: D2Ptrs head stride, D2KvStoreWarp's second target).
# run: C=<commit> bash this   (carry .carry/jit_s37.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=200
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s37.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests d2-qcat 120 tests/ops/test_d2_absorb_qcat.py
run_tests d2 90 tests/ops/test_d2_absorb.py -k "glm5 or late_producer or graph"
h200_pack
