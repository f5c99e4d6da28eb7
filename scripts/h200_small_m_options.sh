#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) timing the opt-in small-M options against the defaults (session 8), into OUTDIR:
#   1. bench prefix-ops (ours only, the GEMM ops B0 / B1 / D1 / D0) at M = 1, 16: default configs, then with
#      GLM5_FASTPATH_FP8_GEMM_PIPE=2 (the stage-pair wgmma consumer)                           [T_POPS, 2 x 75 s]
#   2. bench moe --lean-fences (both fence builds), settings a and b at 1 / 8 / 128 tokens, no DeepGEMM [T_MOE, 150 s]
#   3. bench prefix --modes full,full_prio_index,full_prio_b1 at M = 1, 16 (CMP launch priorities; the stock
#      chain with SGLang's fused top-k)                                                       [T_PRIO, 120 s]
#   4. bench fp8-linear --variants persist,pipe2 (the FP8-linear shapes)                        [T_LINEAR, 120 s]
#   5. bench router: the token-sliced decode kernel against split-K and stock                  [T_ROUTER, 45 s]
# usage: scripts/h200_small_m_options.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]; env DEADLINE (s, default 570)
set -uo pipefail
source "$(dirname "$0")/h200_lib.sh"
h200_setup "$@"
cli="python3 -m glm5_fastpath.cli"
P=${T_POPS:-75}
step pops_pipe0 "$P" $cli bench prefix-ops --m 1,16 --ops B0,B1,D1,D0 --no-stock --out "$H200_OUT/pops_pipe0"
step pops_pipe2 "$P" env GLM5_FASTPATH_FP8_GEMM_PIPE=2 $cli bench prefix-ops --m 1,16 --ops B0,B1,D1,D0 --no-stock \
  --out "$H200_OUT/pops_pipe2"
step moe_lean "${T_MOE:-150}" $cli bench moe --settings a,b --tokens 1,8,128 --no-deepgemm --lean-fences \
  --out "$H200_OUT/moe_lean"
step prefix_prio "${T_PRIO:-120}" $cli bench prefix --modes full,full_prio_index,full_prio_b1 --ms 1,16 --kv-len 8192 \
  --out "$H200_OUT/prefix_prio"
step fp8_linear "${T_LINEAR:-120}" env SGLANG_JIT_DEEPGEMM_PRECOMPILE=false $cli bench fp8-linear \
  --variants persist,pipe2 --out "$H200_OUT/fp8_linear"
step router "${T_ROUTER:-45}" $cli bench router --tokens 1,2,4,8,16,32 --out "$H200_OUT/router"
el "done"
