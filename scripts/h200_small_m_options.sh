#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) timing the opt-in small-M options against the defaults, each step under its own
# time limit, straight into OUTDIR (tar it at the end of the device command):
#   1. bench prefix-ops (ours only, the GEMM ops B0 / B1 / D1 / D0) at M = 1, 16: default configs, then with
#      GLM5_FASTPATH_FP8_GEMM_PIPE=2 (the stage-pair wgmma consumer)                           [T_POPS, 2 x 75 s]
#   2. bench moe --lean-fences, settings a and b at 1 / 8 / 128 tokens, no DeepGEMM            [T_MOE, 150 s]
#   3. bench prefix --modes full,full_prio_index,full_prio_b1 at M = 1, 16 (CMP launch priorities) [T_PRIO, 120 s]
#   4. bench router: the token-sliced decode kernel against split-K                            [T_ROUTER, 45 s]
# usage: scripts/h200_small_m_options.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
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
  el "$name"
  timeout "$limit" "$@" > "$out/$name.log" 2>&1
  el "$name rc=$?"
}
P=${T_POPS:-75}
step pops_pipe0 "$P" python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16 --ops B0,B1,D1,D0 --no-stock --out "$out/pops_pipe0"
step pops_pipe2 "$P" env GLM5_FASTPATH_FP8_GEMM_PIPE=2 python3 -m glm5_fastpath.cli bench prefix-ops --m 1,16 \
  --ops B0,B1,D1,D0 --no-stock --out "$out/pops_pipe2"
step moe_lean "${T_MOE:-150}" python3 -m glm5_fastpath.cli bench moe --settings a,b --tokens 1,8,128 --no-deepgemm \
  --lean-fences --out "$out/moe_lean"
step prefix_prio "${T_PRIO:-120}" python3 -m glm5_fastpath.cli bench prefix --modes full,full_prio_index,full_prio_b1 \
  --ms 1,16 --kv-len 8192 --out "$out/prefix_prio"
step router "${T_ROUTER:-45}" python3 -m glm5_fastpath.cli bench router --tokens 1,2,4,8,16,32 --out "$out/router"
el "done"
