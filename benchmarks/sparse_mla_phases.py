"""Where a sparse-MLA decode call's time goes: the split kernel alone, the combine kernel alone, and both (the op),
per split tile and token count, on one GPU (H200). The combine's input is the split kernel's own workspace, so the
two phases time exactly what the op runs.

    python benchmarks/sparse_mla_phases.py --out DIR [--tokens 1,2,4,8,16,32,64] [--replays 30]

Timing: bench.timing.time_launches (CUDA-graph replays, each launch on its own slot table of random slots over a
KV cache far larger than L2). Writes DIR/sparse_mla_phases.json and .md. Why (session 25): the partial outputs
are T x splits x H x 512 fp32 (~16.8 MB whenever the grid is ~128 CTAs of 64 heads), written by the split kernel
and read back by the combine; this measures what that hand-off costs against the gather + attention work.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--tokens", default="1,2,4,8,16,32,64")
    ap.add_argument("--replays", type=int, default=30)
    ap.add_argument("--tables", type=int, default=8)
    ap.add_argument("--max-cluster", type=int, default=0, help="override ops.sparse_mla.WGMMA_MAX_CLUSTER (2 / 4 / 8)")
    ap.add_argument("--tiles", default="mma,wgmma")
    ap.add_argument("--cluster-mode", default="", help="override ops.sparse_mla.WGMMA_CLUSTER (pair / auto / off) for the "
                    "op column")
    a = ap.parse_args()
    import torch

    from glm5_fastpath.bench.meta import git_commit, utc_now
    from glm5_fastpath.bench.timing import time_launches
    from glm5_fastpath.ops import sparse_mla as SM

    if a.max_cluster:
        SM.WGMMA_MAX_CLUSTER = a.max_cluster
    if a.cluster_mode:
        if a.cluster_mode not in SM.WGMMA_CLUSTER_CHOICES:
            raise SystemExit(f"--cluster-mode must be one of {SM.WGMMA_CLUSTER_CHOICES}")
        SM.WGMMA_CLUSTER = a.cluster_mode

    dev = torch.device("cuda", torch.cuda.current_device())
    idx_dev = dev.index
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    g = torch.Generator(device=dev).manual_seed(0)
    S, H, K = 1 << 17, 64, 2048
    kv = (torch.randn(S, 1, 576, device=dev, generator=g) * 0.5).to(torch.bfloat16)
    scale = 1.0 / math.sqrt(256)
    rows = []
    for t in [int(x) for x in a.tokens.split(",")]:
        q = (torch.randn(t, H, 576, device=dev, generator=g) * 0.5).to(torch.bfloat16)
        tables = [torch.stack([torch.randperm(S, device=dev, generator=g)[:K] for _ in range(t)]).to(torch.int32)
                  for _ in range(a.tables)]
        for tile in a.tiles.split(","):
            kern = SM.resolve_kernel(tile, H, t)
            plan = SM.plan_for(kern, t, H, K, sms)
            if kern == "wgmma_pp":
                split_k, hb, thr, smem = SM._wgmma_kernel(idx_dev, SM.FUNCTION_SPLIT_PP, SM.WGMMA_STAGES), \
                    SM.WGMMA_HEAD_BLOCK, SM.PP_THREADS, SM.PP_SMEM
            elif kern == "wgmma":
                split_k, hb, thr, smem = SM._wgmma_kernel(idx_dev, SM.FUNCTION_SPLIT_WGMMA, SM.WGMMA_STAGES), \
                    SM.WGMMA_HEAD_BLOCK, SM.WGMMA_THREADS, SM.WGMMA_SMEM
            else:
                split_k, hb, thr, smem = SM._kernel(idx_dev, SM.FUNCTION_SPLIT), SM.HEAD_BLOCK, SM.SPLIT_THREADS, \
                    SM.SPLIT_SMEM
            get = (lambda f: SM._wgmma_kernel(idx_dev, f, SM.WGMMA_STAGES)) if kern in ("wgmma", "wgmma_pp") else \
                (lambda f: SM._kernel(idx_dev, f))
            ns = plan.num_splits
            o_part = torch.empty(t, ns, H, 512, device=dev)
            lse_part = torch.empty(t, ns, H, device=dev)
            o = torch.empty(t, H, 512, dtype=torch.bfloat16, device=dev)
            lse = torch.empty(t, H, device=dev)

            def split(i, q=q, o_part=o_part, lse_part=lse_part, ns=ns, split_k=split_k, hb=hb, thr=thr, smem=smem,
                      kern=kern):
                args = SM._split_args(q, kv, tables[i % len(tables)], o_part, lse_part, ns, scale)
                if kern == "wgmma":  # cluster 1: the partial round trip, the phase the combine reads
                    args = SM._split_args_wgmma(q, kv, tables[i % len(tables)], o_part, lse_part, ns, scale, o, lse, 1)
                elif kern == "wgmma_pp":
                    args = SM._pp_args(q, kv, tables[i % len(tables)], o_part, lse_part, ns, scale)
                split_k.launch((t, ns, H // hb), (thr, 1, 1), args, smem=smem, pdl=True)

            def combine_cta(i, o_part=o_part, lse_part=lse_part, ns=ns, get=get):
                SM._launch_combine(get, o_part, lse_part, o, lse, ns, t, H, True, combine="cta")

            def combine_warp(i, o_part=o_part, lse_part=lse_part, ns=ns, get=get):
                SM._launch_combine(get, o_part, lse_part, o, lse, ns, t, H, True, combine="warp")

            def both(i, q=q):
                SM.sparse_mla_decode(q, kv, tables[i % len(tables)], scale, kernel=kern)

            def both_nocluster(i, q=q):
                SM._launch(q, kv, tables[i % len(tables)], scale, o, lse, True, None, kernel=kern, cluster="off")

            r = {"T": t, "tile": kern, "splits": ns, "blocks_per_split": plan.blocks_per_split,
                 "partial_mb": o_part.numel() * 4 / 1e6}
            split(0)  # the workspace both combines read
            r["cluster"] = SM.wgmma_cluster(ns) if kern == "wgmma" else 1
            for name, fn in (("op", both), ("op_nocluster", both_nocluster), ("split", split),
                             ("combine_cta", combine_cta), ("combine_warp", combine_warp)):
                r[f"{name}_us"] = time_launches(fn, len(tables), device=dev, replays=a.replays).median_us
            rows.append(r)
            print(json.dumps(r), flush=True)
    res = {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparse_mla_phases.json").write_text(json.dumps(res, indent=1))
    lines = [f"# Sparse-MLA decode phases ({res['gpu']}, {res['date']}, commit {res['commit']})", "",
             f"op = the op (COMBINE={SM.COMBINE!r}, WGMMA_CLUSTER={SM.WGMMA_CLUSTER!r}, WGMMA_MAX_CLUSTER="
             f"{SM.WGMMA_MAX_CLUSTER}: cluster = CTAs merged in a "
             "cluster); op, no cluster = the partial round trip + combine; split / combine = the kernels alone.", "",
             "| T | tile | splits | blocks/split | cluster | partials MB | op us | op, no cluster us | split kernel us | "
             "combine (cta) us | combine (warp) us |",
             "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['T']} | {r['tile']} | {r['splits']} | {r['blocks_per_split']} | {r['cluster']} | "
                     f"{r['partial_mb']:.1f} | {r['op_us']:.2f} | {r['op_nocluster_us']:.2f} | {r['split_us']:.2f} | "
                     f"{r['combine_cta_us']:.2f} | {r['combine_warp_us']:.2f} |")
    (out / "sparse_mla_phases.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
