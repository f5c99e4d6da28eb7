"""`glm5-fastpath bench moe-layer`: one decode MoE layer from its input h, the kernel chains side by side.

Per token count M (GLM-5: H 6144, 256 routed experts top-8 + the shared expert, I 2048):
- fused:    moe.routed.routed_mega_moe: the router (+ FP8 quant of h) whose last CTA plans MegaMoE, then
            MegaMoE (2 kernels); the SGLang route's opt-in (GLM5_FASTPATH_MOE_FUSED_ROUTER=1);
- separate: ops.moe_route -> ops.act_quant_fp8 -> moe.mega_moe (router, quant, plan, MegaMoE: 4 kernels), the
            route's default chain;
- router_quant: ops.moe_route_quant (router + FP8 quant in one kernel) -> moe.mega_moe (3 kernels); the route's
            GLM5_FASTPATH_ROUTER_QUANT=1;
- overlap:  moe.overlap.routed_mega_moe_overlap after ops.act_quant_fp8: the shared expert's MegaMoE launch runs on
            part of the GPU while the router and the routed pairs' plan run on a side stream, then the routed MegaMoE
            launch (whose combine adds the shared slot values); one column per --overlap-grids value (the shared
            launch's CTAs; `default` = moe.overlap.default_shared_grid);
- stock:    SGLang's router (F.linear bf16 + biased_grouped_topk_gpu; PyTorch's formulation of the same math
            when sglang does not import, labelled), SGLang's per-token-group FP8 quant (ours when absent,
            labelled), then DeepGEMM fp8_mega_moe on the routed experts (the shared expert left out, which
            favours stock) with its symmetric-buffer input copies: what SGLang's megamoe backend runs; the
            report says which parts were available.
Every launch takes its own h (rotated over --inputs tensors, so routing and experts differ per launch); the
expert weights touched (>= 9 x 37.75 MB) stream from HBM in every replay. Times: CUDA-graph replay median per
layer (glm5_fastpath.bench.timing.time_launches). Floor: the weight bytes of the distinct experts the launch
touches (+ the shared expert for ours) and the router gate, at the copy bandwidth measured in the same run.
Correctness, same run: fused, separate and router_quant outputs bitwise equal (ids, weights, out); overlap equal bit
for bit to separate with the decode router (the one it routes with).
Output: OUT/moe_layer.json, OUT/moe_layer.md.
"""
from __future__ import annotations

import argparse
import json
import math
import traceback
from pathlib import Path
from typing import Any, Callable

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for moe_layer.json / moe_layer.md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts (1..32)")
    p.add_argument("--inputs", type=int, default=8, help="h tensors rotated over the launches of one graph")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--rounds", type=int, default=2, help="fused / separate / stock timed in turn this many times")
    p.add_argument("--no-stock", action="store_true", help="skip the stock chain (no sglang / deep_gemm needed)")
    p.add_argument("--overlap-grids", default="default",
                   help="comma list of shared-launch CTA counts for the overlap chains ('default' = "
                        "moe.overlap.default_shared_grid; 'none' = no overlap chain)")
    p.add_argument("--seed", type=int, default=0)


def parse_tokens(s: str) -> list[int]:
    try:
        ts = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bench moe-layer: --tokens must be a comma list of integers, got {s!r}") from None
    if not ts or ts[0] < 1 or ts[-1] > 32:
        raise ValueError(f"bench moe-layer: --tokens must be in 1..32 (the fused router's range), got {s!r}")
    return ts


def parse_overlap_grids(s: str, num_sms: int) -> list[int]:
    """--overlap-grids -> CTA counts of the shared launch ('default' -> moe.overlap.default_shared_grid)."""
    from ..moe.overlap import default_shared_grid

    if s.strip().lower() in ("", "none", "off"):
        return []
    out: list[int] = []
    for x in s.split(","):
        x = x.strip().lower()
        if not x:
            continue
        try:
            g = default_shared_grid(num_sms) if x == "default" else int(x)
        except ValueError:
            raise ValueError(f"bench moe-layer: --overlap-grids takes integers or 'default', got {s!r}") from None
        if not 1 <= g <= num_sms:
            raise ValueError(f"bench moe-layer: --overlap-grids value {g} is outside [1, {num_sms}] (the SM count)")
        if g not in out:
            out.append(g)
    return out


