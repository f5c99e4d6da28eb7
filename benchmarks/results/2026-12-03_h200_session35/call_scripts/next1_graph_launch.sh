#!/bin/bash
# For the next session (written in session 35, not run): the host cost of one CUDA-graph launch by node count and
# kind (benchmarks/graph_launch_cost.py), the first of two calls; keeps part aa of the SGLang site on the machine for
# next2_host_floor.sh, which must follow right away (the machine idles back after ~30 s).
# run: C=<commit> bash this   (carry .carry/jit_s33b.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=240
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s33b.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests probe 60 tests/bench/test_graph_launch_cost_script.py
step graph-launch 150 python3 benchmarks/graph_launch_cost.py --out "$H200_OUT/graph_launch" --replays 200
h200_pack
