#!/bin/bash
# For the next session (written in session 36, not run): stage part aa of the SGLang site on the machine for the engine
# calls that follow right away (the machine idles back after ~30 s; the tree and the whole site exceed a call's
# 64 MiB), then the decode MoE layer's chain at 1 / 8 tokens (router -> plan -> MegaMoE against the fused and overlap
# forms; the baseline of the shared-first MegaMoE design in docs/decode_budget.md, session 36), and where the plan
# kernel's time goes (MegaMoE's trace build stamps the plan's phases: summary["plan"]; never committed before), and the
# router's (bench router --phases: its phase-mark build, session 36).
# run: C=<commit> bash this   (carry .carry/jit_s36.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=460
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s36.tar.xz; export GLM5_FASTPATH_COMMIT=$C
step moe-layer 150 python3 -m glm5_fastpath.cli bench moe-layer --tokens 1,8 --no-stock --out "$H200_OUT/moe_layer"
step moe-trace 120 python3 -m glm5_fastpath.cli bench moe --out "$H200_OUT/moe_trace" --settings b --tokens 1,8 --no-deepgemm --trace
# the router's phases (written in session 36: GPU test first, then the bench with its phase-mark build)
run_tests router-phases 60 tests/ops/test_moe_router.py -k phase
step router 60 python3 -m glm5_fastpath.cli bench router --out "$H200_OUT/router" --tokens 1,2,4,8,16 --phases
h200_pack
