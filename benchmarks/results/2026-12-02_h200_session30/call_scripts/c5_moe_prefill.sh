#!/bin/bash
# Session 30 call 5 (issue #9, #6; c2 again after the bench fix: global server args stand-in): reassemble the engine site from c1's parked part + this call's; then
#   1. bench moe-prefill: the MoE of one prefill chunk (128-8192 tokens), SGLang 0.5.14's Triton fused MoE (what the
#      stock engine's prefill runs at TP1 on Hopper) against MegaMoE, same weights / routing, with the same-run floor;
# run: C=<commit> bash this   (carry .carry/h200site.part.ab .carry/jit_s30.tar.xz)
set -uo pipefail
cp .carry/h200site.part.a[b-z] build/h200parts/ && cat build/h200parts/h200site.part.* > build/h200site.tar.xz \
  && xz -t build/h200site.tar.xz || { echo "site parts missing (c1 not on this machine?)"; exit 3; }
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
mkdir -p /tmp/site && tar -xJf build/h200site.tar.xz -C /tmp/site
mkdir -p "$OUT/moe_prefill" /tmp/jitb build/h200-cache && tar -xJf ${JIT:-.carry/jit_s30.tar.xz} -C /tmp/jitb
# the engine script's cache dirs (Triton's: the bench's fused-MoE compiles are then warm for the stock engine)
PYTHONPATH=/tmp/site:$PWD GLM5_FASTPATH_CACHE_DIR=/tmp/jitb TRITON_CACHE_DIR=$PWD/build/h200-cache/triton \
  TORCHINDUCTOR_CACHE_DIR=$PWD/build/h200-cache/inductor XDG_CACHE_HOME=$PWD/build/h200-cache/xdg timeout 200 python3 -m glm5_fastpath.cli bench moe-prefill --out "$OUT/moe_prefill" \
  --tokens 128,256,512,1024,2048,4096,8192 > "$OUT/moe_prefill/log.txt" 2>&1; echo "moe-prefill rc=$?"
tail -14 "$OUT/moe_prefill/log.txt"
# the route's CPU tests + the seam tests against the real sglang 0.5.14 package, on this machine
PYTHONPATH=/tmp/site:$PWD timeout 120 python3 -m pytest -q -p no:cacheprovider tests/integrations/sglang/test_sglang_real.py \
  tests/integrations/sglang/test_moe_route.py tests/integrations/sglang/test_sglang_decision.py \
  tests/integrations/sglang/test_sglang_install.py > "$OUT/moe_prefill/route_tests.txt" 2>&1; echo "route tests rc=$?"
tail -3 "$OUT/moe_prefill/route_tests.txt"
