#!/bin/bash
# Session 24 c1 (prepared in session 23, issue #5): compute-sanitizer memcheck / synccheck / racecheck of the megakernel
# on small plans (scripts/megartp_sanitize.py: NOOP runtime, cross-queue NOOP chain, the whole GLM-5 prefix on one
# queue, on 4 queues, and dynamic on 4 CTAs). #5 asks "racecheck and memcheck clean on a small plan"; never run
# before. The driver first runs plainly (every case checks its results), then under each tool.
# Build the carry here first: scripts/build_sanitizer_carry.sh (-> .carry/sanitizer_cu13.tar.xz, 8 MB).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz .carry/sanitizer_cu13.tar.xz)
source scripts/h200_lib.sh
DEADLINE=560
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
mkdir -p /tmp/san && tar -xJf .carry/sanitizer_cu13.tar.xz -C /tmp/san
step plain 90 python3 scripts/megartp_sanitize.py
step sanitize 450 env SAN=/tmp/san/nvidia/cu13/bin/compute-sanitizer LIMIT=145 scripts/megartp_sanitize.sh "$H200_OUT/sanitize"
h200_pack
