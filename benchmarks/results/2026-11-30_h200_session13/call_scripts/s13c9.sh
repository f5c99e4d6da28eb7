#!/bin/bash
# session 13 call 9: where the token-major build starts to pay now (after the pool copy and fence changes): (a) 128 /
# 256 / 512 and (b) 2048 with bn64, the token-major pool build and the token-major cp.async build, twice.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
CF=bn64_s5_g512_w0_lf,bn128_s6_g512_w0_lf_p_t,bn128_s6_g512_w0_lf_t
for r in 1 2; do
  step a_$r 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 128,256,512 --configs $CF --out $H200_OUT/a_$r
  step b_$r 40 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 2048 --configs $CF --out $H200_OUT/b_$r
done
for f in $H200_OUT/[ab]_[12]/megamoe_bench.md; do echo "== $f"; sed -n '/| setting | tokens | config/,$p' $f | grep "^| [ab] "; done
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
