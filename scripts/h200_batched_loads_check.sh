#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) for the batched split-K partial loads (skinny GEMM finish, MegaMoE combine,
# sparse-MLA combine) and the lean-fences MegaMoE default, each step under its own time limit, into OUTDIR:
#   1. bench prefix-ops (ours only) B0 / B1 / D1 at M = 1, 16                                  [45 s]
#   2. bench moe, setting b, 1 / 8 tokens, no DeepGEMM                                          [40 s]
#   3. bench sparse-mla at 1 / 8 / 16 tokens (FlashMLA in the same run)                         [45 s]
#   4. GPU tests, one pytest per file: tests/moe/test_megamoe.py [60 s], tests/ops/test_sparse_mla.py [45 s],
#      tests/ops/test_moe_router.py [20 s], tests/ops/test_fp8_gemm.py (last, verbose: it compiles its
#      test-only variants)                                                                    [T_GEMM, 60 s]
# usage: scripts/h200_batched_loads_check.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
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
step() {  # name, limit, command...
  local name=$1 limit=$2; shift 2
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  el "$name rc=$? ($(tail -1 "$out/$name.log" | cut -c1-200))"
}
step pops 45 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16 --ops B0,B1,D1 --no-stock --out "$out/pops"
step moe 40 python3 -m glm5_fastpath.cli bench moe --settings b --tokens 1,8 --no-deepgemm --out "$out/moe"
step sparse_mla 45 python3 -m glm5_fastpath.cli bench sparse-mla --tokens 1,8,16 --out "$out/sparse_mla"
step tests_megamoe 60 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/moe/test_megamoe.py
step tests_sparse_mla 45 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/ops/test_sparse_mla.py
step tests_router 20 python3 -m pytest -m gpu -q -rfEs -p no:cacheprovider tests/ops/test_moe_router.py
step tests_fp8_gemm "${T_GEMM:-60}" python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider tests/ops/test_fp8_gemm.py
el "done"
