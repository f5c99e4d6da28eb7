#!/bin/bash
# session 12 call 6: the per-stage fence.proxy.async.shared::cta of the math warpgroups. nf = the checkout without
# it (timing only: the cp.async builds need it; the pool build _p, whose stages all come by TMA, does not).
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
A="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,1024,4096 --configs bn64_s5_g512_w0_lf_p"
NF="env GLM5_FASTPATH_CSRC=$PWD/build/abx/s12/nf/csrc"
step base 70 $A --out $H200_OUT/base
step nf 70 $NF $A --out $H200_OUT/nf
step nf_trace 60 $NF python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 1024 --trace --trace-save-max-tokens 1024 --out $H200_OUT/nf_trace
step base_b 40 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 128,1024 --out $H200_OUT/base_b
step nf_b 40 $NF python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 128,1024 --out $H200_OUT/nf_b
grep "M=" $H200_OUT/*.log | cut -c1-400
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.pt' \) -size -4M | tar -czf r.tgz -T - && rm -rf r
