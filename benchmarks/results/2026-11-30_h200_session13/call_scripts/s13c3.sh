#!/bin/bash
# session 13 call 3: the token-major wide build (bn128 ... _t): GPU tests (bitwise vs the swapAB wide build, trace),
# bench (a) 256-4096 and (b) 1024 / 4096 against DeepGEMM fp8_mega_moe in the same run, ncu source counters at (a) 1024.
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/dgsite.tar.xz ; export GLM5_FASTPATH_COMMIT=$C SGLANG_JIT_DEEPGEMM_PRECOMPILE=false
run_tests tm 200 tests/moe/test_megamoe.py -k "token_major"
CF=bn128_s6_g512_w0_lf_p,bn128_s6_g512_w0_lf_p_t,bn64_s5_g512_w0_lf
step a 150 python3 -m glm5_fastpath.cli bench moe --settings a --tokens 256,512,1024,2048,4096 --configs $CF --out $H200_OUT/a
step b 90 python3 -m glm5_fastpath.cli bench moe --settings b --tokens 1024,4096 --configs $CF --out $H200_OUT/b
NCU=/usr/local/cuda/bin/ncu
P=benchmarks/results/2026-11-30_h200_session13/call_scripts/megamoe_ncu_probe.py
c=bn128_s6_g512_w0_lf_p_t
step ncu_$c 60 $NCU -k regex:'^glm5_megamoe$' --launch-skip 2 --launch-count 1 --section SourceCounters -o $H200_OUT/$c -f python3 $P 1024 $c
step src_$c 40 $NCU --import $H200_OUT/$c.ncu-rep --page source --csv --print-source sass
gzip -f $H200_OUT/src_$c.log
grep -h "M=" $H200_OUT/a.log $H200_OUT/b.log | cut -c1-250
grep -E "passed|failed|Error" $H200_OUT/gpu-tests-tm.log | tail -5
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log.gz' -o -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.png' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
