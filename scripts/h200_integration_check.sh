#!/usr/bin/env bash
# One lent-H200 call (<= 10 min) checking the SGLang routes before an engine benchmark (issues #7, #9):
#   1. unpack the carried site (scripts/build_h200_site.sh) and JIT cache (tar.xz of a warmed
#      GLM5_FASTPATH_CACHE_DIR) into /tmp
#   2. GPU tests of MegaMoE (tests/moe) and act_quant_fp8 (tests/ops/test_act_quant.py)
#   3. the route check inside real SGLang 0.5.14: prefix + MoE routes vs SGLang's own path, eager phase
#   4. bench decode-step (ours vs the stock kernel sequence) for the buckets in DS_BUCKETS (none: skipped)
#   5. optional: bench sparse-mla (T_SPARSE seconds, extra args SPARSE_ARGS), bench router (T_ROUTER seconds),
#      tune (T_TUNE seconds)
# A device call returns at most 8 files: pack OUTDIR into one tarball at the end of the command.
# The GPU-test log lists every test with its outcome (-rA), so a committed log names what ran.
# Every step has its own time limit and writes straight into OUTDIR, so a call cut short still returns
# what finished. usage: scripts/h200_integration_check.sh OUTDIR [SITE.tar.xz] [JIT.tar.xz]
set -uo pipefail
source "$(dirname "$0")/h200_lib.sh"
h200_setup "$@"
out=$H200_OUT
# the same JIT caches as scripts/h200_sglang_offline.sh, so an engine run earlier on this machine warms them
cache=$PWD/build/h200-cache; mkdir -p "$cache"
export TRITON_CACHE_DIR=$cache/triton TORCHINDUCTOR_CACHE_DIR=$cache/inductor SGLANG_DG_CACHE_DIR=$cache/deep_gemm
# ENGINE_CACHE=.carry/engine-cache.tar.xz (SAVE_CACHE=1 of h200_sglang_offline.sh): SGLang's JIT caches from an
# earlier machine, so the route check's engine start skips the cold Triton / DeepGEMM compiles
if [ -n "${ENGINE_CACHE:-}" ] && [ -f "$ENGINE_CACHE" ] && [ ! -e "$cache/.from-archive" ]; then
  tar -xJf "$ENGINE_CACHE" -C "$cache" && touch "$cache/.from-archive"
fi
el "engine caches ready"

el "GPU tests"
timeout "${T_TESTS:-200}" python3 -m pytest -m gpu -q -rA -p no:cacheprovider ${TESTS:-tests/moe tests/ops/test_act_quant.py} \
  ${TEST_K:+-k "$TEST_K"} > "$out/gpu-tests.log" 2>&1; el "GPU tests rc=$? ($(tail -1 "$out/gpu-tests.log"))"

el "route check (eager: prefix + MoE vs SGLang)"
[ "${T_ROUTE:-260}" -gt 0 ] && timeout "${T_ROUTE:-260}" python3 scripts/h200_prefix_route_check.py --phases "${ROUTE_PHASES:-eager}" --layers 1 \
  --moe-layers 1 --batches "${ROUTE_BATCHES:-1,4,16}" --out "$out/route" --timeout "${T_ROUTE:-260}" \
  > "$out/route.log" 2>&1; el "route check rc=$?"

left=$(( ${T_TOTAL:-570} - ($(date +%s) - H200_T0) - ${T_TUNE:-0} - ${T_SPARSE:-0} - ${T_ROUTER:-0} ))
el "bench decode-step (budget ${left}s)"
[ "$left" -gt 120 ] && [ "${DS_BUCKETS:-}" != none ] && timeout "$left" python3 -m glm5_fastpath.cli bench decode-step --out "$out/decode_step" \
  --buckets "${DS_BUCKETS:-1,16,64}" --repeat "${DS_REPEAT:-10}" --budget-s $(( left - 90 )) \
  --selection "${DS_TABLE:-benchmarks/tables/h200_engine_cmp_megamoe.json}" > "$out/decode_step.log" 2>&1
el "decode-step rc=$?"

# T_SPARSE=S: `glm5-fastpath bench sparse-mla` (our split-KV sparse MLA vs FlashMLA per token count), S seconds
if [ "${T_SPARSE:-0}" -gt 0 ]; then
  el "bench sparse-mla (budget ${T_SPARSE}s)"
  timeout "$T_SPARSE" python3 -m glm5_fastpath.cli bench sparse-mla --out "$out/sparse_mla" ${SPARSE_ARGS:-} \
    > "$out/sparse_mla.log" 2>&1
  el "bench sparse-mla rc=$?"
fi

# T_ROUTER=S: `glm5-fastpath bench router` (split-K vs decode router kernel vs stock), S seconds
if [ "${T_ROUTER:-0}" -gt 0 ]; then
  el "bench router (budget ${T_ROUTER}s)"
  timeout "$T_ROUTER" python3 -m glm5_fastpath.cli bench router --out "$out/router" > "$out/router.log" 2>&1
  el "bench router rc=$?"
fi

# T_TUNE=S: the last S seconds go to `glm5-fastpath tune` (prefix executors + MoE column) on TUNE_BUCKETS
if [ "${T_TUNE:-0}" -gt 0 ]; then
  left=$(( ${T_TOTAL:-570} - ($(date +%s) - H200_T0) ))
  el "tune (budget ${left}s)"
  timeout "$left" python3 -m glm5_fastpath.cli tune --out "$out/tune/selection.json" --buckets "${TUNE_BUCKETS:-1,16,64}" \
    --moe auto --moe-candidates "${TUNE_MOE_CANDIDATES:-2}" > "$out/tune.log" 2>&1
  el "tune rc=$?"
fi
