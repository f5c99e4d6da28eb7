#!/bin/bash
# Session 15, call 11 (nvidia-h200): issue #6, the prepared warpgroup ping-pong of the narrow token-major build
# (benchmarks/results/2026-11-30_h200_session14/next/tm_pingpong_untested.patch, GLM5_MEGAMOE_TM_PINGPONG=1), trimmed to
# this session's remaining device time: bitwise A/B against HEAD's kernel, then setting (a) 256-4096 twice per tree.
# prepare: build/abx/pp = csrc + the patch with the macro at 1; .carry/jit_pp.tar.xz warmed for both trees
# run: C=<commit> bash .../c11_tm_pingpong.sh (carry .carry/jit_pp.tar.xz .carry/empty.tar.xz build/abx/pp)
source scripts/h200_lib.sh
DEADLINE=380
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_pp.tar.xz; export GLM5_FASTPATH_COMMIT=$C
T=$PWD/build/abx
step bitwise 90 python3 scripts/megamoe_bitwise_ab.py --a $PWD/csrc --b $T/pp/csrc --out $H200_OUT/bitwise --tokens 256,4096
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
for r in 1 2; do
  step head_$r 45 $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/head_$r
  step pp_$r 45 env GLM5_FASTPATH_CSRC=$T/pp/csrc $B --settings a --tokens 256,512,1024,2048,4096 --out $H200_OUT/pp_$r
done
for f in $H200_OUT/{head,pp}_[12]/megamoe_bench.md; do echo "== $f"; grep "^| a " $f | cut -d'|' -f2-6; done
h200_pack
