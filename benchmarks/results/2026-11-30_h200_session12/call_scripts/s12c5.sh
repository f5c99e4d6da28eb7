#!/bin/bash
# session 12 call 5: where the K loop's time goes at (a) 256 / 1024 tokens: the trace build with the new columns
# (wgmma waits, fold issue) for the default config, the no-load build (_d1) and no loads + no epilogues (_d3)
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
step tools 10 bash -c 'which ncu nsys; ls -d /usr/local/cuda*/bin 2>/dev/null; ls /usr/local/cuda*/bin 2>/dev/null | grep -i -E "ncu|nsys|nsight"; python3 -c "import cupti" ; echo done'
step trace_a 150 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,1024 --trace --trace-save-max-tokens 1024 --configs bn64_s5_g512_w0_lf_d1,bn64_s5_g512_w0_lf_d3 --out $H200_OUT/trace_a
step trace_b 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 128,1024 --trace --trace-save-max-tokens 0 --out $H200_OUT/trace_b
cat $H200_OUT/tools.log; grep "M=" $H200_OUT/trace_a.log $H200_OUT/trace_b.log
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.pt' \) -size -4M | tar -czf r.tgz -T - && rm -rf r
