#!/bin/bash
# Prepared in session 25 (issue #9), not run: the wgmma sparse-MLA tile's cluster merge with its DSMEM loads batched
# (session 25 after c9; c8 / c9 measured the serial loads: clusters of 8 / 4 1.8x slower). The cluster tests and the
# whole sparse-MLA GPU file, then the phases with WGMMA_CLUSTER = auto and the cluster cap at 8 / 4 / 2, against the
# partial round trip (the op, no cluster column).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s25e.tar.xz)
source scripts/h200_lib.sh
DEADLINE=420
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s25e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests cluster 100 tests/ops/test_sparse_mla.py -k "cluster or wgmma_matches" -x
for c in 8 4 2; do
  step phases_c$c 50 python3 benchmarks/sparse_mla_phases.py --out "$H200_OUT/phases_c$c" --max-cluster $c --tiles wgmma \
    --cluster-mode auto
done
run_tests all 150 tests/ops/test_sparse_mla.py
h200_pack
