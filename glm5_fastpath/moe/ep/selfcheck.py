"""Correctness checks of the in-kernel EP MegaMoE (kernel.py) against the single-GPU MegaMoE on the gathered batch.

The EP kernel computes every pair (token, slot) with the same FP8 math as the single-GPU kernel (same build family,
same token block; a column's result does not depend on the other columns of its block) and sums a token's S slots in
the same order, so rank r's output must equal, bit for bit, rows [base_r, base_r + M_r) of the single-GPU kernel run on
[rank 0 tokens | rank 1 tokens | ...] with all experts -- except with split-K FC1 tiles (bn <= 16, few tiles), whose
use depends on the rank's tile count: those are compared within FP8 noise instead.

    check_simulated(world, tokens, ...)   N ranks on one GPU (EPBuffers.simulated), returns a report dict
    check_rank(rank, world, case)         one rank of a torch.distributed group (launch.run_ranks, NCCL), idem

Used by tests/moe/ep/test_ep_kernel.py and the H200 call scripts.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

import torch

from .. import megamoe as M
from ...ref.fp8 import quant_act_per_token
from ...testing.moe_data import make_experts
from . import kernel as K

BF16 = torch.bfloat16


def global_weights(num_experts: int, hidden: int, inter: int, seed: int, dev: torch.device) -> tuple[torch.Tensor, ...]:
    """Checkpoint-layout stack [num_experts routed..., 1 shared] (the tests' generator, testing.moe_data)."""
    return make_experts(num_experts + 1, hidden, inter, seed, device=dev)


def rank_routing(m: int, num_experts: int, topk: int, world: int, kind: str, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Global topk ids [m, k] int32 + normalised weights. uniform: k distinct experts of all; rank0: only rank 0's experts
    (the other ranks receive no routed pair); hot: expert 0 in every token, the rest from the first 2k; padding: uniform
    with every third token a padding row (ids -1)."""
    g = torch.Generator().manual_seed(seed)
    epr = num_experts // world
    ids = torch.empty(m, topk, dtype=torch.int64)
    for t in range(m):
        if kind == "rank0":
            ids[t] = torch.randperm(epr, generator=g)[:topk]
        elif kind == "hot":
            ids[t, 0] = 0
            ids[t, 1:] = torch.randperm(min(2 * topk, num_experts - 1), generator=g)[:topk - 1] + 1
        else:
            ids[t] = torch.randperm(num_experts, generator=g)[:topk]
    if kind == "padding":
        ids[::3] = -1
    w = torch.rand(m, topk, generator=g) + 0.05
    return ids.to(torch.int32), (w / w.sum(-1, keepdim=True)).float()


def rank_inputs(m: int, rank: int, num_experts: int, topk: int, world: int, hidden: int, kind: str, seed: int,
                dev: torch.device) -> tuple[torch.Tensor, ...]:
    g = torch.Generator().manual_seed(seed * 131 + rank)
    h = (torch.randn(m, hidden, generator=g) * (1 + 3 * torch.rand(1, hidden, generator=g) ** 8)).to(BF16).to(dev)
    x8, xs = quant_act_per_token(h)
    ids, w = rank_routing(m, num_experts, topk, world, kind, seed * 7 + rank)
    return x8.contiguous(), xs.contiguous(), ids.to(dev), w.to(dev)


@dataclasses.dataclass(frozen=True)
class Case:
    tokens: tuple[int, ...]        # per rank
    num_experts: int = 32
    topk: int = 8
    hidden: int = 512
    inter: int = 128
    kind: str = "uniform"
    config: str = "bn64_s5_g512_w0_lf_p_t"
    seed: int = 1
    repeats: int = 3               # calls per check (the epoch advances; each call must give the same bits)
    mode: str = "A"                # combine mode (kernel.SymLayout)
    graph_replays: int = 0         # > 0: capture one call in a CUDA graph and replay it with new inputs


def _split_k(cfg: M.MegaMoEConfig) -> bool:
    return cfg.block_n <= M.SPLIT_MAX_BN and cfg.split_waves > 0


def _compare(got: torch.Tensor, want: torch.Tensor, exact: bool) -> dict[str, Any]:
    if got.shape != want.shape:
        return {"ok": False, "why": f"shape {list(got.shape)} vs {list(want.shape)}"}
    if got.numel() == 0:
        return {"ok": True, "rows": 0}
    same = torch.equal(got.view(torch.int16), want.view(torch.int16))
    d = (got.double() - want.double()).norm().item()
    n = want.double().norm().item()
    rel = d / n if n else (0.0 if d == 0 else float("inf"))
    nonfinite = int((~torch.isfinite(got.float())).sum())
    ok = same if exact else (rel < 2e-2 and nonfinite == 0)
    return {"ok": bool(ok), "bitwise": bool(same), "rel_err": rel, "nonfinite": nonfinite,
            "mismatch_rows": int((got.view(torch.int16) != want.view(torch.int16)).any(dim=1).sum())}


def check_simulated(case: Case, dev: Any = None) -> dict[str, Any]:
    """All ranks of `case` on one GPU; returns {"ok", "ranks": [...], ...}."""
    dev = torch.device("cuda", torch.cuda.current_device()) if dev is None else torch.device(dev)
    world = len(case.tokens)
    cfg = M.MegaMoEConfig.from_name(case.config)
    raw = global_weights(case.num_experts, case.hidden, case.inter, case.seed, dev)
    full = M.prepare_weights(*raw, num_shared=1)
    inputs = [rank_inputs(m, r, case.num_experts, case.topk, world, case.hidden, case.kind, case.seed, dev)
              for r, m in enumerate(case.tokens)]
    want = _single_gpu(inputs, full, cfg)
    lay = K.SymLayout.for_group(max(1, max(case.tokens)), case.hidden, case.inter, case.topk, 1, world,
                                case.num_experts, case.mode)
    bufs = K.EPBuffers.simulated(lay, world, dev)
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    ranks = [K.EPMegaMoE(K.local_weight_stack(*raw, r, world), bufs[r], num_experts=case.num_experts, topk=case.topk,
                         config=cfg, grid=K.simulated_grid(world, sms)) for r in range(world)]
    exact = not _split_k(cfg)
    report: dict[str, Any] = {"case": dataclasses.asdict(case), "exact": exact, "calls": []}
    streams = [torch.cuda.Stream(dev) for _ in range(world)]
    for i in range(case.repeats):
        outs = K.simulate(ranks, inputs, streams)
        report["calls"].append([_compare(o, w, exact) for o, w in zip(outs, want)])
    report["ctrl"] = [r.ctrl() for r in ranks]
    report["epoch"] = [r.epoch() for r in ranks]
    if case.graph_replays:
        report["graph"] = _graph_check(ranks, inputs, full, cfg, case, streams, exact, dev)
    report["ok"] = all(c["ok"] for call in report["calls"] for c in call) and all(
        g["ok"] for g in report.get("graph", []))
    return report


def _single_gpu(inputs: Sequence[Sequence[torch.Tensor]], full: M.MegaMoEWeights, cfg: M.MegaMoEConfig) -> list[torch.Tensor]:
    cat = [torch.cat([inp[i] for inp in inputs]) for i in range(4)]
    out = M.mega_moe(*cat, full, config=dataclasses.replace(cfg, end_combine=True)) if cat[0].shape[0] else cat[0].new_empty(
        0, full.hidden, dtype=BF16)
    torch.cuda.synchronize()
    return list(torch.split(out, [int(inp[0].shape[0]) for inp in inputs]))


def _graph_check(ranks, inputs, full, cfg, case, streams, exact, dev) -> list[dict[str, Any]]:
    """Capture one call per rank (each on its own stream, one graph per rank), then replay all ranks' graphs
    concurrently with fresh inputs copied into the captured input tensors."""
    world = len(ranks)
    static = [[t.clone() for t in inp] for inp in inputs]
    graphs, outs = [], []
    for r in range(world):  # capture needs no concurrency: nothing runs during capture
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(streams[r]):
            with torch.cuda.graph(g, stream=streams[r]):
                outs.append(ranks[r](*static[r]))
        graphs.append(g)
    res = []
    for i in range(case.graph_replays):
        new = [rank_inputs(int(inp[0].shape[0]), r, case.num_experts, case.topk, world, case.hidden,
                           "uniform" if i % 2 else case.kind, case.seed + 100 + i, dev) for r, inp in enumerate(inputs)]
        for s, n in zip(static, new):
            for a, b in zip(s, n):
                a.copy_(b)
        torch.cuda.synchronize(dev)
        for r in range(world):
            with torch.cuda.stream(streams[r]):
                graphs[r].replay()
        torch.cuda.synchronize(dev)
        want = _single_gpu(new, full, cfg)
        res.append({"replay": i, "ok": all(_compare(o, w, exact)["ok"] for o, w in zip(outs, want))})
    return res


def check_rank(rank: int, world: int, case: Case) -> dict[str, Any]:
    """One rank of a real multi-GPU group (call through launch.run_ranks(check_rank, world, (case,), backend="nccl")):
    every rank builds the same global weights and inputs, runs the EP kernel on its tokens through torch symmetric
    memory, and compares with the single-GPU kernel on the gathered batch (run on its own GPU)."""
    dev = torch.device("cuda", torch.cuda.current_device())
    cfg = M.MegaMoEConfig.from_name(case.config)
    raw = global_weights(case.num_experts, case.hidden, case.inter, case.seed, dev)
    inputs = [rank_inputs(m, r, case.num_experts, case.topk, world, case.hidden, case.kind, case.seed, dev)
              for r, m in enumerate(case.tokens)]
    full = M.prepare_weights(*raw, num_shared=1)
    want = _single_gpu(inputs, full, cfg)[rank]
    del full
    lay = K.SymLayout.for_group(max(1, max(case.tokens)), case.hidden, case.inter, case.topk, 1, world,
                                case.num_experts, case.mode)
    bufs = K.EPBuffers.symmetric(lay)
    moe = K.EPMegaMoE(K.local_weight_stack(*raw, rank, world), bufs, num_experts=case.num_experts, topk=case.topk,
                      config=cfg)
    exact = not _split_k(cfg)
    calls = []
    bad = 0
    for i in range(case.repeats):
        out = moe(*inputs[rank])
        torch.cuda.synchronize(dev)
        c = _compare(out, want, exact)
        bad += not c["ok"]
        if i < 8 or not c["ok"]:  # keep the report short on stress runs
            calls.append(c)
    import torch.distributed as dist
    dist.barrier()
    graph = []
    if case.graph_replays:
        # one captured call, replayed with new inputs copied into the captured input tensors; every rank regenerates
        # every rank's new inputs (seeded) for its single-GPU reference
        static = [t.clone() for t in inputs[rank]]
        s = torch.cuda.Stream(dev)
        s.wait_stream(torch.cuda.current_stream(dev))
        g = torch.cuda.CUDAGraph()
        with torch.cuda.stream(s):
            with torch.cuda.graph(g, stream=s):
                gout = moe(*static)
        torch.cuda.synchronize(dev)
        dist.barrier()
        full = M.prepare_weights(*raw, num_shared=1)
        for i in range(case.graph_replays):
            new = [rank_inputs(m, r, case.num_experts, case.topk, world, case.hidden,
                               "uniform" if i % 2 else case.kind, case.seed + 100 + i, dev)
                   for r, m in enumerate(case.tokens)]
            w_i = _single_gpu(new, full, cfg)[rank]
            for a, b in zip(static, new[rank]):
                a.copy_(b)
            torch.cuda.synchronize(dev)
            dist.barrier()
            g.replay()
            torch.cuda.synchronize(dev)
            graph.append({"replay": i, **_compare(gout, w_i, exact)})
        dist.barrier()
        del full
    return {"rank": rank, "ok": bad == 0 and all(x["ok"] for x in graph), "bad_calls": bad, "calls": calls,
            "graph": graph, "ctrl": moe.ctrl(), "epoch": moe.epoch(), "case": dataclasses.asdict(case), "exact": exact}
