"""`glm5-fastpath bench moe --ep N`: MoE across N GPUs (expert parallelism), slowest rank per token count.

Implementations, same weights (global stack seeded per expert id; rank r holds EPPartition rows), same
routing (uniform over all 256 experts, seeded per (tokens, rank)), tokens = per-rank token count:
  staged    NCCL all-gather dispatch -> DeepGEMM m_grouped_fp8_gemm_nt_contiguous per local expert group
            (FC1, SwiGLU + 1x128 requant, FC2) -> NCCL reduce-scatter combine (moe/ep/staged.py);
  deepgemm  deep_gemm.fp8_mega_moe on the N-rank group (symmetric buffer get_symm_buffer_for_mega_moe(group,
            E=256, max_tokens, k, H, I)); its input copy into the buffer is outside the timed region, as in
            bench moe (glm5_fastpath/bench/moe.py::DeepGemmMegaMoE);
  ours      the in-kernel EP MegaMoE (glm5_fastpath.moe.ep.kernel.EPMegaMoE: dispatch, FC1, FC2 and combine in one
            kernel per rank over torch symmetric memory); its input copy into the symmetric buffer (stage) is outside
            the timed region, as DeepGEMM's. Config per token count: kernel.default_ep_config, or --ep-config.
Routed experts only by default (what DeepGEMM's fp8_mega_moe computes); --ep-shared adds the replicated
shared expert to staged / ours.

Timing (the design notes' section 17 method): warm-up, then (1) per iteration: barrier, CUDA events around
one call, all_reduce(MAX) over ranks -> median of the per-iteration slowest rank; (2) window: barrier, one
pair of events around `iters` back-to-back calls, all_reduce(MAX) -> mean. Collectives stay eager (no CUDA
graph): the staged baseline's NCCL calls and DeepGEMM's barriers are part of what is measured.
Correctness: for token counts <= --ep-check-tokens every implementation's output is compared with the EP
reference (moe/ep/reference.py, ep_forward_dist: the single-GPU MegaMoE math, mode A), rel_err max over ranks;
DeepGEMM's against the reference with routed_scaling_factor 1 (fp8_mega_moe does not apply it).
Floor per token count: the largest number of local experts any rank touches x 37.75 MB / 4.27 TB/s (weight bytes;
NVLink traffic is far smaller at these sizes, docs/megamoe_ep.md section 3).

--ep-device cpu runs the same harness on N gloo processes with small dims (H 256, I 128, 16 experts, top-4)
and the reference grouped GEMM: a smoke test of the harness (tests/moe/ep/test_ep_bench.py), not a benchmark.
Writes <out>/megamoe_ep_bench.json and .md.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import statistics
import time
import traceback
from pathlib import Path
from typing import Any, Callable

import torch

from ...ref.fp8 import quant_act_per_token, quant_weight_block
from .layout import EPPartition
from .reference import RankInputs, RankWeights, ep_forward_dist
from .staged import DeepGemmGroupedGemm, reference_grouped_gemm, staged_forward_dist

GLM5 = dict(hidden=6144, inter=2048, experts=256, topk=8)
SMALL = dict(hidden=256, inter=128, experts=16, topk=4)
RSF = 2.5
IMPLS = ("staged", "deepgemm", "ours")


def add_ep_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--ep", type=int, default=1,
                    help="expert parallelism: N > 1 runs the EP bench on N local GPUs (one process each): staged "
                         "baseline vs DeepGEMM fp8_mega_moe vs ours, slowest rank; --tokens are per rank")
    ap.add_argument("--ep-impls", default=",".join(IMPLS), help=f"EP implementations, comma list of {IMPLS}")
    ap.add_argument("--ep-device", default="cuda", choices=("cuda", "cpu"),
                    help="cpu: gloo + small dims + reference GEMMs (a harness smoke test, not a benchmark)")
    ap.add_argument("--ep-shared", action="store_true", help="include the replicated shared expert (staged, ours)")
    ap.add_argument("--ep-check-tokens", type=int, default=64,
                    help="check outputs against the EP reference for token counts up to this (0: never)")
    ap.add_argument("--ep-iters", type=int, default=20, help="timed iterations per token count")
    ap.add_argument("--ep-mode", default="A", choices=("A", "B"), help="ours: combine mode (moe/ep/kernel.py "
                    "SymLayout): A = FC2 stores into the source's slots, B = sources read the owners' output pools")
    ap.add_argument("--ep-routing", default="uniform", choices=("uniform", "local"),
                    help="uniform over all experts, or local: each rank's tokens pick only its own experts (diagnostic)")
    ap.add_argument("--ep-bench", action="store_true", help="run this EP benchmark also at --ep 1 (one rank: the EP "
                    "kernel's machinery without remote traffic, against DeepGEMM on a one-rank group)")
    ap.add_argument("--ep-graph-calls", type=int, default=30, help="calls per CUDA-graph replay (graph timing)")
    ap.add_argument("--ep-config", default="", help="ours: MegaMoE pool config name for every token count "
                    "(default: kernel.default_ep_config per count)")


# ---- data (identical on every rank and device for the same seed) ------------------------------------------------

def expert_weights(e: int, hidden: int, inter: int, dev: torch.device, seed: int = 0) -> tuple[torch.Tensor, ...]:
    """Expert e of the global stack, generated from its own seed (a rank makes only its local experts)."""
    g = torch.Generator(device=dev).manual_seed(seed * 1_000_003 + e)
    w13, s13 = quant_weight_block(torch.randn(2 * inter, hidden, generator=g, device=dev) * 0.02)
    w2, s2 = quant_weight_block(torch.randn(hidden, inter, generator=g, device=dev) * 0.02)
    return w13, s13, w2, s2


def local_weights(part: EPPartition, rank: int, hidden: int, inter: int, dev: torch.device) -> RankWeights:
    ws = [expert_weights(e, hidden, inter, dev) for e in part.weight_rows(rank)]
    return RankWeights(*(torch.stack([w[i] for w in ws]) for i in range(4)))


def rank_inputs(m: int, rank: int, experts: int, topk: int, hidden: int, dev: torch.device, routing: str = "uniform",
                world: int = 1) -> RankInputs:
    """uniform: top-k distinct experts of all; local: of this rank's own experts only (no NVLink traffic; the same
    per-rank work as uniform: a diagnostic of the EP machinery's cost)."""
    g = torch.Generator(device=dev).manual_seed(10_007 * m + rank)
    x8, xs = quant_act_per_token(torch.randn(m, hidden, generator=g, device=dev).to(torch.bfloat16))
    if routing == "local":
        epr = experts // world
        ids = (torch.argsort(torch.rand(m, epr, generator=g, device=dev), dim=1)[:, :topk] + rank * epr).to(torch.int32)
    else:
        ids = torch.argsort(torch.rand(m, experts, generator=g, device=dev), dim=1)[:, :topk].to(torch.int32)
    w = torch.rand(m, topk, generator=g, device=dev) + 0.05
    return RankInputs(x8, xs, ids, (w / w.sum(-1, keepdim=True)).float())


