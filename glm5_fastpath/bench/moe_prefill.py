"""`glm5-fastpath bench moe-prefill`: the MoE of one prefill chunk, SGLang's Triton fused MoE against MegaMoE.

Why: SGLang 0.5.14 / 0.5.23 on Hopper at TP1 run every FP8 block-quantised MoE layer on the Triton fused MoE
(`moe_runner_backend` auto -> triton when no DeepEP-style a2a backend is on; quantization/fp8.py create_moe_runner).
Decode steps take MegaMoE through the plugin; this measures whether prefill chunks (hundreds to thousands of tokens,
where nearly all 256 experts are touched and the layer streams ~9.7 GB of expert weights) should too.

Per token count M (GLM-5: H 6144, I 2048, 256 routed experts top-8 + the fused shared expert, block FP8):
- stock:  sglang's `fused_experts` (moe_runner/triton_utils/fused_moe.py) with the 9-column top-k SGLang builds when the
          shared expert is fused (column 9 = expert 256, weight 1 / routed_scaling_factor) and routed_scaling_factor in
          its sum-reduce, bf16 h in (it quantises per 1x128 group itself): what the stock prefill runs;
- ours:   ops.act_quant_fp8 + moe.mega_moe with the shared expert fused (expert 256), MegaMoE's default config for
          M: what the plugin's MoE route runs (moe_executor._experts); above MegaMoE's MAX_TOKENS (4096) launches of
          4096 tokens concatenated, as the route splits such passes.
Both get the same h, routing ids and weights. Routing: uniform random top-8 of 256 (seeded). Times: CUDA-graph
replay median per call (bench.timing.time_launches; eager CUDA events if capture fails, labelled). Floor: the weight
bytes of the distinct experts touched (+ the shared expert) at the copy bandwidth measured in the same run.
Correctness, same run: rel_err(ours, stock) (FP8 noise: both quantise h per 1x128 and the FC2 input per 1x128).
Output: OUT/moe_prefill.json, OUT/moe_prefill.md.
"""
from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any, Callable

DEFAULT_TOKENS = (128, 256, 512, 1024, 2048, 4096, 8192)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for moe_prefill.json / moe_prefill.md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts")
    p.add_argument("--launches", type=int, default=4, help="calls per captured graph")
    p.add_argument("--replays", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)


def parse_tokens(s: str) -> list[int]:
    out = [int(x) for x in s.split(",") if x.strip()]
    if not out or any(m < 1 for m in out):
        raise SystemExit(f"--tokens: need positive integers, got {s!r}")
    return out


def sglang_triton_moe(num_experts: int, hidden: int, inter: int, topk: int, rsf: float) -> Callable:
    """fn(h, w13, s13, w2, s2, ids9, w9) -> out through SGLang's Triton fused MoE (raises ImportError without it)."""
    from sglang.srt.layers.moe.moe_runner.base import MoeRunnerConfig
    from sglang.srt.layers.moe.moe_runner.triton_utils.fused_moe import fused_experts
    from sglang.srt.layers.moe.topk import StandardTopKOutput

    _ensure_server_args()

    cfg = MoeRunnerConfig(num_experts=num_experts, num_local_experts=num_experts, hidden_size=hidden,
                          intermediate_size_per_partition=inter, top_k=topk, num_fused_shared_experts=1,
                          activation="silu", is_gated=True, inplace=False, routed_scaling_factor=rsf)

    def run(h, w13, s13, w2, s2, ids9, w9):
        return fused_experts(h, w13, w2, StandardTopKOutput(w9, ids9, None), cfg, use_fp8_w8a8=True,
                             w1_scale=s13, w2_scale=s2, block_shape=[128, 128])

    return run


