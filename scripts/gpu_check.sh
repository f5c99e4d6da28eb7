#!/usr/bin/env bash
# Run the GPU test subset and the kernel benchmarks on an H200 in one go; collect logs, JSON and
# markdown into OUTDIR (on a lent machine, tar OUTDIR into one file: only a few files come back).
# The stock baseline needs sgl-deep-gemm 0.1.3 + apache-tvm-ffi 0.1.9 on PYTHONPATH (offline:
# pip install --no-index --no-deps --target /tmp/site <wheels>); without them its GEMM rows fall back.
#   usage: scripts/gpu_check.sh OUTDIR [pytest -k expression]
# Needs: torch with CUDA, nvcc, cuda-python (cuda-bindings), pytest, safetensors. No network, no install:
# the checkout is put on PYTHONPATH. A copy without .git (a lent machine) takes the commit from GLM5_FASTPATH_COMMIT.
set -uo pipefail
out=${1:?usage: $0 OUTDIR [pytest -k expr]}
sel=${2:-}
mkdir -p "$out"
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-/tmp/glm5_fastpath_jit}
status=0
step() { echo; echo "=== $* ($(date -u +%H:%M:%S))"; }

step "environment"
{ date -u; echo "commit: ${GLM5_FASTPATH_COMMIT:-$(git rev-parse HEAD 2>/dev/null || echo unknown)}"; nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem,memory.total --format=csv
  python3 -m glm5_fastpath.cli info; } > "$out/env.txt" 2>&1
cat "$out/env.txt"

step "compile check (sm_90a, ptxas report)"
python3 scripts/compile_check.py --json "$out/compile.json" --cache-dir "$GLM5_FASTPATH_CACHE_DIR" || status=1

step "GPU tests"
python3 -m pytest -m gpu -v -rs -p no:cacheprovider ${sel:+-k "$sel"} 2>&1 | tee "$out/gpu-tests.log"
[ "${PIPESTATUS[0]}" -eq 0 ] || status=1

step "benchmarks"
for b in benchmarks/*.py; do
  name=$(basename "$b" .py)
  python3 "$b" --out "$out/$name" 2>&1 | tee "$out/$name.log" || status=1
done

step "bench prefix-ops (ours vs stock, every prefix op)"
python3 -m glm5_fastpath.cli bench prefix-ops --out "$out/prefix_ops" 2>&1 | tail -60 || status=1

step "demo (one decode layer through the best available path)"
python3 -m glm5_fastpath.cli demo --batch 16 --kv-len 8192 --repeat 5 2>&1 | tee "$out/demo.txt" || status=1

echo; echo "gpu_check: status=$status, results in $out"
exit $status
