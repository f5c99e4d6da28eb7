#!/bin/bash
# Session 15, call 5 (nvidia-h200-x2): where the EP kernel's time goes. EP1 (one rank: the EP machinery, no remote
# traffic) vs DeepGEMM on a one-rank group and vs the single-GPU pool builds on (b); EP2 uniform vs EP2 local routing
# (each rank's tokens pick its own experts: the same per-rank work, no NVLink traffic). Graph timing, 30 calls/replay.
# run: C=<commit> bash .../c5_ep_overheads.sh (carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
T=1,8,64,256,1024,4096
step ep2u 150 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 8 --tokens $T --out $H200_OUT/ep2u
step ep2l 100 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours --ep-routing local --ep-iters 10 --ep-check-tokens 8 --tokens $T --out $H200_OUT/ep2l
step ep1 120 python3 -m glm5_fastpath.cli bench moe --ep 1 --ep-bench --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 8 --tokens 1,8,64,256,1024 --out $H200_OUT/ep1
step b1 100 python3 -m glm5_fastpath.cli bench moe --no-deepgemm --settings b --tokens 1,8,64,256 --configs bn8_s6_g512_w0_lf_p_e,bn16_s6_g512_w0_lf_p_e,bn32_s6_g512_w0_lf_p_e,bn64_s5_g512_w0_lf_p_e --out $H200_OUT/b1
H200_OUT=$H200_OUT python3 - <<'PY' > $H200_OUT/summary.txt 2>&1
import json, glob, os
o = os.environ["H200_OUT"]
for f in sorted(glob.glob(o + "/ep*/megamoe_ep_bench.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        x, g = r.get("ours", {}), r.get("deepgemm", {})
        print(os.path.basename(os.path.dirname(f)), r["tokens_per_rank"], round(r["floor_us"], 1), x.get("config"), x.get("graph_median_us"), x.get("window_mean_us"), "dg", g.get("graph_median_us"), g.get("window_mean_us"))
PY
cat $H200_OUT/summary.txt; sed -n '/| setting | tokens | config/,$p' $H200_OUT/b1/megamoe_bench.md | grep "^| b "
h200_pack
