#!/bin/bash
# For the next session (written in session 35): stage part aa of the SGLang site on the machine for
# next2_host_floor.sh, which must follow right away (the machine idles back after ~30 s; the tree and the whole site
# exceed a call's 64 MiB), and run the GPU tests written in session 35: the DSA decode metadata kernel bitwise against
# SGLang's torch sequence, and the graph-launch probe's (the probe itself ran as session 35 c6); then the host / GPU
# time of one metadata refresh, SGLang's sequence against ours (benchmarks/dsa_metadata_host.py).
# run: C=<commit> bash this   (carry .carry/jit_s35.tar.xz .carry/h200site.part.aa)
mkdir -p build/h200parts && cp .carry/h200site.part.aa build/h200parts/
source scripts/h200_lib.sh
DEADLINE=200
SITE=/tmp/nosite h200_setup "$OUT/r" /dev/null .carry/jit_s35.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests dsa-metadata 60 tests/ops/test_dsa_metadata.py
run_tests probe 40 tests/bench/test_graph_launch_cost_script.py tests/bench/test_dsa_metadata_host_script.py
# the DSA metadata refresh outside the engine: SGLang's torch sequence against the one-kernel FastLauncher, host and GPU
step dsa-host 60 python3 benchmarks/dsa_metadata_host.py --out "$H200_OUT/dsa_metadata_host"
h200_pack
