#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) for the skinny FP8 GEMM's launch options (persistent launch, stage-pair consumer):
#   1. GPU tests: bitwise equality of every option against the baseline wgmma kernel
#      (tests/ops/test_fp8_gemm.py -k "persistent or wgmma_options") and the FP8-linear route against its float64
#      reference at o_proj's shape (tests/integrations/sglang/test_linear_route.py)               [T_TESTS, 150 s]
#   2. bench fp8-linear --variants waves,pipe2: o_proj / dense gate_up / down, ours (config_for) vs SGLang's path,
#      with the one-CTA-per-unit launch and the stage-pair consumer as extra columns              [T_LINEAR, 200 s]
#   3. the GPU test files that a time limit cut short on 2026-11-30 (session 8, call 1): the rest of
#      test_fp8_gemm.py and tests/attn_pre, tests/integrations, tests/ref, tests/graph, tests/bench, verbose  [DEADLINE]
# usage: scripts/h200_gemm_options_check.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]; env DEADLINE (s, default 570)
set -uo pipefail
out=${1:?usage: $0 OUTDIR [SITE.tar.xz] [JIT.tar.xz]}
site_tar=${2:-.carry/h200site.tar.xz}
jit_tar=${3:-.carry/jit.tar.xz}
cd "$(dirname "$0")/.."
mkdir -p "$out"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/steps.log"; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - t0) )); }
export SITE=${SITE:-/tmp/site} PYTHONUNBUFFERED=1
export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-/tmp/glm5jit}
[ -d "$SITE/sglang" ] || { mkdir -p "$SITE" && tar -xJf "$site_tar" -C "$SITE"; }
[ -d "$GLM5_FASTPATH_CACHE_DIR/sm_90a" ] || { mkdir -p "$GLM5_FASTPATH_CACHE_DIR" && tar -xJf "$jit_tar" -C "$GLM5_FASTPATH_CACHE_DIR"; }
export PYTHONPATH="$SITE:$PWD"
el "unpacked; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"
run_tests() {  # name, limit, pytest args... (one -k per pytest run)
  local name=$1 limit=$2; shift 2
  local l; l=$(left); [ "$l" -lt 30 ] && { el "skip $name (deadline)"; return; }
  [ "$limit" -gt "$l" ] && limit=$l
  timeout "$limit" python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider --durations=15 "$@" > "$out/gpu-tests-$name.log" 2>&1
  el "GPU tests $name rc=$? ($(tail -1 "$out/gpu-tests-$name.log"))"
}
T=${T_TESTS:-150}
run_tests gemm_options $(( T * 2 / 3 )) tests/ops/test_fp8_gemm.py -k "persistent or wgmma_options"
run_tests linear_route $(( T / 3 )) tests/integrations/sglang/test_linear_route.py
el "bench fp8-linear"
export SGLANG_JIT_DEEPGEMM_PRECOMPILE=false  # the stock path JIT-compiles only the M it runs (no 16384-M warmup per shape)
timeout "${T_LINEAR:-200}" python3 -m glm5_fastpath.cli bench fp8-linear --variants waves,pipe2 --out "$out/fp8_linear" \
  > "$out/fp8_linear.log" 2>&1; el "bench fp8-linear rc=$?"
run_tests gemm_rest 200 tests/ops/test_fp8_gemm.py -k "not persistent and not wgmma_options"
run_tests rest 600 tests/attn_pre tests/integrations tests/ref tests/graph tests/test_tune.py tests/bench
el "done"
