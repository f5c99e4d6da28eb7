#!/usr/bin/env bash
# Build a small carry archive with only what the MegaMoE / prefix-op baselines need on the H200 machine: DeepGEMM
# (sgl-deep-gemm 0.1.3, the release that loads on torch 2.11) and apache-tvm-ffi 0.1.9, installed for cp312 / manylinux
# x86-64 with pip --target and packed as tar.xz (~3 MB, against ~44 MB for scripts/build_h200_site.sh's whole SGLang
# set). Use it as h200_setup's site archive when the call needs DeepGEMM but not the SGLang engine:
#   scripts/build_h200_deepgemm_site.sh [OUT.tar.xz]          (default .carry/dgsite.tar.xz; needs network)
#   in a call script: h200_setup "$OUT/r" .carry/dgsite.tar.xz
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/.carry/dgsite.tar.xz}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
plat=()
for p in manylinux_2_28_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64; do plat+=(--platform "$p"); done
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp "${plat[@]}" \
  -d "$work/wheels" sgl-deep-gemm==0.1.3 apache-tvm-ffi==0.1.9
python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" --python-version 3.12 \
  --implementation cp --only-binary=:all: "${plat[@]}" "$work"/wheels/*.whl
mkdir -p "$(dirname "$out")"
tar -C "$work/site" -cf - . | xz -T0 -6 > "$out"
ls -la "$out"
