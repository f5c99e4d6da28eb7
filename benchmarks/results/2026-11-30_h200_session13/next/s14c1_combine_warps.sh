#!/bin/bash
# Prepared for the next session (not run): FC2's combine counters and combine moved to two combine warps (WG0 warps 2-3; token-major pool
# builds only; combine_warps_untested.patch: compiles without spills here, nvcc 13.0). Trees:
#   cwoff = the patch with GLM5_MEGAMOE_COMBINE_WARPS 0 (only the combine_token refactor: the SASS of every build changes)
#   cw    = the patch with GLM5_MEGAMOE_COMBINE_WARPS 1
# prepare here:
#   P=benchmarks/results/2026-11-30_h200_session13/next
#   for t in cwoff cw; do rm -rf build/abx/$t && mkdir -p build/abx/$t && cp -r csrc build/abx/$t/ &&
#     (cd build/abx/$t && patch -p1 < ../../../$P/combine_warps_untested.patch); done
#   sed -i 's/^#define GLM5_MEGAMOE_COMBINE_WARPS 0$/#define GLM5_MEGAMOE_COMBINE_WARPS 1/' build/abx/cw/csrc/moe/megamoe.cuh
#   warm the JIT cache for both trees (GLM5_FASTPATH_CSRC=... python: compile_kernel of the default configs), tar it
# run: C=<commit> bash $P/s14c1_combine_warps.sh   (carry .carry/jit.tar.xz .carry/empty.tar.xz build/abx/cwoff build/abx/cw)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
step bitwise_cw 120 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $T/cw/csrc --out $H200_OUT/bitwise_cw --tokens 64,512,1024,4096
GLM5_FASTPATH_CSRC=$T/cw/csrc run_tests cw 150 tests/moe/test_megamoe.py -k "token_major or trace or pool"
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 512,1024,2048,4096"
for r in 1 2; do
  step head_$r 45 $A --out $H200_OUT/head_$r
  step cwoff_$r 45 env GLM5_FASTPATH_CSRC=$T/cwoff/csrc $A --out $H200_OUT/cwoff_$r
  step cw_$r 45 env GLM5_FASTPATH_CSRC=$T/cw/csrc $A --out $H200_OUT/cw_$r
done
step cw_trace 50 env GLM5_FASTPATH_CSRC=$T/cw/csrc python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024,4096 --trace --out $H200_OUT/cw_trace
for f in $H200_OUT/*_[12].log; do echo "$(basename $f) $(grep -o "ours= *[0-9.]*" $f | tr -s ' ' | paste -sd' ')"; done
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
