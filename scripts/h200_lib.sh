# Shared setup of the one-call H200 scripts (source it; not executable on its own).
#   h200_setup OUTDIR [SITE.tar.xz] [JIT.tar.xz]
#       cd to the checkout, mkdir OUTDIR, unpack the carried SGLang site (scripts/build_h200_site.sh) into $SITE and
#       the JIT cache (tar.xz of a warmed GLM5_FASTPATH_CACHE_DIR) into $GLM5_FASTPATH_CACHE_DIR unless already there,
#       put both on PYTHONPATH and start the step clock.
#   el MSG                     a timestamped line, also appended to OUTDIR/steps.log
#   left                       seconds before DEADLINE (default 570) since h200_setup
#   step NAME LIMIT CMD...     CMD under `timeout LIMIT` (capped by the deadline, skipped under 30 s), output in
#                              OUTDIR/NAME.log, rc and the log's last line in steps.log
#   run_tests NAME LIMIT ARGS  step "gpu-tests-NAME" running `pytest -m gpu -v -rfEs ARGS`: one file / -k per call
#                              (a -k on a combined run deselects the other files' tests); a test past TEST_HANG_S
#                              (60) dumps the Python stacks into the log
#   h200_pack [MAX_MB]         tar OUTDIR's logs / json / md / txt / pt / png files under MAX_MB each (default 4) into
#                              $OUT/r.tgz and remove OUTDIR: the device returns files under a size limit only, and
#                              a tarball with bulk data in it (bitwise dumps) comes back as nothing at all
# Each step writes straight into OUTDIR, so a call cut short still returns what finished; end the device command with
# h200_pack (a call returns at most 8 files).
h200_setup() {
  H200_OUT=${1:?usage: h200_setup OUTDIR [SITE.tar.xz] [JIT.tar.xz]}
  local site_tar=${2:-.carry/h200site.tar.xz} jit_tar=${3:-.carry/jit.tar.xz}
  cd "$(dirname "${BASH_SOURCE[0]}")/.." || return 1
  mkdir -p "$H200_OUT"
  H200_T0=$(date +%s)
  export SITE=${SITE:-/tmp/site} PYTHONUNBUFFERED=1
  export GLM5_FASTPATH_CACHE_DIR=${GLM5_FASTPATH_CACHE_DIR:-/tmp/glm5jit}
  [ -d "$SITE/sglang" ] || { mkdir -p "$SITE" && tar -xJf "$site_tar" -C "$SITE"; }
  [ -d "$GLM5_FASTPATH_CACHE_DIR/sm_90a" ] || { mkdir -p "$GLM5_FASTPATH_CACHE_DIR" && tar -xJf "$jit_tar" -C "$GLM5_FASTPATH_CACHE_DIR"; }
  export PYTHONPATH="$SITE:$PWD"
  el "unpacked; $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | head -1); commit ${GLM5_FASTPATH_COMMIT:-${C:-?}}"
}
el() { echo "[$(( $(date +%s) - H200_T0 ))s] $*" | tee -a "$H200_OUT/steps.log"; }
left() { echo $(( ${DEADLINE:-570} - ($(date +%s) - H200_T0) )); }
step() {
  local name=$1 limit=$2 l; shift 2
  l=$(left); [ "$l" -lt 30 ] && { el "skip $name (deadline)"; return 0; }
  [ "$limit" -gt "$l" ] && limit=$l
  el "$name"
  timeout "$limit" "$@" > "$H200_OUT/$name.log" 2>&1
  el "$name rc=$? ($(tail -1 "$H200_OUT/$name.log" | cut -c1-200))"
}
run_tests() {
  local name=$1 limit=$2; shift 2
  # faulthandler_timeout: a test running past TEST_HANG_S (default 60 s; the slowest GPU test takes ~15 s) dumps every
  # thread's Python stack into the log, so a hang shows where the host waits (session 23 c5: one silent hang)
  step "gpu-tests-$name" "$limit" python3 -m pytest -m gpu -v -rfEs -p no:cacheprovider --durations=10 \
    -o faulthandler_timeout="${TEST_HANG_S:-60}" "$@"
}
h200_pack() {
  local max=${1:-4} parent base
  parent=$(dirname "$H200_OUT"); base=$(basename "$H200_OUT")
  (cd "$parent" && find "$base" -type f \( -name '*.log' -o -name '*.json' -o -name '*.md' -o -name '*.txt' -o -name '*.pt' -o -name '*.png' \) \
     -size -"${max}"M | tar -czf r.tgz -T - && rm -rf "$base")
}
