#!/bin/bash
# Prepared for the next session (issue #9; not run in session 16): the SGLang 0.5.14 offline engine, stock then
# glm5_fastpath with benchmarks/tables/h200_engine_session16.json (session 16's CMP modes, MegaMoE defaults), batch
# 1 / 8 / 16 / 32 / 64, one mode per call (scripts/h200_sglang_offline.sh's time plan).
# Carry: .carry/h200site.tar.xz only (scripts/build_h200_site.sh without nvidia-cutlass: 41.7 MB; with the
# repository's ~21 MiB of tracked files that is ~61 MiB of the 64 MiB a call takes).
# run:  C=<commit> MODE=stock    bash this      (call 1)
#       C=<commit> MODE=fastpath bash this      (call 2, same warm machine: the merged report)
set -euo pipefail
export GLM5_FASTPATH_COMMIT=${C:?C=<commit>}
export FASTPATH_CONFIG=$PWD/benchmarks/tables/h200_engine_session16.json
OUT=${OUT:?} scripts/h200_sglang_offline.sh .carry/h200site.tar.xz "${MODE:?MODE=stock|fastpath}"
