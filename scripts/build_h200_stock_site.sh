#!/usr/bin/env bash
# Build the carry archive that the stock ATTENTION-PREFIX baseline needs on the H200 machine (bench prefix /
# bench prefix-ops / tune with SGLang's own kernels): DeepGEMM (sgl-deep-gemm 0.1.3 + apache-tvm-ffi 0.1.9: the stock
# FP8 GEMMs and paged MQA logits) and sgl_kernel (sglang-kernel 0.4.4 without FA3: SGLang's fused decode top-k, the
# stock E2), cut from scripts/build_h200_site.sh's archive. ~18 MB against ~44 MB for the whole SGLang set, so it
# travels next to the repo's tracked files within a device call's 64 MiB.
#   scripts/build_h200_stock_site.sh [OUT.tar.xz] [FULL_SITE.tar.xz]
#       default OUT .carry/stocksite.tar.xz; FULL_SITE .carry/h200site.tar.xz (built first when missing; network)
#   in a call script: h200_setup "$OUT/r" .carry/stocksite.tar.xz JIT.tar.xz
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/.carry/stocksite.tar.xz}
full=${2:-$here/.carry/h200site.tar.xz}
[ -f "$full" ] || bash "$here/scripts/build_h200_site.sh" "$full"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
tar -xJf "$full" -C "$work"
cd "$work"
keep=(deep_gemm tvm_ffi sgl_kernel)
for d in *.dist-info; do
  case "$d" in sgl_deep_gemm-*|apache_tvm_ffi-*|sglang_kernel-*) keep+=("$d");; esac
done
mkdir -p "$(dirname "$out")"
tar -cf - "${keep[@]}" | xz -T0 -6 > "$out"
ls -la "$out"
