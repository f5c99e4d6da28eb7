#!/usr/bin/env bash
# compute-sanitizer's memcheck, synccheck and racecheck on small MegaRTP plans (scripts/megartp_sanitize.py),
# checking only the megakernel (--kernel-name kns=glm5_megartp; torch's reference kernels run unchecked).
# One log per tool in OUTDIR; a tool's errors make its exit code 9 (the driver's own failures: 1).
# usage: SAN=/tmp/san/nvidia/cu13/bin/compute-sanitizer [CASES=noop1,...] [LIMIT=150] scripts/megartp_sanitize.sh OUTDIR
# compute-sanitizer on the H200 machine: scripts/build_sanitizer_carry.sh here, carry .carry/sanitizer_cu13.tar.xz,
# unpack it with tar -xJf ... -C /tmp/san.
# DOES NOT RUN with that carry (session 24, c2): the PyPI wheel's compute-sanitizer execs bin/TreeLauncherSubreaper to
# start the target, and no nvidia-cuda-sanitizer-api wheel (13.0.x, 13.2.x, cu12 12.1-12.9) ships it, so every tool
# stops with "Target application terminated before first instrumented API call". A stand-in that just execs the
# target crashes it (the preloaded tracker expects the subreaper's handshake). Needs the CUDA toolkit's own
# compute-sanitizer directory (TreeLauncherSubreaper, TreeLauncherTargetLdPreloadHelper), which only NVIDIA's
# redist / toolkit installers carry: not reachable from here (PyPI only) and not installed on the H200 machine.
set -uo pipefail
out=${1:?usage: megartp_sanitize.sh OUTDIR}
san=${SAN:-/tmp/san/nvidia/cu13/bin/compute-sanitizer}
here=$(cd "$(dirname "$0")/.." && pwd)
mkdir -p "$out"
for tool in ${TOOLS:-memcheck synccheck racecheck}; do
  extra=()
  [ "$tool" = racecheck ] && extra=(--racecheck-report all)
  timeout "${LIMIT:-150}" "$san" --tool "$tool" --kernel-name kns=glm5_megartp --error-exitcode 9 --print-limit 50 \
    "${extra[@]}" python3 "$here/scripts/megartp_sanitize.py" --cases "${CASES:-noop1,chain4,prefix1,prefix5,prefix5_dynamic,prefix16_q8}" \
    > "$out/$tool.log" 2>&1
  echo "$tool rc=$? ($(grep -c 'ok (' "$out/$tool.log") cases ok; $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/$tool.log" | tail -1))"
done
