#!/bin/bash
# Prepared for the next session (NOT run here: this session's device time was spent). tm_pingpong_untested.patch
# (GLM5_MEGAMOE_TM_PINGPONG=1 in it): the two math warpgroups of the narrow token-major build take turns on the tensor
# pipe, stage by stage (named barriers 3 / 4; adds named_barrier_arrive to csrc/common/pdl.cuh). Applied to a copy of
# csrc it compiles without spills for sm_90a (nvcc 13.0; the trace build too), and with the macro at 0 every build's SASS
# is unchanged. Expected: the K loop's stage period from ~850 clocks toward ~600 (c7's ncu: tensor pipe 48 % active; the
# two warpgroups' groups interleave on the pipe, finish together and fold together). Caution: session 12 measured the
# same hand-off on the swapAB bn64 build (43c82a9, GLM5_MEGAMOE_PINGPONG) 3-5 % slower (docs/megamoe_large_m.md,
# Session 12); the token-major fold is 4x cheaper, the barrier hand-off costs the same. One call decides.
# prepare here:
#   rm -rf build/abx/pp && mkdir -p build/abx/pp && cp -r csrc build/abx/pp/ &&
#     (cd build/abx/pp && patch -p1 < ../../../benchmarks/results/2026-11-30_h200_session14/next/tm_pingpong_untested.patch) &&
#     sed -i 's/^#define GLM5_MEGAMOE_TM_PINGPONG 0$/#define GLM5_MEGAMOE_TM_PINGPONG 1/' build/abx/pp/csrc/moe/megamoe.cuh
#   warm the JIT cache for HEAD and for build/abx/pp (bn64_s5_g512_w0_lf_p_t, bn64_s5_g512_w0_lf_t, bn64_s5_g512_w0_lf_p,
#   bn64_s5_g512_w0_lf, the defaults; GLM5_FASTPATH_CSRC=$PWD/build/abx/pp/csrc for the tree), tar it to .carry/jit.tar.xz
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz build/abx/pp)
# A hang (a wrong hand-off) shows as a step killed by its timeout: then read the steps' logs, not the numbers.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
step bitwise 90 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $T/pp/csrc --out $H200_OUT/bitwise --tokens 256,4096
GLM5_FASTPATH_CSRC=$T/pp/csrc run_tests pp 120 tests/moe/test_megamoe.py -k "(token_major and 64) or end_combine or padding"
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
for r in 1 2; do
  step head_$r 40 $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/head_$r
  step pp_$r 40 env GLM5_FASTPATH_CSRC=$T/pp/csrc $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/pp_$r
done
step b_head 40 $B --settings b --tokens 2048,4096 --out $H200_OUT/b_head
step b_pp 40 env GLM5_FASTPATH_CSRC=$T/pp/csrc $B --settings b --tokens 2048,4096 --out $H200_OUT/b_pp
step pp_trace 40 env GLM5_FASTPATH_CSRC=$T/pp/csrc $B --settings a --tokens 1024,4096 --trace --out $H200_OUT/pp_trace
tail -2 $H200_OUT/bitwise.log; grep -E "passed|failed" $H200_OUT/gpu-tests-pp.log | tail -1
for f in $H200_OUT/*.log; do case $f in *steps.log|*bitwise*|*gpu-tests*) continue;; esac; echo "$(basename $f .log) $(grep -o "ours= *[0-9.]*" $f | tr -s ' ' | sed 's/ours= //' | paste -sd' ')"; done
h200_pack
