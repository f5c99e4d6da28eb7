#!/usr/bin/env bash
# One lent-H200 call: localise a greedy-token divergence between the stock engine and glm5_fastpath by running
# the fastpath engine with one route at a time turned back to SGLang's (batch 1, short outputs), each in its own
# results folder; compare each variant's first_tokens with a stock run of the same prompts (same settings).
# usage: scripts/h200_engine_bisect.sh SITE.tar.xz OUTDIR [VARIANT ...]
#   variants: nosparse (GLM5_FASTPATH_SPARSE_MLA=sglang), prefix_only (MoE stock), moe_only (prefix stock),
#             all (the shipped table: the reference point),
#             perturb (the shipped table with 8 instead of 16 sparse-MLA splits at 1 token: only the fp32 summation
#             order of the attention combine changes, so its divergence from `all` is the model's own noise
#             amplification: a run that diverges from `all` as early as from stock says the early divergence is
#             rounding noise, not a wrong kernel),
#             shadow (an eager fastpath engine whose first 64 prefix and 64 MoE calls run ours AND SGLang's on the
#             same inputs and hand SGLang's result on: per-layer comparisons that do not compound,
#             integrations/sglang/shadow.py; plus the sparse-MLA check mode; lines in OUT/shadow/checks.log)
# env: T_VARIANT (seconds per variant, default 200: the first fastpath start on a fresh machine needed > 140 s on
#      2026-11-30), OUT_LEN (default 16), ENGINE_CACHE, REALISTIC_DUMMY
set -uo pipefail
site=$(realpath -m "${1:?usage}"); out=$(realpath -m "${2:?usage}"); shift 2  # absolute: the script cds
cd "$(dirname "$0")/.."
mkdir -p "$out"
[ $# -gt 0 ] || set -- nosparse prefix_only moe_only
for v in "$@"; do
  cfg=glm5_fastpath/configs/selection/h200.json; extra=()
  case $v in
    nosparse) extra=(GLM5_FASTPATH_SPARSE_MLA=sglang) ;;
    prefix_only|moe_only) cfg=benchmarks/tables/debug/$v.json ;;
    all) ;;
    perturb) extra=(GLM5_FASTPATH_SPARSE_MLA_SPLITS=1:8) ;;
    shadow) extra=(GLM5_FASTPATH_SHADOW_CHECK=64 GLM5_FASTPATH_SPARSE_MLA_CHECK=32
                   "EXTRA_ARGS=--engine-arg disable_cuda_graph=true --no-stream-pass") ;;
    *) echo "unknown variant $v" >&2; continue ;;
  esac
  echo "[$(date +%T)] variant $v" | tee -a "$out/bisect.log"
  env ${extra[@]+"${extra[@]}"} BS=1 OUT_LEN="${OUT_LEN:-16}" FASTPATH_CONFIG="$cfg" RES="$out/$v" WORKER_TIMEOUT="${T_VARIANT:-200}" \
    timeout $(( ${T_VARIANT:-200} + 40 )) scripts/h200_sglang_offline.sh "$site" fastpath > "$out/$v.log" 2>&1
  rc=$?  # before anything else resets $?
  echo "[$(date +%T)] variant $v rc=$rc" | tee -a "$out/bisect.log"
  if [ "$v" = shadow ]; then  # one JSON line per checked call (shadow.py, attn_core.py check mode)
    grep -h "shadow check [a-z]*: {\|sparse MLA check vs FlashMLA: {" "$out/$v"/worker-fastpath.log > "$out/$v/checks.log" 2>/dev/null
    echo "  checks: $(grep -c . "$out/$v/checks.log") (prefix $(grep -c 'shadow check prefix' "$out/$v/checks.log"), moe $(grep -c 'shadow check moe' "$out/$v/checks.log"), sparse MLA $(grep -c 'sparse MLA check' "$out/$v/checks.log")); failed $(grep -c '"passed": false' "$out/$v/checks.log"); not routed $(grep -c '"passed": null' "$out/$v/checks.log")" >> "$out/bisect.log"
    echo "  (the shadow run's tokens are a hybrid of ours and SGLang's: compare the check lines, not the tokens)" >> "$out/bisect.log"
  fi
  python3 - "$out/$v" >> "$out/bisect.log" 2>&1 <<'PY'
import json, sys, pathlib
p = pathlib.Path(sys.argv[1]) / "mode-fastpath.json"
d = json.loads(p.read_text()) if p.exists() else {}
b = d.get("batches", {}).get("1", {})
print("  first_tokens", b.get("first_tokens"))
print("  first_logprobs", [round(x, 3) for x in b.get("first_logprobs", {}).get("logprobs", [])][:16])
PY
done
