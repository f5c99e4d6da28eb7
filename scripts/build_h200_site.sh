#!/usr/bin/env bash
# Build ONE carry-sized archive of everything the H200 machine needs beyond its own torch/triton for the
# SGLang 0.5.14 engine runs (issue #9) and our JIT kernels: the wheel set of
# ../shared/tools/sglang-h200-wheels.sh (sglang 0.5.14, sglang-kernel 0.4.4 without FA3, flashinfer,
# sgl-deep-gemm 0.1.3, tvm-ffi, transformers 5.8.1, small deps), optionally nvidia-cutlass (CuTe headers),
# installed here with pip --target for cp312 / manylinux x86-64 and packed as tar.xz.
# The three wheel parts are ~72 MB (over the 64 MB a device call carries); unpacked and xz-compressed the
# same files are ~44 MB (38.3 MB at -9e), so one call brought everything while the tree was small.
# Since 2026-12-03 the tracked tree takes ~41 MiB on disk (what the device's 64 MiB limit counts), so the site no longer
# fits one call: split it (split -b 19M .carry/h200site.tar.xz .carry/h200site.part.), carry part aa in a first call that
# copies it to build/h200parts/ (ignored outputs survive between calls on the same warm machine: call the next one at
# once, the machine goes back after ~30 s idle), part ab in the second, which reassembles it
# (benchmarks/results/2026-12-03_h200_session34/call_scripts/c2_*.sh, c3_*.sh).
#
# nvidia-cutlass (1.9 MB of the archive) only when WITH_CUTLASS=1: no kernel in csrc/ includes CuTe today
# (KernelSpec.use_cutlass is unused) and SGLang's own cute paths import the separate CuTe DSL package, while the
# repository's tracked files (~21 MiB, 2026-11-30) plus the site must stay under a call's 64 MiB.
#
# usage: [WITH_CUTLASS=1] scripts/build_h200_site.sh [OUT.tar.xz]   (default .carry/h200site.tar.xz; needs network)
# on the H200: mkdir -p /tmp/site && tar -xJf .carry/h200site.tar.xz -C /tmp/site; PYTHONPATH=/tmp/site:$PWD
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
out=${1:-$here/.carry/h200site.tar.xz}
tools=${SGLANG_WHEELS_TOOL:-$here/../shared/tools/sglang-h200-wheels.sh}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
bash "$tools" "$work/wheels" >/dev/null
if [ "${WITH_CUTLASS:-0}" = 1 ]; then
  python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    --platform manylinux_2_28_x86_64 -d "$work/wheels/part4" nvidia-cutlass==4.2.0.0
fi
plat=()
for p in manylinux_2_34_x86_64 manylinux_2_31_x86_64 manylinux_2_28_x86_64 manylinux_2_27_x86_64 \
         manylinux_2_26_x86_64 manylinux_2_24_x86_64 manylinux_2_17_x86_64 manylinux2014_x86_64 \
         manylinux_2_5_x86_64 manylinux1_x86_64; do plat+=(--platform "$p"); done
python3 -m pip install -q --no-index --no-deps --no-compile --target "$work/site" --python-version 3.12 \
  --implementation cp --only-binary=:all: "${plat[@]}" "$work"/wheels/part*/*.whl
mkdir -p "$(dirname "$out")"
# sorted names + one xz stream at -9e (64 MB dictionary): 38.2 MB instead of 41.7 MB with -T0 -6 (session 22), so
# an engine call (this site + ~25 MB of tracked files + a JIT cache) stays under the 64 MiB carry limit
tar -C "$work/site" --sort=name -cf - . | xz -T1 -9e > "$out"
ls -la "$out"
