#!/usr/bin/env bash
# Pack NVIDIA compute-sanitizer for the H200 machine (it has nvcc 13.0 but no compute-sanitizer, and no network):
# the nvidia-cuda-sanitizer-api 13.0 wheel's nvidia/cu13/{bin,lib} (the binary and the libraries it loads from
# ../lib), xz-compressed (~14 MB wheel). Used by scripts/megartp_sanitize.sh (issue #5: racecheck / memcheck /
# synccheck of the megakernel on small plans).
# usage: scripts/build_sanitizer_carry.sh [OUT.tar.xz]   (default .carry/sanitizer_cu13.tar.xz; needs network)
# on the H200: mkdir -p /tmp/san && tar -xJf .carry/sanitizer_cu13.tar.xz -C /tmp/san;
#              /tmp/san/nvidia/cu13/bin/compute-sanitizer --version
# NOT ENOUGH to run a program (session 24): the wheel lacks bin/TreeLauncherSubreaper (scripts/megartp_sanitize.sh).
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/.carry/sanitizer_cu13.tar.xz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: -d "$work/w" "nvidia-cuda-sanitizer-api==13.0.*"
python3 -m zipfile -e "$work"/w/nvidia_cuda_sanitizer_api-*.whl "$work/x"
chmod +x "$work/x/nvidia/cu13/bin/compute-sanitizer"
mkdir -p "$(dirname "$out")"
tar -C "$work/x" -cJf "$out" nvidia/cu13/bin nvidia/cu13/lib
ls -la "$out"
