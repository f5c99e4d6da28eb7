"""What a cold L2 (code and data) costs the step's short kernels (issue #9: the MoE front, session 37).

Per-op benchmarks replay an op back to back, so its code (and small data) stay in L2 and in the SM's instruction caches.
In the engine every layer streams ~340 MB of MoE weights (batch 1) between two launches of, say, the router: each launch
starts cold. This probe times each op twice in CUDA-graph replays: `hot` = N launches back to back; `cold` = each launch
right after a flush kernel that reads a buffer several times the L2 (its own time, measured alone, subtracted). cold - hot
is what the op loses to a cold L2 and cold instruction caches: code for latency-bound ops with little data (the MegaMoE
plan, the router's top-k epilogue), code and weights for the rest. (Session 38 measured it with and without a warm-up
build that ran the router's / plan's post-wait code dry before their PDL wait: the warm-up did not pay and was removed;
benchmarks/results/2026-12-03_h200_session38/.)

Ops (--ops): router (decode router, 1 token, GLM-5 gate), router8 (split-K router, 8 tokens), a0 (add + RMSNorm + 1x128
quant, 1 token), d2 (W_UK absorption + KV store, 1 token), moe (MegaMoE plan + persistent kernel, 1 token, 256 + 1
experts: ~16 GB of weights, built once; the slowest to set up).

usage: python3 benchmarks/cold_code.py [--ops router,router8,a0,d2,moe] [--launches 20] [--rounds 5] [--flush-mb 512]
       [--out DIR]      (default DIR: benchmarks/results/cold_code)
Writes cold_code.json / .md under DIR.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

OPS = ("router", "router8", "a0", "d2", "moe")


def parse_ops(spec: str) -> list[str]:
    ops = [o for o in spec.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad or not ops:
        raise SystemExit(f"--ops: a comma-separated subset of {','.join(OPS)}, got {spec!r}")
    return list(dict.fromkeys(ops))


def make_op(name: str, torch):
    """A zero-argument callable launching the op on fixed GLM-5-shaped inputs (built once), plus what it keeps."""
    from glm5_fastpath.config import Glm5Config
    from glm5_fastpath.weights import random_layer

    cfg = Glm5Config.preset("glm5")
    dev = torch.device("cuda")
    g = torch.Generator().manual_seed(0)
    if name in ("router", "router8"):
        from glm5_fastpath.ops.moe_router import moe_route

        mlp = random_layer(cfg, 3, 1, device="cuda").mlp
        m = 1 if name == "router" else 8
        h = (torch.randn(m, cfg.hidden_size, generator=g) * 0.5).to(torch.bfloat16).to(dev)
        gate, bias = mlp.gate.contiguous(), mlp.e_score_correction_bias.contiguous()
        return (lambda: moe_route(h, gate, bias, cfg, decode=(name == "router"))), (h, gate, bias)
    if name == "a0":
        from glm5_fastpath.ops.add_rmsnorm_quant import add_rmsnorm_quant

        x = torch.randn(1, cfg.hidden_size, generator=g).to(torch.bfloat16).to(dev)
        r = torch.randn(1, cfg.hidden_size, generator=g).to(torch.bfloat16).to(dev)
        w = torch.ones(cfg.hidden_size, dtype=torch.bfloat16, device=dev)
        return (lambda: add_rmsnorm_quant(x, r, w, cfg.rms_norm_eps)), (x, r, w)
    if name == "d2":
        import types

        from glm5_fastpath.ops.d2_absorb import d2_absorb_and_kv_store

        attn = random_layer(cfg, 3, 2, device="cuda").attn
        h, nope, r, kvl = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.qk_rope_head_dim, cfg.kv_lora_rank
        q = torch.randn(1, h, nope, generator=g).to(torch.bfloat16).to(dev)
        c = torch.randn(1, kvl, generator=g).to(torch.bfloat16).to(dev)
        k = torch.randn(1, r, generator=g).to(torch.bfloat16).to(dev)
        pos = torch.zeros(1, dtype=torch.int64, device=dev)
        loc = torch.zeros(1, dtype=torch.int64, device=dev)
        cache = torch.zeros(64, kvl + r, dtype=torch.bfloat16, device=dev)
        w = types.SimpleNamespace(w_kc=attn.w_kc)
        return (lambda: d2_absorb_and_kv_store(q, c, k, w, pos, loc, cache, cfg)), (q, c, k, pos, loc, cache, w)
    if name == "moe":
        from glm5_fastpath.moe import megamoe as M
        from glm5_fastpath.ref.fp8 import quant_act_per_token
        from glm5_fastpath.testing.moe_data import make_experts

        w13, s13, w2, s2 = make_experts(cfg.n_routed_experts + 1, cfg.hidden_size, cfg.moe_intermediate_size, 0,
                                        device="cuda")
        wt = M.prepare_weights(w13, s13, w2, s2, 1)
        x = torch.randn(1, cfg.hidden_size, generator=g).to(torch.bfloat16).to(dev)
        x8, xs = quant_act_per_token(x)
        ids = torch.randperm(cfg.n_routed_experts, generator=g)[:8].view(1, 8).to(torch.int32).to(dev)
        wts = torch.full((1, 8), 0.125, device=dev)
        return (lambda: M.mega_moe(x8, xs, ids, wts, wt)), (x8, xs, ids, wts, wt, w13, s13, w2, s2)
    raise ValueError(name)


def measure(name: str, launches: int, rounds: int, flush_mb: int, torch) -> dict:
    """hot / flush / flush + op, each timed by bench.timing.time_launches (one CUDA graph of `launches` launches,
    replayed `rounds` times, median per launch)."""
    from glm5_fastpath.bench.timing import time_launches

    op, keep = make_op(name, torch)
    buf = torch.empty(flush_mb * 2**20 // 4, dtype=torch.float32, device="cuda").uniform_()
    sink = torch.empty((), device="cuda")

    def flush():
        torch.sum(buf, dim=0, out=sink)  # reads the whole buffer: evicts code and data from L2

    def flushed():
        flush()
        return op()

    t = {k: time_launches(lambda i, f=f: f(), launches, device="cuda", replays=rounds)
         for k, f in (("hot", op), ("flush", flush), ("both", flushed))}
    del keep
    cold = t["both"].median_us - t["flush"].median_us
    return {"op": name, "hot_us": t["hot"].median_us, "flush_us": t["flush"].median_us, "cold_us": cold,
            "cold_minus_hot_us": cold - t["hot"].median_us, "method": t["both"].method}


def render(res: dict) -> str:
    lines = [f"# Cold L2 / code cost of short ops ({res['gpu']}, {res['date']}, commit {res['commit']})", "",
             f"{res['launches']} launches per graph, median of "
             f"{res['rounds']} replays; flush = a {res['flush_mb']} MB read before each cold launch, its own time "
             "subtracted (benchmarks/cold_code.py).", "",
             "| op | hot us | cold us | cold - hot us | flush us |", "|---|---:|---:|---:|---:|"]
    for r in res["rows"]:
        lines.append(f"| {r['op']} | {r['hot_us']:.2f} | {r['cold_us']:.2f} | {r['cold_minus_hot_us']:.2f} | "
                     f"{r['flush_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--ops", default="router,router8,a0,d2")
    ap.add_argument("--launches", type=int, default=20)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--flush-mb", type=int, default=512)
    ap.add_argument("--out", default="benchmarks/results/cold_code")
    a = ap.parse_args(argv)
    ops = parse_ops(a.ops)
    if a.launches < 1 or a.rounds < 1 or a.flush_mb < 64:
        raise SystemExit("--launches / --rounds: at least 1; --flush-mb: at least 64 (several times the 50 MB L2)")
    import torch

    if not torch.cuda.is_available():
        print("cold_code: needs a CUDA GPU", file=sys.stderr)
        return 2
    rows = []
    for name in ops:
        r = measure(name, a.launches, a.rounds, a.flush_mb, torch)
        rows.append(r)
        print(f"{name:8s} hot {r['hot_us']:7.2f} us  cold {r['cold_us']:7.2f} us  (+{r['cold_minus_hot_us']:.2f})",
              flush=True)
    from glm5_fastpath.bench.meta import git_commit, utc_now

    res = {"gpu": torch.cuda.get_device_name(), "date": utc_now(), "commit": git_commit(),
           "launches": a.launches,
           "rounds": a.rounds, "flush_mb": a.flush_mb, "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "cold_code.json").write_text(json.dumps(res, indent=1) + "\n")
    (out / "cold_code.md").write_text(render(res))
    print(render(res))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
