#!/bin/bash
# Session 15, call 7 (nvidia-h200-x2): combine mode B (owners' output pools, pulled by the sources) next to mode A. GPU
# tests (simulated ranks, both modes; two real ranks, both modes), then EP2 bench: mode A with DeepGEMM (round 1),
# mode B, mode A with DeepGEMM again (round 2).
# run: C=<commit> bash .../c7_modes.sh (carry .carry/dgsite.tar.xz .carry/jit_ep.tar.xz)
source scripts/h200_lib.sh
export NCCL_NVLS_ENABLE=0 TORCH_SYMM_MEM_DISABLE_MULTICAST=1 NVSHMEM_DISABLE_NVLS=1
h200_setup "$OUT/r" .carry/dgsite.tar.xz .carry/jit_ep.tar.xz; export GLM5_FASTPATH_COMMIT=$C
run_tests sim 120 tests/moe/ep/test_ep_kernel.py -x -k "sim"
run_tests two 170 tests/moe/ep/test_ep_kernel.py -k "two_ranks"
T=1,8,16,32,64,128,256,512,1024,2048,4096
step a1 100 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 64 --tokens $T --out $H200_OUT/a1
step b1 70 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours --ep-mode B --ep-iters 10 --ep-check-tokens 64 --tokens $T --out $H200_OUT/b1
step a2 100 python3 -m glm5_fastpath.cli bench moe --ep 2 --ep-impls ours,deepgemm --ep-iters 10 --ep-check-tokens 0 --tokens $T --out $H200_OUT/a2
H200_OUT=$H200_OUT python3 - <<'PY' > $H200_OUT/summary.txt 2>&1
import json, glob, os
o = os.environ["H200_OUT"]
for f in sorted(glob.glob(o + "/*/megamoe_ep_bench.json")):
    d = json.load(open(f))
    for r in d["rows"]:
        x, g = r.get("ours", {}), r.get("deepgemm", {})
        gx, gg = x.get("graph_median_us"), g.get("graph_median_us")
        print(os.path.basename(os.path.dirname(f)), r["tokens_per_rank"], round(r["floor_us"], 1), x.get("config"), gx and round(gx, 1), "dg", gg and round(gg, 1), f"{gg / gx:.3f}x" if gx and gg else "", f"floor {gx / r['floor_us']:.3f}" if gx else "", x.get("rel_err_vs_reference_max_rank"), x.get("error", ""))
PY
cat $H200_OUT/summary.txt
h200_pack