# ---- timing ------------------------------------------------------------------------------------------------------

def time_slowest_rank(fn: Callable[[], Any], dev: torch.device, iters: int, warmup: int = 3, group=None) -> dict:
    """Per-iteration median and window mean of the slowest rank (microseconds)."""
    import torch.distributed as dist
    cuda = dev.type == "cuda"

    def sync():
        if cuda:
            torch.cuda.synchronize(dev)

    for _ in range(warmup):
        fn()
    sync()
    per = []
    for _ in range(iters):
        dist.barrier(group=group)
        sync()
        if cuda:
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            per.append(a.elapsed_time(b) * 1e3)
        else:
            t0 = time.perf_counter()
            fn()
            per.append((time.perf_counter() - t0) * 1e6)
    dist.barrier(group=group)
    sync()
    t0 = time.perf_counter()
    if cuda:
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
    for _ in range(iters):
        fn()
    if cuda:
        b.record()
        b.synchronize()
        window = a.elapsed_time(b) * 1e3 / iters
    else:
        window = (time.perf_counter() - t0) * 1e6 / iters
    t = torch.tensor(per + [window], dtype=torch.float64, device=dev if cuda else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    v = t.cpu().tolist()
    return {"median_us": statistics.median(v[:-1]), "min_us": min(v[:-1]), "window_mean_us": v[-1],
            "iters": iters, "method": "cuda-events, all_reduce(MAX)" if cuda else "cpu-wall, all_reduce(MAX)"}


def time_graph_slowest_rank(fn: Callable[[], Any], dev: torch.device, iters: int, calls: int = 10, group=None) -> dict:
    """CUDA-graph timing of the slowest rank: `calls` back-to-back calls captured in one graph per rank, then per
    iteration: barrier, CUDA events around one replay on every rank, all_reduce(MAX); per call = replay / calls.
    No host launch overhead (what a decode step's graph replays); the in-kernel barriers keep the ranks in step, and the
    host skew between the ranks' replay starts (tens of us) is spread over `calls` calls."""
    import torch.distributed as dist
    for _ in range(2):
        fn()
    torch.cuda.synchronize(dev)
    dist.barrier(group=group)
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream(dev)
    s.wait_stream(torch.cuda.current_stream(dev))
    with torch.cuda.stream(s):
        with torch.cuda.graph(g, stream=s):
            for _ in range(calls):
                fn()
    torch.cuda.synchronize(dev)
    dist.barrier(group=group)
    g.replay()  # warm-up replay (both ranks)
    torch.cuda.synchronize(dev)
    per = []
    for _ in range(iters):
        dist.barrier(group=group)
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        per.append(a.elapsed_time(b) * 1e3 / calls)
    t = torch.tensor(per, dtype=torch.float64, device=dev)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    v = t.cpu().tolist()
    del g
    return {"graph_median_us": statistics.median(v), "graph_min_us": min(v), "graph_calls": calls,
            "graph_method": "cuda-graph replay of back-to-back calls, all_reduce(MAX) per replay"}


def _max_over_ranks(x: float, dev: torch.device) -> float:
    import torch.distributed as dist
    t = torch.tensor([x], dtype=torch.float64, device=dev if dev.type == "cuda" else "cpu")
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return float(t.item())


def _rel_err(a: torch.Tensor, b: torch.Tensor) -> float:
    d = b.double().norm().item()
    n = (a.double() - b.double()).norm().item()
    return 0.0 if d == 0 and n == 0 else (n / d if d else float("inf"))


# ---- one rank --------------------------------------------------------------------------------------------------

def _rank_main(rank: int, world: int, cfg: dict) -> dict:
    import torch.distributed as dist
    dims = SMALL if cfg["device"] == "cpu" else GLM5
    H, I, E, K = dims["hidden"], dims["inter"], dims["experts"], dims["topk"]
    dev = torch.device("cuda", torch.cuda.current_device()) if cfg["device"] == "cuda" else torch.device("cpu")
    shared = 1 if cfg["shared"] else 0
    part = EPPartition(E, world, shared)
    w = local_weights(part, rank, H, I, dev)
    impls: dict[str, Any] = {}
    errors: dict[str, str] = {}
    if "staged" in cfg["impls"]:
        try:
            gg, align = (DeepGemmGroupedGemm(), None) if dev.type == "cuda" else (reference_grouped_gemm, 8)
            align = gg.align if align is None else align
            impls["staged"] = lambda inp: staged_forward_dist(inp, w, part, RSF, grouped_gemm=gg, align=align)
        except Exception as e:  # noqa: BLE001 - reported per row
            errors["staged"] = f"{type(e).__name__}: {e}"
    if "deepgemm" in cfg["impls"]:
        if shared:
            errors["deepgemm"] = "fp8_mega_moe has no shared expert (run without --ep-shared)"
        elif dev.type != "cuda":
            errors["deepgemm"] = "needs CUDA"
        else:
            try:
                from ...bench.moe import DeepGemmMegaMoE
                dg = DeepGemmMegaMoE(E, max(cfg["tokens"]), (w.w13, w.w13_scale, w.w2, w.w2_scale), dev)

                def run_dg(inp, dg=dg):
                    y = torch.empty(inp.x8.shape[0], H, dtype=torch.bfloat16, device=dev)
                    return dg(y)
                impls["deepgemm"] = run_dg
                impls["_dg_obj"] = dg
            except Exception as e:  # noqa: BLE001
                errors["deepgemm"] = f"{type(e).__name__}: {e}"
    ours_for: dict[str, Any] = {}
    if "ours" in cfg["impls"]:
        if dev.type != "cuda":
            errors["ours"] = "needs CUDA"
        else:
            try:
                from .. import megamoe as MM
                from .kernel import EPBuffers, EPMegaMoE, SymLayout, default_ep_config
                bufs = EPBuffers.symmetric(SymLayout.for_group(max(cfg["tokens"]), H, I, K, shared, world, E,
                                                               cfg.get("mode", "A")))
                wt = MM.prepare_weights(w.w13, w.w13_scale, w.w2, w.w2_scale, shared)

                def ours_obj(m: int):
                    c = (MM.MegaMoEConfig.from_name(cfg["ep_config"]) if cfg.get("ep_config")
                         else default_ep_config(m, world, E, K))
                    if c.name not in ours_for:
                        ours_for[c.name] = EPMegaMoE(wt, bufs, num_experts=E, topk=K, config=c,
                                                     routed_scaling_factor=RSF)
                    return ours_for[c.name]
                impls["ours"] = ours_obj
            except Exception as e:  # noqa: BLE001
                errors["ours"] = f"{type(e).__name__}: {e}"
                traceback.print_exc()
    rows = []
    for m in cfg["tokens"]:
        inp = rank_inputs(m, rank, E, K, H, dev, cfg.get("routing", "uniform"), world)
        row: dict[str, Any] = {"tokens_per_rank": m, "tokens_total": m * world}
        ref = ref1 = None
        if m <= cfg["check_tokens"]:
            ref = ep_forward_dist(inp, w, part, RSF, modes=("A",)).out["A"][0]
            if "deepgemm" in impls:
                ref1 = ep_forward_dist(inp, w, part, 1.0, modes=("A",)).out["A"][0]
        # weight-bytes floor of the slowest rank: the most local experts any rank touches, from every rank's tokens
        # (every rank's routing is generated from its seed, so each rank can regenerate all of them)
        all_ids = torch.cat([rank_inputs(m, r, E, K, H, dev, cfg.get("routing", "uniform"), world).topk_ids.long().flatten()
                             for r in range(world)])
        mine = torch.unique(all_ids[(all_ids // (E // world)) == rank])
        row["experts_touched_rank"] = int(mine.numel()) + shared
        from ...bench.moe import BW_FLOOR  # the single-GPU bench's bandwidth floor (H200 HBM)
        row["floor_us"] = _max_over_ranks(row["experts_touched_rank"] * 3 * H * I / BW_FLOOR * 1e6, dev)
        for name in IMPLS:
            if name in errors:
                row[name] = {"error": errors[name]}
                continue
            if name not in impls:
                continue
            fn = impls[name]
            try:
                extra: dict[str, Any] = {}
                if name == "deepgemm":
                    impls["_dg_obj"].load(inp.x8, inp.x_scale, inp.topk_ids, inp.topk_weights)
                if name == "ours":
                    moe = fn(m)
                    moe.stage(inp.x8, inp.x_scale, inp.topk_ids, inp.topk_weights)
                    y = torch.empty(m, H, dtype=torch.bfloat16, device=dev)
                    res = time_slowest_rank(lambda: moe.run_staged(m, y), dev, cfg["iters"])
                    extra = {"config": moe.config.name, "grid": moe.grid}
                    if cfg.get("graph", True):
                        extra.update(time_graph_slowest_rank(lambda: moe.run_staged(m, y), dev, cfg["iters"],
                                                             cfg.get("graph_calls", 30)))
                    fn = moe  # the full call (stage + kernels) for the check
                else:
                    res = time_slowest_rank(lambda: fn(inp), dev, cfg["iters"])
                    if name == "deepgemm" and cfg.get("graph", True):
                        try:
                            extra.update(time_graph_slowest_rank(lambda: fn(inp), dev, cfg["iters"],
                                                                 cfg.get("graph_calls", 30)))
                        except Exception as e:  # noqa: BLE001 - the eager timings stand
                            extra["graph_error"] = f"{type(e).__name__}: {str(e)[:200]}"
                res.update(extra)
                want = ref1 if name == "deepgemm" else ref
                if want is not None:
                    out = (fn(inp.x8, inp.x_scale, inp.topk_ids, inp.topk_weights) if name == "ours" else fn(inp))
                    res["rel_err_vs_reference_max_rank"] = _max_over_ranks(_rel_err(out, want) if m else 0.0, dev)
                row[name] = res
            except Exception as e:  # noqa: BLE001 - keep benchmarking the rest
                row[name] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
        rows.append(row)
        if rank == 0:
            print("  " + _row_line(row), flush=True)
    dist.barrier()
    return {"rank": rank, "rows": rows, "dims": dims, "device": str(dev),
            "gpu": torch.cuda.get_device_name(dev) if dev.type == "cuda" else "cpu"}


def _row_line(row: dict) -> str:
    parts = [f"M/rank={row['tokens_per_rank']:5d}"]
    for n in IMPLS:
        v = row.get(n, {})
        parts.append(f"{n}={v['median_us']:9.1f} us" if "median_us" in v else f"{n}=-")
    return "  ".join(parts)


def _best(v: dict) -> float | None:
    """The number a ratio uses: the CUDA-graph median when measured, else the eager window mean."""
    return v.get("graph_median_us") or v.get("window_mean_us")


def markdown(result: dict) -> str:
    lines = [f"# MegaMoE EP{result['ep']} benchmark ({result['gpu']}, {result['date']}, commit {result.get('commit', '?')})",
             "",
             "Slowest rank per call (all_reduce MAX over the ranks), microseconds: eager per-iteration median (barrier + "
             "events around one call: includes the ranks' host skew), eager window mean (back-to-back calls: includes "
             f"host launch overhead when it exceeds the GPU time), CUDA-graph median ({result.get('graph_calls', 10)} calls "
             f"per replay: the GPU time). Routing: {result.get('routing', 'uniform')}; ours: combine mode "
             f"{result.get('mode', 'A')}. "
             f"Ratios use the graph median where there is one, else the window. {result['dims']}, routed experts only "
             f"unless shared={result['shared']}.", "",
             "| tokens/rank | floor us | " + " | ".join(f"{n} median | {n} window | {n} graph | {n} rel_err" for n in IMPLS)
             + " | ours config | DeepGEMM / ours | staged / ours | ours / floor |",
             "|---|---|" + "---|---|---|---|" * len(IMPLS) + "---|---|---|---|"]
    for r in result["rows"]:
        fl = r.get("floor_us")
        cells = [f"{fl:.1f}" if fl else "-"]
        for n in IMPLS:
            v = r.get(n, {})
            if "median_us" in v:
                e = v.get("rel_err_vs_reference_max_rank")
                g = v.get("graph_median_us")
                cells += [f"{v['median_us']:.1f}", f"{v['window_mean_us']:.1f}", f"{g:.1f}" if g else "-",
                          "-" if e is None else f"{e:.1e}"]
            else:
                cells += [v.get("error", "-")[:40], "-", "-", "-"]
        o, d, st = (_best(r.get(n, {})) for n in ("ours", "deepgemm", "staged"))
        cells += [r.get("ours", {}).get("config", "-"), f"{d / o:.2f}x" if o and d else "-",
                  f"{st / o:.2f}x" if o and st else "-", f"{o / fl:.2f}" if o and fl else "-"]
        lines.append(f"| {r['tokens_per_rank']} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def run_ep(args: argparse.Namespace) -> int:
    from .launch import run_ranks
    n = int(args.ep)
    impls = [s for s in args.ep_impls.split(",") if s]
    bad = [s for s in impls if s not in IMPLS]
    if bad:
        raise ValueError(f"bench moe --ep: unknown implementation(s) {bad}; choose from {IMPLS}")
    if args.ep_device == "cuda" and (not torch.cuda.is_available() or torch.cuda.device_count() < n):
        have = torch.cuda.device_count() if torch.cuda.is_available() else 0
        raise ValueError(f"bench moe --ep {n}: needs {n} CUDA GPUs, found {have} (--ep-device cpu: harness smoke run)")
    cfg = {"tokens": [int(t) for t in args.tokens.split(",") if t], "impls": impls, "device": args.ep_device,
           "shared": bool(args.ep_shared), "check_tokens": int(args.ep_check_tokens), "iters": int(args.ep_iters),
           "ep_config": getattr(args, "ep_config", ""), "routing": getattr(args, "ep_routing", "uniform"),
           "mode": getattr(args, "ep_mode", "A"),
           "graph_calls": int(getattr(args, "ep_graph_calls", 30))}
    print(f"bench moe --ep {n} ({args.ep_device}): {impls}, tokens per rank {cfg['tokens']}", flush=True)
    res = run_ranks(_rank_main, n, (cfg,), backend="nccl" if args.ep_device == "cuda" else "gloo",
                    timeout_s=1800.0)
    r0 = res[0]
    result = {"ep": n, "date": _dt.date.today().isoformat(), "gpu": r0["gpu"], "dims": r0["dims"],
              "routing": cfg["routing"], "graph_calls": cfg["graph_calls"], "mode": cfg["mode"],
              "shared": cfg["shared"], "impls": impls, "rows": r0["rows"], "torch": torch.__version__}
    try:
        from ...bench.meta import git_commit
        result["commit"] = git_commit()
    except Exception:  # noqa: BLE001
        pass
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "megamoe_ep_bench.json").write_text(json.dumps(result, indent=1))
    (out / "megamoe_ep_bench.md").write_text(markdown(result))
    print(markdown(result))
    return 0


__all__ = ["add_ep_arguments", "expert_weights", "local_weights", "markdown", "rank_inputs", "run_ep",
           "time_slowest_rank"]
