#!/usr/bin/env bash
# One lent-H200 call (<= 10 min): the whole GPU test suite in a few groups (one pytest per group, each under
# its own time limit, so a slow or hung group still leaves the others' logs), then optional benchmarks while a
# deadline allows. Writes straight into OUTDIR; tar OUTDIR at the end of the device command.
#   usage: scripts/h200_gpu_suite.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
#   env:   DEADLINE (s, default 560) - no step starts that could not finish before it;
#          BENCH=1 adds bench fp8-linear and bench router after the tests.
set -uo pipefail
out=${1:?usage: $0 OUTDIR [SITE.tar.xz] [JIT.tar.xz]}
site_tar=${2:-.carry/h200site.tar.xz}
jit_tar=${3:-.carry/jit.tar.xz}
cd "$(dirname "$0")/.."
mkdir -p "$out"
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*" | tee -a "$out/steps.log"; }
left() { echo $(( ${DEADLINE:-560} - ($(date +%s) - t0) )); }
export SITE=${SITE:-/tmp/site} PYTHONUNBUFFERED=1
export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-/tmp/glm5jit}
[ -d "$SITE/sglang" ] || { mkdir -p "$SITE" && tar -xJf "$site_tar" -C "$SITE"; }
[ -d "$GLM5_FASTPATH_CACHE_DIR/sm_90a" ] || { mkdir -p "$GLM5_FASTPATH_CACHE_DIR" && tar -xJf "$jit_tar" -C "$GLM5_FASTPATH_CACHE_DIR"; }
export PYTHONPATH="$SITE:$PWD"
el "unpacked; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

group() {  # name, limit, test paths... (no -k: a -k on a combined run would deselect other files)
  local name=$1 limit=$2; shift 2
  local l; l=$(left); [ "$l" -lt 30 ] && { el "skip $name (deadline)"; return; }
  [ "$limit" -gt "$l" ] && limit=$l
  timeout "$limit" python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider "$@" > "$out/gpu-tests-$name.log" 2>&1
  el "GPU tests $name rc=$? ($(tail -1 "$out/gpu-tests-$name.log"))"
}
group gemm 140 tests/ops/test_fp8_gemm.py tests/ops/test_fp8_gemm_rotate.py
group moe 140 tests/moe tests/ops/test_moe_router.py tests/ops/test_act_quant.py
group ops 150 tests/ops/test_e2_topk.py tests/ops/test_e1_indexer_logits.py tests/ops/test_sparse_mla.py \
  tests/ops/test_add_rmsnorm_quant.py tests/ops/test_c0_head_gate.py tests/ops/test_d2_absorb.py \
  tests/ops/test_sm90_primitives.py tests/ops/test_l2_prefetch.py tests/ops/test_pdl_wait_points.py
group rest 120 tests/attn_pre tests/integrations tests/ref tests/graph tests/test_tune.py tests/bench

if [ "${BENCH:-0}" = 1 ]; then
  [ "$(left)" -gt 100 ] && { timeout $(( $(left) - 10 )) python3 -m glm5_fastpath.cli bench fp8-linear --out "$out/fp8_linear" \
    > "$out/fp8_linear.log" 2>&1; el "bench fp8-linear rc=$?"; }
  [ "$(left)" -gt 40 ] && { timeout $(( $(left) - 5 )) python3 -m glm5_fastpath.cli bench router --out "$out/router" \
    --tokens 1,2,4,8,16,32 > "$out/router.log" 2>&1; el "bench router rc=$?"; }
fi
el "done"
