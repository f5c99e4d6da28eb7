"""`glm5-fastpath bench router`: the MoE router at decode sizes, our two kernels vs the stock formulation.

Per token count M (GLM-5: H 6144, 256 experts, top-8):
- split:  ops.moe_route with the split-K kernel (decode=False), what the SGLang route runs from 3 tokens on;
- decode: ops.moe_route with the decode kernel (decode=True; M <= 32 only), the route's choice at 1-2 tokens;
- stock:  what SGLang computes for the noaux_tc top-k without our router: F.linear in bf16 (cuBLAS), then
          sglang's biased_grouped_topk when it imports, else ref.moe.route (the report names which).
Times: CUDA-graph replay median per launch, each launch on its own h (rotated), so the gate (3.1 MB) is the
only repeated read (it stays in L2, as it does between layers in a real step). Floor: the gate bytes + h +
the outputs at the copy bandwidth measured in the same run (an L2-resident gate can beat it).
Correctness, same run: each path's top-k ids against ref.moe.route (fraction shared with the reference's
ids, as sets per token; near-ties may differ) and our logits' max relative error.
--phases: also one launch of each of our kernels per M in the phase-mark build (ops.moe_router.phase_build: %globaltimer
per CTA at entry, past griddepcontrol.wait, part stored, won the last arrival, top-k done), summarised by
moe_router.phase_summary: where the router's microseconds go (standalone launches: no PDL predecessor to wait for).
--topk-rounds: also both kernels in the GLM5_ROUTER_TOPK_ROUNDS build (ops.moe_router.topk_rounds_build: the top-k
epilogue's round loop that the bitonic merge replaced), timed (and, with --phases, phase-marked) in the same run.
Output: OUT/router.json, OUT/router.md.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import math
from pathlib import Path
from typing import Any, Callable

DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for router.json / router.md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts")
    p.add_argument("--inputs", type=int, default=8, help="h tensors rotated over the launches")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--phases", action="store_true",
                   help="also one launch per kernel and M in the phase-mark build (where the time goes)")
    p.add_argument("--topk-rounds", action="store_true",
                   help="also the round-loop top-k build of both kernels (A/B against the default bitonic merge)")


def parse_tokens(s: str) -> list[int]:
    try:
        ts = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bench router: --tokens must be a comma list of integers, got {s!r}") from None
    if not ts or ts[0] < 1 or ts[-1] > 256:
        raise ValueError(f"bench router: --tokens must be in 1..256 (the router's maximum), got {s!r}")
    return ts


def floor_bytes(m: int, hidden: int = 6144, experts: int = 256, topk: int = 8) -> int:
    """gate (bf16) + h (bf16) + logits (fp32) + ids, weights, scaled (4 B each)."""
    return experts * hidden * 2 + m * hidden * 2 + m * experts * 4 + 3 * m * topk * 4


def id_agreement(ids, ref_ids) -> float:
    """Mean over tokens of |ids(t) & ref_ids(t)| / k: order-insensitive (SGLang's top-k does not sort)."""
    a, b = ids.cpu().long().tolist(), ref_ids.cpu().long().tolist()
    if not a:
        return 1.0
    return sum(len(set(x) & set(y)) / len(y) for x, y in zip(a, b)) / len(a)


def _stock(cfg) -> tuple[Callable, str]:
    import torch.nn.functional as F

    try:
        from sglang.srt.layers.moe.topk import biased_grouped_topk_gpu as topk_fn

        def stock(h, gate, bias):
            logits = F.linear(h, gate)
            w, ids = topk_fn(h, logits, bias, cfg.num_experts_per_tok, True, 1, 1)
            return ids, w

        return stock, "F.linear (bf16) + sglang biased_grouped_topk_gpu"
    except Exception as e:  # noqa: BLE001 - no sglang here: the reference's math in PyTorch
        from ..ref.moe import route

        def stock(h, gate, bias):
            ids, w, _ = route(h, gate, bias, cfg)
            return ids, w

        return stock, f"ref.moe.route in PyTorch (sglang's GPU top-k not importable: {type(e).__name__})"


def _in_rounds_build(R, fn: Callable, h):
    with R.topk_rounds_build():
        return fn(h)


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..config import Glm5Config
    from ..ops import moe_router as R
    from ..ref.moe import route as ref_route
    from .meta import git_commit, utc_now
    from .timing import measure_copy_bandwidth, time_launches

    tokens = parse_tokens(a.tokens)
    cfg = Glm5Config.preset("glm5")
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(a.seed)
    gate = (torch.randn(cfg.n_routed_experts, cfg.hidden_size, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.randn(cfg.n_routed_experts, device=dev, generator=g) * 0.01
    bw = measure_copy_bandwidth(dev)
    stock, stock_name = _stock(cfg)
    R.precompile(dev, ((cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok),))
    rows = []
    for m in tokens:
        hs = [torch.randn(m, cfg.hidden_size, device=dev, generator=g).to(torch.bfloat16) for _ in range(a.inputs)]
        ref_ids, _, ref_logits = ref_route(hs[0], gate, bias, cfg)
        row: dict[str, Any] = {"M": m, "floor_bytes": floor_bytes(m)}
        row["floor_us"] = row["floor_bytes"] / bw["bytes_per_s"] * 1e6 if bw.get("bytes_per_s") else None
        paths: dict[str, Callable] = {"split": lambda h: R.moe_route(h, gate, bias, cfg, decode=False)}
        if m <= R.DECODE_MAX_TOKENS:
            paths["decode"] = lambda h: R.moe_route(h, gate, bias, cfg, decode=True)
        if getattr(a, "topk_rounds", False):
            for name in list(paths):
                paths[f"{name}_rounds"] = lambda h, fn=paths[name]: _in_rounds_build(R, fn, h)
        paths["stock"] = lambda h: stock(h, gate, bias)
        for name, fn in paths.items():
            try:
                out = fn(hs[0])
                row[f"{name}_ids_agree"] = id_agreement(out[0], ref_ids)
                if name != "stock":
                    err = (out[2].double() - ref_logits.double()).abs().max() / ref_logits.double().abs().max()
                    row[f"{name}_logits_rel_err"] = float(err)
                tm = time_launches(lambda i, fn=fn: fn(hs[i % len(hs)]), len(hs), device=dev, replays=a.replays)
                row[f"{name}_us"] = tm.median_us
            except Exception as e:  # noqa: BLE001 - one failing path must not lose the others
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        if row.get("split_us") and row.get("decode_us"):
            row["split_over_decode"] = row["split_us"] / row["decode_us"]
        if getattr(a, "phases", False):
            rcfg = R.config_for(cfg.hidden_size, cfg.n_routed_experts, cfg.num_experts_per_tok)
            kernels = [("split", False, R.FUNCTION, rcfg.splits * rcfg.groups * -(-m // R.TOK_TILE))]
            if m <= R.DECODE_MAX_TOKENS:
                kernels.append(("decode", True, R.FUNCTION_DECODE,
                                rcfg.decode_ctas * -(-m // R.decode_tokens_per_cta(m))))
            if getattr(a, "topk_rounds", False):
                kernels += [(f"{k[0]}_rounds", *k[1:]) for k in kernels]
            for name, decode, function, ctas in kernels:
                try:
                    # the marks live in the build that ran: reset and read them inside the same context
                    with R.phase_build(), (R.topk_rounds_build() if name.endswith("_rounds")
                                           else contextlib.nullcontext()):
                        for _ in range(2):  # the second launch is read: the first loads the cubin's code
                            R.reset_phases(rcfg, dev, function)
                            R.moe_route(hs[0], gate, bias, cfg, decode=decode)
                        row[f"{name}_phases"] = R.phase_summary(R.read_phases(rcfg, ctas, dev, function))
                except Exception as e:  # noqa: BLE001 - a diagnostic must not lose the timed rows
                    row[f"{name}_phases_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        rows.append(row)
        print(f"[router] M={m}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                              for k, v in row.items() if k != "M"), flush=True)
    return {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "stock": stock_name,
            "copy_bandwidth": bw, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 2) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    lines = [f"# MoE router: split-K vs decode kernel vs stock ({res.get('gpu')}, {res.get('date')}, "
             f"commit {res.get('commit')})", "", f"Stock: {res.get('stock')}. GLM-5 dims (H 6144, 256 experts, "
             "top-8); CUDA-graph replay median per launch; ids agree = fraction of (token, slot) ids equal to "
             "ref.moe.route's per token (as sets).", "",
             "| M | floor us | split us | decode us | stock us | split/decode | ids agree split / decode / stock |",
             "|---:|---:|---:|---:|---:|---:|---|"]
    for r in res.get("rows", []):
        lines.append(f"| {r['M']} | {f(r.get('floor_us'))} | {f(r.get('split_us'))} | {f(r.get('decode_us'))} | "
                     f"{f(r.get('stock_us'))} | {f(r.get('split_over_decode'))} | {f(r.get('split_ids_agree'), 3)} / "
                     f"{f(r.get('decode_ids_agree'), 3)} / {f(r.get('stock_ids_agree'), 3)} |")
    if any(r.get("split_rounds_us") or r.get("decode_rounds_us") for r in res.get("rows", [])):
        lines += ["", "Top-k epilogue A/B, same run: the default build (bitonic merge) against the round-loop build "
                  "(GLM5_ROUTER_TOPK_ROUNDS); ids agree as above.", "",
                  "| M | split us | split rounds us | decode us | decode rounds us | ids agree split / decode rounds |",
                  "|---:|---:|---:|---:|---:|---|"]
        for r in res.get("rows", []):
            lines.append(f"| {r['M']} | {f(r.get('split_us'))} | {f(r.get('split_rounds_us'))} | "
                         f"{f(r.get('decode_us'))} | {f(r.get('decode_rounds_us'))} | "
                         f"{f(r.get('split_rounds_ids_agree'), 3)} / {f(r.get('decode_rounds_ids_agree'), 3)} |")
    ph = [(r["M"], name, r[f"{name}_phases"]) for r in res.get("rows", [])
          for name in ("split", "decode", "split_rounds", "decode_rounds")
          if isinstance(r.get(f"{name}_phases"), dict) and r[f"{name}_phases"].get("ctas")]
    if ph:
        lines += ["", "Phase marks (one standalone launch each, the phase-mark build; us from the first CTA's entry): "
                  "last entry = launch spread; own work = median per CTA from past the wait to its part stored; "
                  "last part = the last CTA's part stored (the last arrival); top-k = the winner's epilogue; top-k loads = its "
                  "part until the logits and bias have landed (keys built).", "",
                  "| M | kernel | CTAs | SMs | last entry | wait released (median / last) | own work median | "
                  "last part | level-1 done (last) | top-k start | top-k us | top-k loads us | end |",
                  "|---:|---|---:|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|"]
        for m, name, d in ph:
            lines.append(f"| {m} | {name} | {d['ctas']} | {d['sms']} | {f(d.get('last_entry_us'))} | "
                         f"{f(d.get('wait_released_median_us'))} / {f(d.get('wait_released_last_us'))} | "
                         f"{f(d.get('own_work_median_us'))} | {f(d.get('last_part_stored_us'))} | "
                         f"{f(d.get('level1_done_last_us'))} | {f(d.get('topk_start_us'))} | {f(d.get('topk_us'))} | "
                         f"{f(d.get('topk_loads_us'))} | {f(d.get('topk_end_us'))} |")
    errs = [f"- M={r['M']} {k}: {v}" for r in res.get("rows", []) for k, v in r.items() if k.endswith("_error")]
    if errs:
        lines += ["", "Errors:", *errs]
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    try:
        parse_tokens(a.tokens)
    except ValueError as e:
        print(e)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench router: needs a CUDA GPU (Hopper)")
        return 2
    res = run(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "router.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "router.md").write_text(markdown(res))
    print(markdown(res))
    return 0
