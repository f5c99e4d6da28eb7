#!/bin/bash
# Prepared for the next session (not run): the wide builds' per-thread column-scale layout
# (wide_scales_per_thread_untested.patch) against the checkout, on one H200 call (~250 s).
#   prepare here:  P=benchmarks/results/2026-11-30_h200_session12/next
#                  rm -rf build/abx/ws && mkdir -p build/abx/ws && cp -r csrc build/abx/ws/ &&
#                  (cd build/abx/ws && patch -p1 < ../../../$P/wide_scales_per_thread_untested.patch)
#   run:           C=<commit> bash $P/s13c1_wide_scales.sh   with carry .carry/jit.tar.xz .carry/h200site.tar.xz build/abx/ws
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
WS="env GLM5_FASTPATH_CSRC=$PWD/build/abx/ws/csrc"
# bitwise: 1024 / 4096 tokens take bn128 + pool by default (the builds the patch changes); 64 a narrow build
step bitwise 120 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $PWD/build/abx/ws/csrc --out $H200_OUT/bitwise --tokens 64,1024,4096
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,2048,4096"
step base 60 $A --out $H200_OUT/base
step ws 60 $WS $A --out $H200_OUT/ws
step ws_trace 60 $WS python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024 --trace --trace-save-max-tokens 1024 --out $H200_OUT/ws_trace
GLM5_FASTPATH_CSRC=$PWD/build/abx/ws/csrc run_tests wide 120 tests/moe/test_megamoe.py -k "wide or pool"  # the patched tree
grep "M=" $H200_OUT/base.log $H200_OUT/ws.log | cut -c1-200
h200_pack
