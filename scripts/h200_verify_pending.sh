#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) that checks and measures what session 7 (2026-11-30) wrote after its device budget
# ran out, each step with its own time limit, writing straight into OUTDIR (a call cut short still returns what
# finished; tar OUTDIR into one archive at the end of the device command):
#   1. GPU tests: the router + FP8-quant kernels (tests/ops/test_moe_router.py -k quant), the FP8-linear route's
#      kernels (tests/integrations/sglang/test_linear_route.py), the CMP priority modes
#      (tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "prio or early_wait")              [T_TESTS, default 170 s]
#      and MegaMoE's lean-fences build, bitwise vs the default over 40 launches each (-k lean)   [T_LEAN, 60 s]
#   2. bench fp8-linear: o_proj / dense gate_up / down, ours vs SGLang's Fp8LinearMethod path  [T_LINEAR, 110 s]
#   3. bench prefix --modes full,full_prio_index,full_prio_b1 at M = 1, 8, 16, 64             [T_PRIO, 100 s]
#   4. bench moe --settings b --tokens 1,8 --trace --lean-fences (raw trace rows for the small-M boundary analysis,
#      the lean-fences build timed next to the default)                                       [T_MOE, 100 s]
#   5. bench router: the token-sliced decode kernel against split-K at 1-32 tokens             [T_ROUTER, 40 s]
# usage: scripts/h200_verify_pending.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
set -uo pipefail
out=${1:?usage: $0 OUTDIR [SITE.tar.xz] [JIT.tar.xz]}
site_tar=${2:-.carry/h200site.tar.xz}
jit_tar=${3:-.carry/jit.tar.xz}
cd "$(dirname "$0")/.."
mkdir -p "$out"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/steps.log"; }
export SITE=${SITE:-/tmp/site} PYTHONUNBUFFERED=1
export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-/tmp/glm5jit}
[ -d "$SITE/sglang" ] || { mkdir -p "$SITE" && tar -xJf "$site_tar" -C "$SITE"; }
[ -d "$GLM5_FASTPATH_CACHE_DIR/sm_90a" ] || { mkdir -p "$GLM5_FASTPATH_CACHE_DIR" && tar -xJf "$jit_tar" -C "$GLM5_FASTPATH_CACHE_DIR"; }
export PYTHONPATH="$SITE:$PWD"
el "unpacked; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

# separate pytest runs: one -k per file (a -k on a combined run deselects the other files' tests)
run_tests() {  # name, limit, pytest args...
  local name=$1 limit=$2; shift 2
  timeout "$limit" python3 -m pytest -m gpu -q -rA -p no:cacheprovider "$@" > "$out/gpu-tests-$name.log" 2>&1
  el "GPU tests $name rc=$? ($(tail -1 "$out/gpu-tests-$name.log"))"
}
T=${T_TESTS:-170}
run_tests router_quant $(( T * 2 / 5 )) tests/ops/test_moe_router.py -k quant
run_tests linear_route $(( T / 5 )) tests/integrations/sglang/test_linear_route.py
run_tests cmp_prio $(( T * 2 / 5 )) tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "prio or early_wait"
run_tests megamoe_lean "${T_LEAN:-60}" tests/moe/test_megamoe.py -k lean

el "bench fp8-linear"
timeout "${T_LINEAR:-110}" python3 -m glm5_fastpath.cli bench fp8-linear --out "$out/fp8_linear" \
  > "$out/fp8_linear.log" 2>&1; el "bench fp8-linear rc=$?"

el "bench prefix (priority modes)"
timeout "${T_PRIO:-100}" python3 -m glm5_fastpath.cli bench prefix --modes full,full_prio_index,full_prio_b1 \
  --ms 1,8,16,64 --kv-len 8192 --out "$out/prefix_prio" > "$out/prefix_prio.log" 2>&1; el "bench prefix rc=$?"

el "bench moe --trace (small M)"
timeout "${T_MOE:-100}" python3 -m glm5_fastpath.cli bench moe --settings b --tokens 1,8 --trace --lean-fences --no-deepgemm \
  --out "$out/moe_trace" > "$out/moe_trace.log" 2>&1; el "bench moe rc=$?"
el "bench router"
timeout "${T_ROUTER:-40}" python3 -m glm5_fastpath.cli bench router --out "$out/router" --tokens 1,2,4,8,16,32 \
  > "$out/router.log" 2>&1; el "bench router rc=$?"
el "done"
