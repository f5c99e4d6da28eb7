#!/bin/bash
# Session 24 c7: the W8 D2 test file again (c6: 66 passed, 1 failed in torch's opcheck test_schema, which cannot compare
# float8 inputs; the test now checks read-only inputs itself), and a second round of D2 alone, fp8 vs bf16 W_UK.
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s24b.tar.xz)
source scripts/h200_lib.sh
DEADLINE=200
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s24b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests d2w8 60 tests/ops/test_d2_absorb_w8.py
for f in fp8 bf16 fp8 bf16; do n=$((n+1)); step d2_${f}_$n 30 env GLM5_FASTPATH_D2_WEIGHTS=$f python3 -m glm5_fastpath.cli bench prefix-ops \
  --m 1,16,64 --ops D2 --no-stock --no-profile --out "$H200_OUT/d2_${f}_$n"; done
h200_pack
