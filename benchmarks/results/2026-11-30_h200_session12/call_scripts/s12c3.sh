#!/bin/bash
# session 12 call 3: fold variants at (a) 256 / 1024 / 4096 tokens, routed experts, no DeepGEMM (kernel A/B only).
# head = 097aa42 csrc; v1 = the checkout (e9a6b48, pipelined fold); v3 = fold2 (both halves after wait<0>, shared
# scale products); v4 = wait<1> -> products + fold 0 -> wait<0> -> fold 1 with the same products, out-of-line traps;
# v4i = v4 with inline traps; v5 = head with out-of-line traps. Diffs: call_scripts/variant_*.diff
source scripts/h200_lib.sh
h200_setup "$OUT/r" ; export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false GLM5_FASTPATH_COMMIT=$C
B="python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings a --tokens 256,1024,4096"
for v in head v1 v3 v4 v4i v5 head2; do
  case $v in v1) T=$PWD/csrc ;; head2) T=$PWD/build/abx/s12/head/csrc ;; *) T=$PWD/build/abx/s12/$v/csrc ;; esac
  step $v 60 env GLM5_FASTPATH_CSRC=$T $B --out $H200_OUT/$v
done
for v in head v1 v3 v4 v4i v5 head2; do echo "== $v"; grep "M=" $H200_OUT/$v.log; done
cd "$OUT" && find r -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' \) -size -2M | tar -czf r.tgz -T - && rm -rf r
