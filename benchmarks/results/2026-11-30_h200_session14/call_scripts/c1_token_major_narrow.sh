#!/bin/bash
# Prepared for the next session (not run): the narrow token-major build (bn64 ..._t: the block's 64 tokens on the wgmma
# M side of both math warpgroups, each warpgroup 128 of the 256-row tile on N; FC1's per-token amax exchanged between
# the two warpgroups through shared memory). token_major_narrow_untested.patch touches csrc, megamoe.py (config
# validation) and the tests; every existing build's SASS stays byte-identical (cuobjdump, 25 builds), the two new ones
# compile without spills (nvcc 13.0). It conflicts with combine_warps_untested.patch (same file): one at a time.
# prepare here: git apply benchmarks/results/2026-11-30_h200_session13/next/token_major_narrow_untested.patch, commit,
#   warm the JIT cache (bn64_s5_g512_w0_lf_t, bn64_s5_g512_w0_lf_p_t, bn64_s5_g512_w0_lf_p + the defaults)
# run: C=<commit> bash $P/s14c2_token_major_narrow.sh   (carry .carry/jit.tar.xz .carry/empty.tar.xz)
source scripts/h200_lib.sh
h200_setup "$OUT/r" .carry/empty.tar.xz ; export GLM5_FASTPATH_COMMIT=$C
run_tests tmn 200 tests/moe/test_megamoe.py -k "token_major"
CF=bn64_s5_g512_w0_lf,bn64_s5_g512_w0_lf_t,bn64_s5_g512_w0_lf_p_t,bn128_s6_g512_w0_lf_p_t
for r in 1 2; do
  step a_$r 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 64,128,256,512 --configs $CF --out $H200_OUT/a_$r
  step b_$r 60 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 512,1024,2048 --configs $CF --out $H200_OUT/b_$r
done
for f in $H200_OUT/[ab]_[12]/megamoe_bench.md; do echo "== $f"; sed -n '/| setting | tokens | config/,$p' $f | grep "^| [ab] "; done
cd "$(dirname "$H200_OUT")" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -8M | tar -czf r.tgz -T - && rm -rf r
