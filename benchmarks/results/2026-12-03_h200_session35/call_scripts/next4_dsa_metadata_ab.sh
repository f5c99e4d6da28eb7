#!/bin/bash
# For the next session (written in session 35, not run): the DSA metadata route (GLM5_FASTPATH_DSA_METADATA=1, one
# kernel for the DSA backend's per-step decode metadata) in the engine, A B A B at batch 1 / 8, three timed calls
# each, host timing on (its DeepseekSparseAttnBackend.init_forward_metadata_out_graph probe shows the host time of the
# refresh with and without the route); the route's check mode compares its first 4 refreshes with SGLang's code
# (worker log: "DSA decode metadata check ... every buffer equals SGLang's"). Needs next1's GPU test of the op first.
# run on a machine that holds the site: C=<commit> bash this   (carry .carry/h200site.part.ab + the JIT seed)
export C=${C:?C=<commit>} BS=${BS:-1,8} CALLS=3 HOST_TIMING=1
DSA=GLM5_FASTPATH_DSA_METADATA=1,GLM5_FASTPATH_DSA_METADATA_CHECK=4
# then: glm5-fastpath bench compare-runs base=build/h200-offline-base_a,build/h200-offline-base_b \
#         dsa=build/h200-offline-dsa_a,build/h200-offline-dsa_b
RUNS="base_a dsa_a:$DSA base_b dsa_b:$DSA" exec bash "$(dirname "$0")/c_engine_ab.sh"
