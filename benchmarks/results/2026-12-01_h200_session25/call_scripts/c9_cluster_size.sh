#!/bin/bash
# Session 25 call 9: c8's cluster merge was 1.8x slower with clusters of 8 / 4 and faster with 2 (T = 64): the wgmma tile's
# phases with the largest cluster capped at 2 and at 4, and the clusters the GPU co-schedules at this shared memory.
# run: C=<commit> bash this   (carry .carry/jit_s25c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
h200_setup "$OUT/r" .carry/empty.tar.xz .carry/jit_s25c.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step occupancy 60 python3 -c "
import torch, ctypes
from glm5_fastpath.ops import sparse_mla as SM
from glm5_fastpath.jit.runtime import get_kernel
from cuda.bindings import driver as cu
k = SM._wgmma_kernel(0, SM.FUNCTION_SPLIT_WGMMA, SM.WGMMA_STAGES)
fn = k.func
for c in (1, 2, 4, 8):
    cfg = cu.CUlaunchConfig(); cfg.gridDimX, cfg.gridDimY, cfg.gridDimZ = 1, c, 1; cfg.blockDimX, cfg.blockDimY, cfg.blockDimZ = 256, 1, 1
    cfg.sharedMemBytes = SM.WGMMA_SMEM
    at = cu.CUlaunchAttribute(); at.id = cu.CUlaunchAttributeID.CU_LAUNCH_ATTRIBUTE_CLUSTER_DIMENSION
    at.value.clusterDim.x, at.value.clusterDim.y, at.value.clusterDim.z = 1, c, 1
    cfg.attrs = [at]; cfg.numAttrs = 1
    print('cluster', c, 'max active clusters', cu.cuOccupancyMaxActiveClusters(fn, cfg), flush=True)
"
step phases2 50 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases_c2" --max-cluster 2 --tiles wgmma
step phases4 50 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases_c4" --max-cluster 4 --tiles wgmma
h200_pack
