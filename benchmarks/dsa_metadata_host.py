"""Host and GPU cost of one decode step's DSA metadata refresh: SGLang 0.5.14's torch sequence against our one-kernel
FastLauncher (the DSA metadata route, GLM5_FASTPATH_DSA_METADATA=1), outside the engine.

Why: the route exists for host time per step (the batch-1 decode step is paced by the host, session 35); this measures
that host time directly, without the engine's run-to-run spread. Per (batch size, context): the host time of one
refresh call (perf_counter around the call, the GPU idle, median of R) and the GPU time of R refreshes back to back
(CUDA events), for SGLang's sequence (`sglang_sequence`: the decode branch of
DeepseekSparseAttnBackend._apply_cuda_graph_metadata minus DeepGEMM's schedule, which the route keeps) and for ours;
the outputs are compared bitwise first.

usage: python3 benchmarks/dsa_metadata_host.py [--batches 1,8,32] [--contexts 400,8192] [--page-size 64]
       [--replays 200] [--out DIR]      (default DIR benchmarks/results/dsa_metadata_host)
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path


def int_list(spec: str, name: str) -> list[int]:
    try:
        out = [int(x) for x in spec.split(",") if x.strip()]
    except ValueError:
        raise SystemExit(f"--{name}: comma-separated positive integers, got {spec!r}") from None
    if not out or min(out) < 1:
        raise SystemExit(f"--{name}: comma-separated positive integers, got {spec!r}")
    return out


def sglang_sequence(torch, req_to_token, req_pool_indices, seq_lens, seq_lens_cpu, topk, page_size, b) -> int:
    """SGLang's side, as its decode branch runs per step: max_len from the CPU lengths, then its torch ops
    (ops.dsa_metadata.reference_into) into the buffers `b`."""
    from glm5_fastpath.ops.dsa_metadata import reference_into

    max_len = int(seq_lens_cpu.max().item())
    reference_into(req_to_token, req_pool_indices, seq_lens, max_len, topk, page_size, **b)
    return max_len


def buffers(torch, bs: int, ctx: int, page_size: int, dev) -> dict:
    i32 = torch.int32
    return {"cache_seqlens": torch.zeros(bs, dtype=i32, device=dev), "cu_seqlens_k": torch.zeros(bs + 1, dtype=i32, device=dev),
            "dsa_seqlens": torch.zeros(bs, dtype=i32, device=dev), "dsa_cu": torch.zeros(bs + 1, dtype=i32, device=dev),
            "page_table_1": torch.zeros(bs, ctx, dtype=i32, device=dev),
            "real_table": torch.zeros(bs, -(-ctx // page_size), dtype=i32, device=dev) if page_size > 1 else None}


def time_host(fn, reps: int, torch) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    xs = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        xs.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    return statistics.median(xs)


def time_gpu(fn, reps: int, torch) -> float:
    e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    e0.record()
    for _ in range(reps):
        fn()
    e1.record()
    torch.cuda.synchronize()
    return e0.elapsed_time(e1) * 1e3 / reps


def render(res: dict) -> str:
    lines = [f"# DSA decode metadata refresh: SGLang's torch sequence vs one kernel ({res['gpu']}, {res['date']}, "
             f"commit {res['commit']})", "",
             "Host: one refresh call on an idle GPU (median). GPU: refreshes back to back (CUDA events), which for "
             "SGLang's sequence includes its launch gaps. Bitwise: every buffer equal after the same inputs.", "",
             "| batch | context | page size | SGLang host us | ours host us | host saved us | SGLang GPU us | ours GPU us "
             "| bitwise |", "|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res["rows"]:
        lines.append(f"| {r['bs']} | {r['ctx']} | {r['page_size']} | {r['sglang_host_us']:.1f} | {r['ours_host_us']:.1f} | "
                     f"{r['sglang_host_us'] - r['ours_host_us']:.1f} | {r['sglang_gpu_us']:.1f} | {r['ours_gpu_us']:.1f} | "
                     f"{r['bitwise']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--batches", default="1,8,32")
    ap.add_argument("--contexts", default="400,8192")
    ap.add_argument("--page-size", type=int, default=64)
    ap.add_argument("--topk", type=int, default=2048)
    ap.add_argument("--replays", type=int, default=200)
    ap.add_argument("--out", default="benchmarks/results/dsa_metadata_host")
    a = ap.parse_args(argv)
    batches, contexts = int_list(a.batches, "batches"), int_list(a.contexts, "contexts")
    if a.page_size < 1 or a.replays < 10:
        raise SystemExit("--page-size >= 1 and --replays >= 10")
    import torch

    if not torch.cuda.is_available():
        print("dsa_metadata_host: needs a CUDA GPU", file=sys.stderr)
        return 2
    from glm5_fastpath.ops.dsa_metadata import FastLauncher

    dev = torch.device("cuda")
    rows = []
    for bs in batches:
        for ctx in contexts:
            g = torch.Generator().manual_seed(bs * 7 + ctx)
            pool = bs + 3
            r2t = torch.randint(0, 1 << 22, (pool, ctx), generator=g, dtype=torch.int32).to(dev)
            idx = torch.randperm(pool, generator=g)[:bs].to(dev)
            lens_cpu = torch.randint(1, ctx + 1, (bs,), generator=g)
            lens_cpu[0] = ctx
            lens = lens_cpu.to(dev)
            ref, ours = buffers(torch, bs, ctx, a.page_size, dev), buffers(torch, bs, ctx, a.page_size, dev)
            fl = FastLauncher(r2t, idx, lens, a.topk, a.page_size, **ours)
            sg = lambda: sglang_sequence(torch, r2t, idx, lens, lens_cpu, a.topk, a.page_size, ref)  # noqa: E731
            us = lambda: fl(int(lens_cpu.max().item()))  # noqa: E731 - the route computes max_len the same way
            sg()
            us()
            torch.cuda.synchronize()
            bitwise = all(torch.equal(ref[k], ours[k]) for k in ref if ref[k] is not None)
            row = {"bs": bs, "ctx": ctx, "page_size": a.page_size, "bitwise": bitwise,
                   "sglang_host_us": time_host(sg, a.replays, torch), "ours_host_us": time_host(us, a.replays, torch),
                   "sglang_gpu_us": time_gpu(sg, a.replays, torch), "ours_gpu_us": time_gpu(us, a.replays, torch)}
            rows.append(row)
            print(f"bs {bs:4d} ctx {ctx:6d}: host {row['sglang_host_us']:7.1f} -> {row['ours_host_us']:6.1f} us, "
                  f"GPU {row['sglang_gpu_us']:6.1f} -> {row['ours_gpu_us']:5.1f} us, bitwise {bitwise}", flush=True)
    from glm5_fastpath.bench.meta import git_commit, utc_now

    res = {"gpu": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(), "torch": torch.__version__,
           "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "dsa_metadata_host.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "dsa_metadata_host.md").write_text(render(res))
    print(f"wrote {out}/dsa_metadata_host.md")
    return 0 if all(r["bitwise"] for r in rows) else 1


if __name__ == "__main__":
    raise SystemExit(main())