def _stock_quant() -> tuple[Callable, str]:
    try:
        from sglang.srt.layers.quantization.fp8_kernel import per_token_group_quant_fp8 as q

        return (lambda h: q(h, 128)), "sglang per_token_group_quant_fp8"
    except Exception as e:  # noqa: BLE001 - the sgl_kernel op it wraps, else ours; labelled
        why = type(e).__name__
    try:
        import torch
        from sgl_kernel import sgl_per_token_group_quant_8bit as q8

        fp8 = torch.float8_e4m3fn
        fmax = torch.finfo(fp8).max

        def quant(h):
            x8 = torch.empty(h.shape, dtype=fp8, device=h.device)
            xs = torch.empty(h.shape[0], h.shape[1] // 128, dtype=torch.float32, device=h.device)
            q8(h, x8, xs, 128, 1e-10, -fmax, fmax)
            return x8, xs

        return quant, f"sgl_kernel sgl_per_token_group_quant_8bit (what sglang's per_token_group_quant_fp8 calls; sglang: {why})"
    except Exception as e:  # noqa: BLE001 - ours, labelled
        from ..ops.act_quant import act_quant_fp8

        return (lambda h: tuple(act_quant_fp8(h))), f"ops.act_quant_fp8 (sglang / sgl_kernel quant not importable: {why}, {type(e).__name__})"


def _bitwise_equal(a: tuple, b: tuple) -> bool:
    """Two chains' (out, ids, weights) bit for bit (FP8 tensors compared as bytes)."""
    import torch

    return all(torch.equal(x.view(torch.uint8), y.view(torch.uint8)) if x.element_size() == 1 else torch.equal(x, y)
               for x, y in zip(a, b))


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..config import Glm5Config
    from ..moe import megamoe as MM
    from ..moe import overlap as OV
    from ..moe import routed
    from ..ops import moe_router as R
    from ..ops.act_quant import act_quant_fp8
    from . import moe as BM
    from .meta import git_commit, utc_now
    from .router import _stock as stock_router
    from .timing import measure_copy_bandwidth, time_launches

    tokens = parse_tokens(a.tokens)
    cfg = Glm5Config.preset("glm5")
    E, H, K = cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(a.seed)
    gate = (torch.randn(E, H, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(E, device=dev, generator=g) * 0.01
    bw = measure_copy_bandwidth(dev)
    print("[moe-layer] generating 257 GLM-5 experts ...", flush=True)
    raw = BM.make_weights(E + 1, seed=E, dev=dev)
    wt = MM.prepare_weights(*raw, num_shared=1)
    rc = R.config_for(H, E, K)
    notes: dict[str, str] = {}
    stock_parts: dict[str, Any] = {}
    if not a.no_stock:
        stock_parts["router"], notes["stock_router"] = stock_router(cfg)
        stock_parts["quant"], notes["stock_quant"] = _stock_quant()
        try:
            stock_parts["dg"] = BM.DeepGemmMegaMoE(E, max(tokens), tuple(t[:E] for t in raw), dev)
            notes["stock_experts"] = "deep_gemm.fp8_mega_moe (routed experts only) + its symmetric-buffer input copies"
        except Exception as e:  # noqa: BLE001 - reported; the stock column is then left out
            notes["stock_experts"] = f"deep_gemm fp8_mega_moe unavailable: {type(e).__name__}: {str(e)[:300]}"
    grids = parse_overlap_grids(getattr(a, "overlap_grids", "default"), MM._sms(dev))
    rows = []
    for m in tokens:
        mcfg = MM.default_config(m, E, K, 1, MM._sms(dev))
        MM.precompile(wt, K, max_tokens=m, device=dev, configs=[mcfg])
        routed.precompile(wt, rc, [mcfg], dev)
        overlap_ok = bool(grids) and OV.supported(m, rc, mcfg, 1)
        if overlap_ok:
            OV.precompile(wt, K, [mcfg], m, dev)
        hs = [(torch.randn(m, H, device=dev, generator=g) * 0.5).to(torch.bfloat16) for _ in range(a.inputs)]
        row: dict[str, Any] = {"M": m, "config": mcfg.name, "router": "decode" if R.use_decode(m, None, rc) else "split-K"}
        touched = [int(torch.unique(R.moe_route(h, gate, bias, cfg)[0]).numel()) for h in hs]
        row["experts_touched_mean"] = sum(touched) / len(touched)
        floor_bytes = (row["experts_touched_mean"] + 1) * BM.EXPERT_BYTES + E * H * 2
        row["floor_us"] = floor_bytes / bw["bytes_per_s"] * 1e6 if bw.get("bytes_per_s") else None

        def fused(h):
            return routed.routed_mega_moe(h, gate, bias, cfg, wt, config=mcfg)

        def separate(h):
            ids, w, _ = R.moe_route(h, gate, bias, cfg)
            x8, xs = act_quant_fp8(h)
            return MM.mega_moe(x8, xs, ids, w, wt, routed_scaling_factor=cfg.routed_scaling_factor, config=mcfg), ids, w

        def router_quant(h):  # GLM5_FASTPATH_ROUTER_QUANT=1: the router writes x8, then plan, MegaMoE (3 kernels)
            ids, w, _, x8, xs = R.moe_route_quant(h, gate, bias, cfg)
            return MM.mega_moe(x8, xs, ids, w, wt, routed_scaling_factor=cfg.routed_scaling_factor, config=mcfg), ids, w

        paths: dict[str, Callable] = {"fused": fused, "separate": separate, "router_quant": router_quant}
        for grid in grids if overlap_ok else []:
            def overlap(h, grid=grid):  # the shared expert during the routing (moe/overlap.py)
                x8, xs = act_quant_fp8(h)
                return OV.routed_mega_moe_overlap(h, x8, xs, gate, bias, cfg, wt, config=mcfg, shared_grid=grid)

            paths[f"overlap_g{grid}"] = overlap
        if "dg" in stock_parts:
            dg, srouter, squant = stock_parts["dg"], stock_parts["router"], stock_parts["quant"]
            y = torch.empty(m, H, dtype=torch.bfloat16, device=dev)

            def stock(h):
                ids, w = srouter(h, gate, bias)
                x8, xs = squant(h)
                dg.load(x8, xs, ids, w)
                return dg(y)

            paths["stock"] = stock
        try:  # correctness first: fused == separate == router_quant bitwise, every input
            # (row key fused_equals_separate kept for the committed JSON of earlier runs)
            same = True
            same_overlap = True
            for h in hs:
                s = separate(h)
                same &= _bitwise_equal(fused(h), s) and _bitwise_equal(router_quant(h), s)
                if overlap_ok:  # the overlap routes with the decode kernel: against separate with that router
                    ids, w, _ = R.moe_route(h, gate, bias, cfg, decode=True)
                    x8, xs = act_quant_fp8(h)
                    sd = (MM.mega_moe(x8, xs, ids, w, wt, routed_scaling_factor=cfg.routed_scaling_factor, config=mcfg),
                          ids, w)
                    for name in (n for n in paths if n.startswith("overlap_")):
                        same_overlap &= _bitwise_equal(paths[name](h), sd)
            torch.cuda.synchronize(dev)
            row["fused_equals_separate"] = bool(same)
            if overlap_ok:
                row["overlap_equals_separate"] = bool(same_overlap)
        except Exception as e:  # noqa: BLE001
            row["check_error"] = f"{type(e).__name__}: {str(e)[:300]}"
            traceback.print_exc()
        times: dict[str, list[float]] = {k: [] for k in paths}
        for _ in range(max(1, a.rounds)):
            for name, fn in paths.items():
                try:
                    t = time_launches(lambda i, fn=fn: fn(hs[i % len(hs)]), len(hs), device=dev, replays=a.replays)
                    times[name].append(t.median_us)
                except Exception as e:  # noqa: BLE001 - one failing path must not lose the others
                    row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    traceback.print_exc()
        for name, ts in times.items():
            if ts:
                row[f"{name}_us"] = sorted(ts)[len(ts) // 2]
                row[f"{name}_us_rounds"] = ts
        if row.get("router_quant_us") and row.get("separate_us"):
            row["separate_minus_router_quant_us"] = row["separate_us"] - row["router_quant_us"]
        if row.get("fused_us") and row.get("separate_us"):
            row["separate_minus_fused_us"] = row["separate_us"] - row["fused_us"]
        for name in (n for n in paths if n.startswith("overlap_")):
            if row.get(f"{name}_us") and row.get("separate_us"):
                row[f"separate_minus_{name}_us"] = row["separate_us"] - row[f"{name}_us"]
        if row.get("fused_us") and row.get("stock_us"):
            row["stock_over_fused"] = row["stock_us"] / row["fused_us"]
        if row.get("fused_us") and row.get("floor_us"):
            row["fused_over_floor"] = row["fused_us"] / row["floor_us"]
        rows.append(row)
        print(f"[moe-layer] M={m}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                 for k, v in row.items() if k != "M" and not k.endswith("rounds")),
              flush=True)
    return {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "notes": notes,
            "copy_bandwidth": bw, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 2) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    n = res.get("notes", {})
    lines = [f"# One decode MoE layer from h: fused router + plan vs separate kernels vs stock ({res.get('gpu')}, "
             f"{res.get('date')}, commit {res.get('commit')})", "",
             "GLM-5 dims (H 6144, 256 routed experts top-8 + shared, I 2048); CUDA-graph replay median per layer, each "
             "launch its own h (routing differs per launch); median over rounds. fused = router+quant+plan, MegaMoE (2 "
             "kernels); separate = router, act quant, plan, MegaMoE (4; the default); router_quant = router + quant, plan, "
             "MegaMoE (3; GLM5_FASTPATH_ROUTER_QUANT=1). Floor = (distinct experts + shared) x 37.75 MB "
             "+ the gate, at the measured copy bandwidth.", "",
             f"Stock: router {n.get('stock_router', '-')}; quant {n.get('stock_quant', '-')}; experts "
             f"{n.get('stock_experts', '-')}.", "",
             "| M | router | MegaMoE config | experts touched | floor us | fused us | separate us | router_quant us | "
             "separate - fused us | separate - router_quant us | stock us | stock / fused | fused / floor | "
             "fused == separate == router_quant |",
             "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in res.get("rows", []):
        lines.append(f"| {r['M']} | {r.get('router')} | {r.get('config')} | {f(r.get('experts_touched_mean'), 1)} | "
                     f"{f(r.get('floor_us'))} | {f(r.get('fused_us'))} | {f(r.get('separate_us'))} | "
                     f"{f(r.get('router_quant_us'))} | {f(r.get('separate_minus_fused_us'))} | "
                     f"{f(r.get('separate_minus_router_quant_us'))} | {f(r.get('stock_us'))} | {f(r.get('stock_over_fused'))} | "
                     f"{f(r.get('fused_over_floor'))} | {r.get('fused_equals_separate', r.get('check_error', '-'))} |")
    ov = sorted({k[:-3] for r in res.get("rows", []) for k in r if k.startswith("overlap_g") and k.endswith("_us")},
                key=lambda n: int(n[len("overlap_g"):]))
    if ov:
        lines += ["", "Shared expert during the routing (moe/overlap.py; overlap_gN = the shared launch on N CTAs):", "",
                  "| M | separate us | " + " | ".join(f"{n} us | separate - {n} us" for n in ov) + " | overlap == separate |",
                  "|---:|---:|" + "---:|---:|" * len(ov) + "---|"]
        for r in res.get("rows", []):
            lines.append(f"| {r['M']} | {f(r.get('separate_us'))} | "
                         + " | ".join(f"{f(r.get(n + '_us'))} | {f(r.get('separate_minus_' + n + '_us'))}" for n in ov)
                         + f" | {r.get('overlap_equals_separate', '-')} |")
    errs = [f"- M={r['M']} {k}: {v}" for r in res.get("rows", []) for k, v in r.items() if k.endswith("error")]
    if errs:
        lines += ["", "Errors:", *errs]
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    res = run(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "moe_layer.json").write_text(json.dumps(res, indent=1))
    (out / "moe_layer.md").write_text(markdown(res))
    print(markdown(res))
    bad = [r["M"] for r in res["rows"] if r.get("fused_equals_separate") is False]
    if bad:
        print(f"[moe-layer] fused != separate at M={bad}")
        return 1
    return 0
