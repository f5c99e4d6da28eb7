#!/bin/bash
# Session 15, call 12 (nvidia-h200-x2): the target range of issue #8 (1-256 tokens per rank) once more at the final
# commit, ours (mode A, default_ep_config) and DeepGEMM fp8_mega_moe, two rounds.
# run: C=<commit> bash .../c12_closing_small.sh (carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
DEADLINE=250
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
for r in 1 2; do
  step r$r 90 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 8 --tokens 1,8,16,32,64,128,256 --out $H200_OUT/r$r
done
H200_OUT=$H200_OUT python3 - <<'PY' > $H200_OUT/summary.txt 2>&1
import json, glob, os
o = os.environ["H200_OUT"]
for f in sorted(glob.glob(o + "/r*/megamoe_ep_bench.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        x, g = r.get("ours", {}), r.get("deepgemm", {})
        gx, gg = x.get("graph_median_us"), g.get("graph_median_us")
        print(os.path.basename(os.path.dirname(f)), r["tokens_per_rank"], round(r["floor_us"], 1), x.get("config"), gx and round(gx, 1), "dg", gg and round(gg, 1), f"{gg / gx:.3f}x" if gx and gg else "", x.get("rel_err_vs_reference_max_rank"))
PY
cat $H200_OUT/summary.txt
h200_pack
