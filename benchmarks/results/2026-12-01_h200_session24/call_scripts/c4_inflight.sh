#!/bin/bash
# Session 24 c4 (issues #3 / #4): the wgmma GEMM ring fill with at most n stages in flight per CTA
# (GLM5_FASTPATH_FP8_GEMM_INFLIGHT, csrc/attn_pre/fp8_gemm_wgmma.cuh kInflight). (1) variant builds of the cached wgmma
# kernels for n = 2 and 3; (2) bitwise: the four prefix GEMM shapes at M 1..64, off vs 2 vs 3; (3) bench prefix-ops
# (ours only) at 1 / 16 / 64 for off / 2 / 3; (4) bench prefix (stock + two CMP modes) for off / 2 / 3.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24.tar.xz)
source scripts/h200_lib.sh
DEADLINE=575
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24.tar.xz; export GLM5_FASTPATH_COMMIT=$C
for n in 2 3; do step variants$n 40 python3 scripts/jit_variants.py --define GLM5_SKINNY_INFLIGHT=$n --sources attn_pre/fp8_gemm_wgmma.cu; done
for n in 0 2 3; do step digest$n 40 env GLM5_FASTPATH_FP8_GEMM_INFLIGHT=$n python3 benchmarks/skinny_output_digest.py --out "$H200_OUT/digest$n.json"; done
step compare2 10 python3 benchmarks/skinny_output_digest.py --compare "$H200_OUT/digest0.json" "$H200_OUT/digest2.json"
step compare3 10 python3 benchmarks/skinny_output_digest.py --compare "$H200_OUT/digest0.json" "$H200_OUT/digest3.json"
for n in 0 2 3; do step prefix_ops$n 60 env GLM5_FASTPATH_FP8_GEMM_INFLIGHT=$n python3 -m glm5_fastpath.cli bench prefix-ops \
  --m 1,16,64 --no-stock --no-profile --ops B0,B1,D1,D0 --out "$H200_OUT/prefix_ops$n"; done
step prefix0 110 python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 --timeline-modes none --replays 30 \
  --modes full,multistream_pdl_prologue --out "$H200_OUT/prefix0"
for n in 2 3; do step prefix$n 80 env GLM5_FASTPATH_FP8_GEMM_INFLIGHT=$n python3 -m glm5_fastpath.cli bench prefix --ms 1,16,64 \
  --timeline-modes none --replays 30 --no-stock --modes full,multistream_pdl_prologue --out "$H200_OUT/prefix$n"; done
h200_pack
