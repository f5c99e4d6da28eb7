#!/bin/bash
# Session 16, call 3 (nvidia-h200): the prefix tune with the new candidates (tune.TUNE_MODES + pin:D1=0 / after:D1>D0),
# buckets 1-256, 100 replays, stock included; then two more rounds of the same modes without stock, to see the
# run-to-run spread before a shipped table changes. First the every-bucket GPU test of full+pin:D1=0.
# run: C=<commit> bash .../c3_tune_prefix.sh   (carry .carry/stocksite.tar.xz .carry/jit_pre.tar.xz)
source scripts/h200_lib.sh
DEADLINE=585
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_pre.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests pin_buckets 150 tests/attn_pre/cmp/test_cmp_executor_gpu.py -k "(every_bucket and pin) or modes_agree_bitwise"
step tune 260 python3 -m glm5_fastpath.cli tune --moe off --replays 100 --out "$H200_OUT/tune/h200_prefix.json"
MODES=$(python3 -c "from glm5_fastpath.tune import TUNE_MODES; print(','.join(TUNE_MODES))")
for r in 2 3; do
  step round$r 70 python3 -m glm5_fastpath.cli bench prefix --out "$H200_OUT/round$r" --no-stock --replays 100 \
    --ms 1,2,4,8,16,32,64,128,256 --modes "$MODES" --timeline-modes none
done
h200_pack
