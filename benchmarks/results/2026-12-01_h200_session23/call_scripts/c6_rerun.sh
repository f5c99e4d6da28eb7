#!/bin/bash
# Session 23 call 6 (issue #5): c5's megakernel test file hung in test_subgraph_b0_b1_d1_d2_epochs[8-queues]
# (no error record, killed at the step limit); rerun that test (both parameters) four times on the same code.
# (Run inline in the device command, as below.)
# run: bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz)
source scripts/h200_lib.sh
DEADLINE=125
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23c.tar.xz; export GLM5_FASTPATH_COMMIT=a98083c
for i in 1 2 3 4; do
  step rep$i 28 python3 -m pytest -m gpu -q -x -p no:cacheprovider \
    "tests/attn_pre/megartp/test_megartp_device.py::test_subgraph_b0_b1_d1_d2_epochs"
done
h200_pack
