#!/usr/bin/env bash
# Stock SGLang 0.5.14 vs glm5_fastpath, offline Engine, on a lent H200 (no network). Issue #9.
#
# usage (repo root on the H200 machine; WHEELS = the carried archive made by scripts/build_h200_site.sh
# (.carry/h200site.tar.xz, one call), or a folder holding part1/ part2/ part3/ made by
# ../shared/tools/sglang-h200-wheels.sh):
#   scripts/h200_sglang_offline.sh WHEELS MODE [MODE...]     MODE: stock | fastpath
# FASTPATH_CONFIG (default benchmarks/tables/h200_engine_cmp_megamoe.json) is the selection table of the
# fastpath run: which prefix executor / MoE config each decode bucket takes.
# Each MODE is one fresh Engine process (`glm5-fastpath bench offline --modes MODE`); results of
# earlier calls with the same settings are merged from $RES, so run one mode per 10-minute command:
#   call 1: scripts/h200_sglang_offline.sh .carry/wheels stock
#   call 2: scripts/h200_sglang_offline.sh .carry/wheels fastpath      (writes the merged report too)
# Time plan per call (10 min limit): install ~30 s (skipped when /tmp/site is there), dummy model
# dir ~2 s, Engine start = dummy load (~20 s) + decode CUDA-graph capture of ONLY the measured batch
# sizes (the 7-8 min seen before was capture up to 64 with all default sizes and cold Triton
# caches; the Triton/Inductor/FlashInfer caches live in build/h200-cache, which survives between
# calls on a warm machine, so the second mode starts faster), then per batch size < 10 s.
# If the first call gets too close to the limit, set BS=1,8,16,32 and run BS=64 separately
# (different batch sizes are a different run key: give it its own RES).
#
# Model: --load-format dummy over our config.json (1 dense + 7 MoE layers, full GLM-5 per-layer dims; LAYERS=N with
# a MODEL dir of its own for 1 dense + N-1 MoE layers, e.g. LAYERS=2 to see the per-step host cost with little GPU work)
# with --randomize-routers (N(0,0.02) router weights, zero correction bias) for realistic routing.
# A real synthetic checkpoint (`glm5-fastpath make-checkpoint DIR --layers 8`) is 3 dense + 5 MoE
# layers, ~53 GB (a MoE layer ~9.7 GB, embed+lm_head 3.8 GB) and takes many minutes to write: too
# slow for one 10-minute command and close to the 64 GB disk; use it only with a larger budget
# (MODEL=DIR LOAD_FORMAT=auto).
set -euo pipefail
WHEELS=${1:?usage: $0 WHEELS MODE [MODE...]}; shift
[ $# -ge 1 ] || { echo "usage: $0 WHEELS MODE [MODE...]" >&2; exit 2; }
OUT=${OUT:-$PWD/build/h200-offline-out}
SITE=${SITE:-/tmp/site}
BS=${BS:-1,8,16,32,64}
IN_LEN=${IN_LEN:-128}
OUT_LEN=${OUT_LEN:-256}
MODEL=${MODEL:-$PWD/build/glm5-8l-dummy}
LOAD_FORMAT=${LOAD_FORMAT:-dummy}
RES=${RES:-$PWD/build/h200-offline}
CACHE=$PWD/build/h200-cache
mkdir -p "$OUT" "$RES" "$CACHE"
exec > >(tee -a "$RES/script.log") 2>&1
t0=$(date +%s); el() { echo "[$(( $(date +%s) - t0 ))s] $*"; }

# 1. wheels (no network): three parts into one --target dir
FASTPATH_CONFIG=${FASTPATH_CONFIG:-$PWD/benchmarks/tables/h200_engine_cmp_megamoe.json}
if [ ! -d "$SITE/sglang" ] && [ -f "$WHEELS" ]; then
  el "unpacking $WHEELS"
  mkdir -p "$SITE" && tar -xJf "$WHEELS" -C "$SITE"
elif [ ! -d "$SITE/sglang" ]; then
  for part in "$WHEELS"/part1 "$WHEELS"/part2 "$WHEELS"/part3; do
    el "installing $part"
    python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target "$SITE" "$part"/*.whl
  done
fi
export PYTHONPATH="$SITE:$PWD${PYTHONPATH:+:$PYTHONPATH}"
export TRITON_CACHE_DIR=$CACHE/triton TORCHINDUCTOR_CACHE_DIR=$CACHE/inductor XDG_CACHE_HOME=$CACHE/xdg
export FLASHINFER_WORKSPACE_BASE=$CACHE/flashinfer SGLANG_DG_CACHE_DIR=$CACHE/deep_gemm
# our kernels' JIT cache: seeded from the carried compile-check cache (JIT_CACHE, scripts/compile_check.py
# --cache-dir D; tar.xz of D) so the plugin's install loads instead of compiling
export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-$CACHE/glm5}
JIT_CACHE=${JIT_CACHE:-.carry/jit.tar.xz}
if [ -f "$JIT_CACHE" ] && [ ! -d "$GLM5_FASTPATH_CACHE_DIR/sm_90a" ]; then
  mkdir -p "$GLM5_FASTPATH_CACHE_DIR" && tar -xJf "$JIT_CACHE" -C "$GLM5_FASTPATH_CACHE_DIR"
  # the standalone GEMMs / D2 load weights evict-first at M <= 16 (ops/_device.py weights_evict_first): their
  # -DGLM5_WEIGHTS_EVICT_FIRST builds, compiled here in parallel instead of inside the engine's start-up
  python3 scripts/jit_variants.py --define GLM5_WEIGHTS_EVICT_FIRST=1 \
    --sources attn_pre/fp8_gemm_skinny.cu,attn_pre/fp8_gemm_wgmma.cu,attn_pre/d2_absorb_kv_store.cu || true
fi
# JIT caches of an earlier machine (ENGINE_CACHE=.carry/engine-cache.tar.xz, made by SAVE_CACHE=1 below): a
# fresh machine then skips the sgl-deep-gemm / Triton compiles of engine start-up
if [ -n "${ENGINE_CACHE:-}" ] && [ -f "$ENGINE_CACHE" ] && [ ! -e "$CACHE/.from-archive" ]; then
  el "unpacking $ENGINE_CACHE into $CACHE"; tar -xJf "$ENGINE_CACHE" -C "$CACHE" && touch "$CACHE/.from-archive"
fi
export GLM5_FASTPATH_COMMIT=${GLM5_FASTPATH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}
el "sglang $(python3 -c 'from importlib.metadata import version; print(version("sglang"))'), $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1)"

# 2. model dir (config.json + tokenizer; no weights with --load-format dummy)
if [ "$LOAD_FORMAT" = dummy ] && [ ! -f "$MODEL/config.json" ]; then
  python3 -m glm5_fastpath.bench.offline make-dummy-model "$MODEL" --layers "${LAYERS:-8}" --dense-layers 1
fi

ARGS=(--model "$MODEL" --load-format "$LOAD_FORMAT" --batch-sizes "$BS" --input-len "$IN_LEN"
      --output-len "$OUT_LEN" --out "$RES" --timeout "${WORKER_TIMEOUT:-540}" --fastpath-config "$FASTPATH_CONFIG")
[ "$LOAD_FORMAT" = dummy ] && ARGS+=(--randomize-routers)
# REALISTIC_DUMMY=1: norm weights 1 and FP8 block scales at unit gain in both modes (glm5_fastpath/bench/
# dummy_weights.py), so the greedy-token check sees every layer (plain dummy FP8 weights are ~98 % zero)
[ "$LOAD_FORMAT" = dummy ] && [ "${REALISTIC_DUMMY:-0}" = 1 ] && ARGS+=(--realistic-dummy --seam external-model-package)
# PROFILE_STEPS=5 PROFILE_BS=1,16,64: torch-profiler traces of 5 pure-decode engine steps per listed batch,
# analysed into per-kernel-category GPU time / idle time (glm5_fastpath/bench/trace_breakdown.py)
# ROUTING_STATS=1 (default): distinct experts per MoE layer per decode step, measured in both modes. It starts the
# engines with SGLang's routed-experts capturer, whose kernels then run in the timed passes too (~0.7 % of
# glm5_fastpath's batch-8 throughput, session 28): for the timed A/B of record run ROUTING_STATS=0 in both modes
# and the stats in a separate run with its own RES (a different run key)
[ "${ROUTING_STATS:-1}" = 1 ] && ARGS+=(--routing-stats)
# CALLS=N: N timed generate calls of B prompts per batch size (default 1). Batch 1's single call of one prompt moved its
# tok/s by up to 10 % between identical runs (session 29); more calls cost ~0.6 s (ours) / 0.9 s (stock) each there.
[ "${CALLS:-1}" != 1 ] && ARGS+=(--calls "$CALLS")
# HOST_TIMING=1: time SGLang's scheduler loop per decode iteration without a profiler (bench/host_timing.py): the loop
# period, the host's waits on the GPU and each loop stage, per batch size and mode, in the report
[ "${HOST_TIMING:-0}" = 1 ] && ARGS+=(--host-timing)
PROFILE_STEPS=${PROFILE_STEPS:-0}
[ "$PROFILE_STEPS" != 0 ] && ARGS+=(--profile-steps "$PROFILE_STEPS")
[ -n "${PROFILE_BS:-}" ] && ARGS+=(--profile-batches "$PROFILE_BS")
# EXTRA_ARGS: more `bench offline` arguments, word-split (e.g. "--engine-arg disable_cuda_graph=true")
[ -n "${EXTRA_ARGS:-}" ] && read -r -a _extra <<< "$EXTRA_ARGS" && ARGS+=("${_extra[@]}")
python3 -m glm5_fastpath.cli bench offline "${ARGS[@]}" --dry-run | head -3

# 3. one mode per fresh Engine process; each run re-merges every mode-*.json of the same settings in $RES
rc=0
for mode in "$@"; do
  case $mode in
    stock|fastpath) el "bench offline --modes $mode"
                    python3 -m glm5_fastpath.cli bench offline "${ARGS[@]}" --modes "$mode" || rc=$? ;;
    *) echo "unknown mode $mode" >&2; exit 2 ;;
  esac
done

# SAVE_CACHE=1: the engine's JIT caches (sgl-deep-gemm, Triton, ours; not Inductor/FlashInfer workspaces) as an
# archive to carry into the next session's machine (ENGINE_CACHE above)
if [ "${SAVE_CACHE:-0}" = 1 ]; then
  XZ_OPT=-T0 tar -cJf "$OUT/engine-cache.tar.xz" -C "$CACHE" $(cd "$CACHE" && ls -d deep_gemm triton glm5 2>/dev/null) \
    && el "wrote $OUT/engine-cache.tar.xz ($(du -h "$OUT/engine-cache.tar.xz" | cut -f1))"
fi

# 4. everything into one tarball under $OUT (results, worker logs, per-mode JSON)
case "$RES/" in "$OUT"/*) el "results in $RES (rc=$rc)" ;;  # already under OUT: nothing to pack
  *) tar -czf "$OUT/h200-sglang-offline.tar.gz" -C "$(dirname "$RES")" "$(basename "$RES")"
     el "wrote $OUT/h200-sglang-offline.tar.gz (rc=$rc)" ;; esac
exit $rc