def _ensure_server_args() -> None:
    """The Triton MoE reads a few switches from SGLang's global server args (deterministic inference, fused
    sum-all-reduce), which only a running server sets. Outside one: an object answering every field with its
    ServerArgs default (a real ServerArgs would need a model path and runs the server's post-init checks)."""
    import dataclasses

    from sglang.srt import server_args as SA

    try:
        SA.get_global_server_args()
        return
    except ValueError:
        pass
    defaults = {f.name: f.default for f in dataclasses.fields(SA.ServerArgs) if f.default is not dataclasses.MISSING}

    class _Defaults:
        def __getattr__(self, name):
            return defaults.get(name)

    setter = getattr(SA, "set_global_server_args_for_scheduler", None)
    if setter is None:
        raise RuntimeError("this sglang has no set_global_server_args_for_scheduler")
    setter(_Defaults())


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..moe import megamoe as MM
    from ..ops.act_quant import act_quant_fp8
    from ..testing.numerics import rel_err
    from . import moe as BM
    from .meta import git_commit, utc_now
    from .timing import measure_copy_bandwidth, time_launches

    tokens = parse_tokens(a.tokens)
    E, H, I, K, RSF = 256, BM.H, BM.I, BM.TOPK, BM.RSF
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(a.seed)
    bw = measure_copy_bandwidth(dev)
    print("[moe-prefill] generating 257 GLM-5 experts ...", flush=True)
    w13, s13, w2, s2 = BM.make_weights(E + 1, seed=E, dev=dev)
    wt = MM.prepare_weights(w13, s13, w2, s2, num_shared=1)  # views of the same tensors (no copy)
    stock, stock_note = None, ""
    try:
        stock = sglang_triton_moe(E + 1, H, I, K + 1, RSF)
        stock_note = "sglang fused_experts (Triton, fp8 w8a8, block 128x128), 257 experts, 9-column top-k"
    except Exception as e:  # noqa: BLE001 - reported; ours still runs
        stock_note = f"sglang Triton fused MoE unavailable: {type(e).__name__}: {str(e)[:300]}"
        print(f"[moe-prefill] {stock_note}", flush=True)
    rows = []
    for m in tokens:
        h = (torch.randn(m, H, device=dev, generator=g) * 0.5).to(torch.bfloat16)
        ids = torch.argsort(torch.rand(m, E, device=dev, generator=g), dim=1)[:, :K].to(torch.int32)
        wts = torch.rand(m, K, device=dev, generator=g) + 0.05
        wts = (wts / wts.sum(-1, keepdim=True)).float().contiguous()
        ids9 = torch.cat([ids, torch.full((m, 1), E, dtype=torch.int32, device=dev)], 1).contiguous()
        w9 = torch.cat([wts, torch.full((m, 1), 1.0 / RSF, device=dev)], 1).contiguous()
        touched = int(torch.unique(ids).numel()) + 1
        floor = touched * BM.EXPERT_BYTES / bw["bytes_per_s"] * 1e6
        row: dict[str, Any] = {"M": m, "experts_touched": touched, "floor_us": floor}
        outs: dict[str, Any] = {}
        # what the route runs: one launch up to MAX_TOKENS, above it launches of MAX_TOKENS (moe_executor)
        step = min(m, MM.MAX_TOKENS)
        cfg = MM.default_config(step, E, K, 1, MM._sms(dev))
        row["config"] = cfg.name if m <= MM.MAX_TOKENS else f"{-(-m // step)} x {cfg.name}"
        try:
            MM.precompile(wt, K, max_tokens=step, device=dev, configs=[cfg])

            def ours(i, cfg=cfg, step=step):
                x8, xs = act_quant_fp8(h)
                if m <= step:
                    return MM.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=RSF, config=cfg)
                return torch.cat([MM.mega_moe(x8[s:s + step], xs[s:s + step], ids[s:s + step], wts[s:s + step], wt,
                                              routed_scaling_factor=RSF, config=cfg) for s in range(0, m, step)])

            t = time_launches(ours, a.launches, device=dev, replays=a.replays)
            row["ours"] = {"median_us": t.median_us, "min_us": t.min_us, "method": t.method, "note": t.note,
                           "x_floor": t.median_us / floor}
            outs["ours"] = ours(0)
        except Exception as e:  # noqa: BLE001 - recorded, the other column still runs
            row["ours"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            traceback.print_exc()
        if stock is not None:
            try:
                t = time_launches(lambda i: stock(h, w13, s13, w2, s2, ids9, w9), a.launches, device=dev,
                                  replays=a.replays)
                row["stock"] = {"median_us": t.median_us, "min_us": t.min_us, "method": t.method, "note": t.note,
                                "x_floor": t.median_us / floor}
                outs["stock"] = stock(h, w13, s13, w2, s2, ids9, w9)
            except Exception as e:  # noqa: BLE001
                row["stock"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
                traceback.print_exc()
        if "ours" in outs and "stock" in outs:
            torch.cuda.synchronize(dev)
            row["rel_err_ours_vs_stock"] = rel_err(outs["ours"].float(), outs["stock"].float())
            row["speedup"] = row["stock"]["median_us"] / row["ours"]["median_us"]
        print(f"[moe-prefill] M={m}: " + json.dumps({k: v for k, v in row.items() if k != "M"}, default=str),
              flush=True)
        rows.append(row)
        del outs
        torch.cuda.empty_cache()
    return {"bench": "moe-prefill", "gpu": torch.cuda.get_device_name(dev), "date_utc": utc_now(),
            "commit": git_commit(), "copy_bandwidth": bw, "stock": stock_note, "rows": rows,
            "dims": {"H": H, "I": I, "experts": E, "topk": K, "shared": 1, "rsf": RSF}}


def markdown(res: dict[str, Any]) -> str:
    bw = res["copy_bandwidth"]["bytes_per_s"] / 1e12
    lines = [f"# MoE of one prefill chunk: SGLang's Triton fused MoE vs MegaMoE ({res['gpu']}, {res['date_utc']}, "
             f"commit {res['commit']})", "",
             f"GLM-5 dims, 256 routed experts top-8 + the fused shared expert, uniform random routing. Floor: distinct "
             f"experts touched x 37.75 MB at the measured copy bandwidth ({bw:.2f} TB/s). Stock: {res['stock']}.", "",
             "| M | experts touched | floor us | stock us | x floor | ours us | x floor | speedup | config | rel err |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|"]

    def cell(d, k, fmt):  # a failed column shows its error once, in its time cell
        if k in d:
            return fmt.format(d[k])
        return d.get("error", "-")[:60] if k == "median_us" else "-"

    for r in res["rows"]:
        s, o = r.get("stock", {}), r.get("ours", {})
        lines.append(f"| {r['M']} | {r['experts_touched']} | {r['floor_us']:.0f} | {cell(s, 'median_us', '{:.0f}')} | "
                     f"{cell(s, 'x_floor', '{:.2f}')} | {cell(o, 'median_us', '{:.0f}')} | {cell(o, 'x_floor', '{:.2f}')} | "
                     f"{r['speedup']:.2f}x | {r.get('config', '-')} | {r.get('rel_err_ours_vs_stock', float('nan')):.2e} |"
                     if "speedup" in r else
                     f"| {r['M']} | {r['experts_touched']} | {r['floor_us']:.0f} | {cell(s, 'median_us', '{:.0f}')} | "
                     f"{cell(s, 'x_floor', '{:.2f}')} | {cell(o, 'median_us', '{:.0f}')} | {cell(o, 'x_floor', '{:.2f}')} | "
                     f"- | {r.get('config', '-')} | - |")
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    res = run(a)
    (out / "moe_prefill.json").write_text(json.dumps(res, indent=2, default=str))
    (out / "moe_prefill.md").write_text(markdown(res))
    print(markdown(res))
    bad = [r["M"] for r in res["rows"] if "error" in r.get("ours", {})]
    return 1 if bad else 0
