#!/bin/bash
# Session 24 c2: (1) benchmarks/l2_residency_probe.py: is L2-resident data read faster (a bandwidth-bound sum, D0's
# q_b GEMM at 16 tokens), cold / warm / after an L2 prefetch (issue #4: can the prefix's idle HBM during B0 prefetch
# D0's weights?); (2) compute-sanitizer memcheck / synccheck / racecheck of the megakernel on small plans (#5; c1's
# attempt stopped on the kernel filter's syntax).
# run: C=<commit> bash this   (carry .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz .carry/sanitizer_cu13.tar.xz)
source scripts/h200_lib.sh
DEADLINE=565
h200_setup "$OUT/r" .carry/stocksite.tar.xz .carry/jit_s23e.tar.xz; export GLM5_FASTPATH_COMMIT=$C
mkdir -p /tmp/san && tar -xJf .carry/sanitizer_cu13.tar.xz -C /tmp/san
step l2probe 100 python3 benchmarks/l2_residency_probe.py --out "$H200_OUT/l2probe"
step plain 60 python3 scripts/megartp_sanitize.py
step sanitize 420 env SAN=/tmp/san/nvidia/cu13/bin/compute-sanitizer LIMIT=135 scripts/megartp_sanitize.sh "$H200_OUT/sanitize"
h200_pack
