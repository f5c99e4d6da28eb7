#!/bin/bash
# Session 14 call 3: the new default's threshold (bn64 vs its token-major builds at loads 48-70), the scheduler's group
# size with the new default at (a) 2048 / 4096, and the trace build of the new default at (a) 512 / 4096.
# run: C=<commit> bash this   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm"
CF=bn64_s5_g512_w0_lf,bn64_s5_g512_w0_lf_t,bn64_s5_g512_w0_lf_p_t
G=bn64_s5_g512_w0_lf_p_t,bn64_s5_g16_w0_lf_p_t,bn64_s5_g8_w0_lf_p_t,bn64_s5_g4_w0_lf_p_t
for r in 1 2; do
  step ta_$r 40 $B --settings a --tokens 128,192 --configs $CF --out $H200_OUT/ta_$r
  step tb_$r 50 $B --settings b --tokens 1024,1536 --configs $CF --out $H200_OUT/tb_$r
  step g_$r 50 $B --settings a --tokens 2048,4096 --configs $G --out $H200_OUT/g_$r
done
step trace 60 $B --settings a --tokens 512,4096 --trace --out $H200_OUT/trace
for f in $H200_OUT/*_[12]/megamoe_bench.md; do echo "== $f"; sed -n '/| setting | tokens | config/,$p' $f | grep "^| [ab] " | cut -d'|' -f2-6; done
h200_pack
