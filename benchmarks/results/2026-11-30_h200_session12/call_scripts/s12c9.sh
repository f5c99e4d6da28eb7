#!/bin/bash
# session 12 call 9: same-run A/B of the pool builds against the default (bn64) and DeepGEMM at (a) 256-4096 and
# (b) 1024 / 4096 tokens, routed experts (the basis for any default change at large token counts)
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe"
step pool_a 140 $B --settings a --tokens 256,512,1024,2048,4096 --configs bn64_s5_g512_w0_lf_p,bn128_s6_g512_w0_lf_p --out $H200_OUT/pool_a
step pool_b 60 $B --no-deepgemm --settings b --tokens 1024,4096 --configs bn64_s5_g512_w0_lf_p,bn128_s6_g512_w0_lf_p --out $H200_OUT/pool_b
grep "M=" $H200_OUT/pool_a.log $H200_OUT/pool_b.log | cut -c1-220; grep -h "_p |" $H200_OUT/pool_a/megamoe_bench.md $H200_OUT/pool_b/megamoe_bench.md
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -2M | tar -czf r.tgz -T - && rm -rf r
