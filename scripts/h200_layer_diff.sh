#!/usr/bin/env bash
# One lent-H200 call: where do stock and glm5_fastpath part ways in the engine's first decode step?
# Both modes run eagerly (no CUDA graphs: the recording hooks do not run in graph replays) at batch 1 with the
# realistic dummy weights, record per layer the attention output, MLP input / output, layer outputs and the
# would-be router choice of the first DUMP_STEPS decode steps (glm5_fastpath/bench/layer_dump.py), then diff them.
# The prefill is SGLang's path in both modes, so step 0 starts from the same KV cache and token: a difference
# there is our routes'. Rounding noise shows as ~1e-2 differences that grow slowly, with router flips at near-ties;
# a wrong route as a jump at one layer (flagged).
# usage: scripts/h200_layer_diff.sh SITE.tar.xz OUTDIR     env: ENGINE_CACHE, DUMP_STEPS (default 2), T_MODE (240)
set -uo pipefail
site=$(realpath -m "${1:?usage}"); out=$(realpath -m "${2:?usage}")  # absolute: the script cds to the repo root
cd "$(dirname "$0")/.."
mkdir -p "$out"
export GLM5_FASTPATH_BENCH_LAYER_DUMP=$out/dump GLM5_FASTPATH_BENCH_LAYER_DUMP_STEPS=${DUMP_STEPS:-2}
# the fastpath engine also compares its first 32 sparse-MLA calls with FlashMLA on the engine's own inputs
# (integrations/sglang/attn_core.py check mode; "sparse MLA check vs FlashMLA" lines in the fastpath worker log)
export GLM5_FASTPATH_SPARSE_MLA_CHECK=${SPARSE_MLA_CHECK:-32}
BS=1 OUT_LEN=$(( ${DUMP_STEPS:-2} + 2 )) REALISTIC_DUMMY=1 ROUTING_STATS=0 RES="$out/run" WORKER_TIMEOUT="${T_MODE:-240}" \
  EXTRA_ARGS="--engine-arg disable_cuda_graph=true --no-stream-pass" \
  scripts/h200_sglang_offline.sh "$site" stock fastpath > "$out/run.log" 2>&1
echo "engine runs rc=$?" | tee -a "$out/steps.log"
ls -la "$out/dump" >> "$out/steps.log" 2>&1
export PYTHONPATH="${SITE:-/tmp/site}:$PWD"
python3 -m glm5_fastpath.bench.layer_dump diff "$out/dump/stock.pt" "$out/dump/fastpath.pt" --out "$out/layer_diff.md" \
  >> "$out/steps.log" 2>&1
echo "diff rc=$?" | tee -a "$out/steps.log"
grep -h "sparse MLA check vs FlashMLA" "$out"/run/worker-fastpath.log > "$out/sparse_mla_check.log" 2>/dev/null
echo "sparse MLA checks: $(wc -l < "$out/sparse_mla_check.log")" | tee -a "$out/steps.log"
