"""`glm5-fastpath bench v-up`: MLA's V up-projection (W_UV) at decode sizes, ours (fused with o_proj's act quant)
against what SGLang runs, same run, against the bytes floor.

Per token count T (H = num_attention_heads, L = kv_lora_rank = 512, V = v_head_dim, GLM-5: 256):
- stock_bmm:   SGLang's call, `torch.bmm(o.transpose(0, 1), w_vc, out=y.view(T, H, V).transpose(0, 1))` (cuBLAS);
- stock_quant: the same bmm, then act_quant_fp8 of y (what o_proj's FP8-linear route then runs at <= 16 tokens);
- ours:        ops.mla_v_up_quant (one kernel: y and its 1x128 quant; the W_UV slice loaded before the PDL wait);
- ours_w8:     ops.mla_v_up_quant_w8, the same from SGLang's FP8 kv_b_proj rows + block scales (half the bytes);
- chain_stock / chain_ours (default on; --no-chain skips): the decode sequence around it, our sparse-MLA core
  (ops.sparse_mla_decode over 2048 random slots of a 65536-slot bf16 KV buffer, split + combine) -> W_UV (+ quant)
  -> o_proj on our skinny FP8 GEMM (the FP8-linear route's GEMM), all PDL-launched as in the engine, so the W_UV
  load during the combine and o_proj's weight prefetch are part of the time. chain_core: the sparse-MLA core alone
  (what the chains add beyond W_UV and o_proj).
Weights: a random e4m3 kv_b_proj [H * (N + V), L] with 128x128 block scales; w_vc is SGLang's bf16 dequantisation of
it (ops.mla_v_up.dequant_w_vc: [H, L, V], each head's [V, L] rows contiguous), so every path computes the same
products (ours_w8 must equal ours bitwise); o: random bf16
[T, H, L]; o_proj: random e4m3 [hidden, H * V] with fp32 block scales. The weights are rotated over copies so that
one pass exceeds 2x L2 (bench.timing.plan_rotation); o is small and L2-resident, as in a decode step.
Times: median per launch over CUDA-graph replays (bench.timing.time_launches).
Floor: W_UV bytes + o + y + y8 + ys at the copy bandwidth measured in the same run (for the chains, + o_proj's
weights, scales and output).
Correctness, same run: ours' y against the float64 bmm of the same bf16 inputs (relative L2, and the share of
elements that differ from the fp32-then-bf16 reference by more than one bf16 step), ours' y8 / ys against
act_quant of ours' y (bitwise), stock's y against the float64 bmm.
Output: OUT/v_up.json, OUT/v_up.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Callable

DEFAULT_TS = (1, 2, 4, 8, 16, 32, 64)
KV_SLOTS = 65536  # the chains' KV buffer (bf16 rows of 576)
TOPK = 2048
PRESETS = ("glm5", "glm5.2", "small")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for v_up.json / .md")
    p.add_argument("--ts", default=",".join(map(str, DEFAULT_TS)), help="comma list of token counts T (1..64)")
    p.add_argument("--preset", choices=PRESETS, default="glm5", help="model config preset (heads, hidden size)")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--no-chain", action="store_true", help="skip the chains with o_proj")
    p.add_argument("--seed", type=int, default=0)


def parse_ts(s: str) -> list[int]:
    from ..ops.mla_v_up import MAX_TOKENS

    try:
        ts = [int(x) for x in s.split(",") if x.strip()]
    except ValueError:
        raise ValueError(f"bench v-up: --ts must be comma-separated integers, got {s!r}") from None
    if not ts:
        raise ValueError("bench v-up: --ts is empty")
    bad = [t for t in ts if not 1 <= t <= MAX_TOKENS]
    if bad:
        raise ValueError(f"bench v-up: --ts values must be in 1..{MAX_TOKENS}, got {bad}")
    return sorted(dict.fromkeys(ts))


def validate(a: argparse.Namespace) -> list[int]:
    if a.replays < 1:
        raise ValueError("bench v-up: --replays must be >= 1")
    return parse_ts(a.ts)


def floor_bytes(t: int, h: int, l_dim: int = 512, v: int = 256) -> int:
    """W_UV (bf16) + o (bf16) + y (bf16) + y8 (e4m3) + ys (fp32, one per 128 columns)."""
    return h * l_dim * v * 2 + t * h * l_dim * 2 + t * h * v * (2 + 1) + t * h * (v // 128) * 4


def o_proj_bytes(t: int, hidden: int, k: int) -> int:
    """o_proj's e4m3 weight + fp32 128x128 block scales + bf16 output."""
    return hidden * k + (hidden // 128) * (k // 128) * 4 + t * hidden * 2


def _ulp_share(y, ref64) -> float:
    """Share of elements of bf16 y farther than one bf16 step (of the reference's magnitude) from ref64."""
    import torch

    r = ref64.abs().clamp_min(1e-30)
    step = torch.pow(2.0, torch.floor(torch.log2(r)) - 7)  # bf16 has 8 significant bits
    return float(((y.double() - ref64).abs() > step * 1.0001).double().mean())


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..config import Glm5Config
    from ..ops import act_quant, fp8_gemm, mla_v_up
    from ..ref.fp8 import quant_act_per_token
    from ..testing.numerics import rel_err
    from ..weights import Fp8Linear
    from .meta import git_commit, utc_now
    from .timing import l2_cache_bytes, measure_copy_bandwidth, plan_rotation, time_launches

    ts = validate(a)
    cfg = Glm5Config.preset(a.preset)
    h, l_dim, v, hidden = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.v_head_dim, cfg.hidden_size
    dev = torch.device("cuda", torch.cuda.current_device())
    bw = measure_copy_bandwidth(dev)
    l2 = l2_cache_bytes(dev)
    mla_v_up.precompile(dev)
    act_quant.precompile(dev)
    k_o = h * v
    chain = not a.no_chain
    if chain:
        fp8_gemm.precompile_plain([(hidden, k_o)], max_m=max(ts), device=dev)
    g = torch.Generator(device=dev).manual_seed(a.seed)
    nope = cfg.qk_nope_head_dim
    rows_kvb = h * (nope + v)
    kvb = (torch.randn(rows_kvb, l_dim, device=dev, generator=g) * 2).clamp(-448, 448).to(torch.float8_e4m3fn)
    kvb_s = torch.full((-(-rows_kvb // 128), l_dim // 128), l_dim ** -0.5 / 2, device=dev)
    w0 = mla_v_up.dequant_w_vc(kvb, kvb_s, h, nope)
    plan = plan_rotation(h * l_dim * v * 2, l2)
    ws = [w0] + [w0.transpose(1, 2).clone().transpose(1, 2) for _ in range(plan.sets - 1)]
    w8s = [(kvb, kvb_s)] + [(kvb.clone(), kvb_s.clone()) for _ in range(plan.sets - 1)]
    o_all = torch.randn(max(ts), h, l_dim, device=dev, generator=g).to(torch.bfloat16)
    op_copies: list[Fp8Linear] = []
    if chain:
        from ..ops import sparse_mla as SM

        kv = (torch.randn(KV_SLOTS, 1, l_dim + 64, device=dev, generator=g) * 0.5).to(torch.bfloat16)
        scale = float(cfg.softmax_scale)
        w8 = (torch.randn(hidden, k_o, device=dev, generator=g) * 0.5).to(torch.float8_e4m3fn)
        s8 = torch.rand(hidden // 128, k_o // 128, device=dev, generator=g) * 0.02 + 0.01
        cplan = plan_rotation(o_proj_bytes(1, hidden, k_o) + h * l_dim * v * 2, l2, max_sets=64)
        op_copies = [Fp8Linear(w8, s8)] + [Fp8Linear(w8.clone(), s8.clone()) for _ in range(cplan.sets - 1)]

    def stock_bmm(o, w):
        y = torch.empty(o.shape[0], h * v, dtype=torch.bfloat16, device=dev)
        torch.bmm(o.transpose(0, 1), w, out=y.view(-1, h, v).transpose(0, 1))
        return y

    def stock_quant(o, w):
        y = stock_bmm(o, w)
        return y, act_quant.act_quant_fp8(y)

    def ours(o, w):
        return mla_v_up.mla_v_up_quant(o, w)

    def ours_w8(o, w8):
        return mla_v_up.mla_v_up_quant_w8(o, w8[0], w8[1], nope)

    def core(q, idx):
        return SM.sparse_mla_decode(q, kv, idx, scale, l_dim)

    def chain_core(q, idx, w, lin):
        return core(q, idx)

    def chain_stock(q, idx, w, lin):
        y, (y8, ys) = stock_quant(core(q, idx), w)
        return fp8_gemm.fp8_gemm_skinny(y8, ys, lin)

    def chain_ours(q, idx, w, lin):
        r = mla_v_up.mla_v_up_quant(core(q, idx), w)
        return fp8_gemm.fp8_gemm_skinny(r.y8, r.ys, lin)

    def chain_ours_w8(q, idx, w8, lin):
        r = mla_v_up.mla_v_up_quant_w8(core(q, idx), w8[0], w8[1], nope)
        return fp8_gemm.fp8_gemm_skinny(r.y8, r.ys, lin)

    rows: list[dict[str, Any]] = []
    for t in ts:
        o = o_all[:t].contiguous()
        ref64 = torch.einsum("thl,hlv->thv", o.double(), w0.double()).reshape(t, h * v)
        row: dict[str, Any] = {"T": t, "H": h, "floor_bytes": floor_bytes(t, h, l_dim, v)}
        row["floor_us"] = row["floor_bytes"] / bw["bytes_per_s"] * 1e6
        r = ours(o, w0)
        q, s = quant_act_per_token(r.y)
        row["ours_y_rel_l2"] = rel_err(r.y, ref64)
        row["ours_y_over_1ulp"] = _ulp_share(r.y, ref64)
        row["ours_quant_bitwise"] = bool(torch.equal(q.view(torch.uint8), r.y8.view(torch.uint8)) and torch.equal(s, r.ys))
        row["stock_y_rel_l2"] = rel_err(stock_bmm(o, w0), ref64)
        try:
            r8 = ours_w8(o, w8s[0])
            row["ours_w8_bitwise_ours"] = bool(torch.equal(r8.y, r.y) and torch.equal(r8.ys, r.ys))
        except Exception as e:  # noqa: BLE001 - the W8 form is new: its failure must not lose the other columns
            row["ours_w8_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for name, fn, wl in (("stock_bmm", stock_bmm, ws), ("stock_quant", stock_quant, ws), ("ours", ours, ws),
                             ("ours_w8", ours_w8, w8s)):
            if name == "ours_w8" and "ours_w8_error" in row:
                continue
            tm = time_launches(lambda i, fn=fn, wl=wl: fn(o, wl[i % len(wl)]), plan.launches, device=dev,
                               replays=a.replays)
            row[f"{name}_us"] = tm.median_us
        if chain:
            q = (torch.randn(t, h, l_dim + 64, device=dev, generator=g) * 0.5).to(torch.bfloat16)
            tables = [torch.stack([torch.randperm(KV_SLOTS, device=dev, generator=g)[:TOPK] for _ in range(t)])
                      .to(torch.int32) for _ in range(4)]
            row["chain_floor_us"] = (row["floor_bytes"] + o_proj_bytes(t, hidden, k_o)) / bw["bytes_per_s"] * 1e6
            n = max(len(op_copies), len(ws))
            launches = max(plan.launches, 2 * n)
            for name, fn, wl in (("chain_core", chain_core, ws), ("chain_stock", chain_stock, ws),
                                 ("chain_ours", chain_ours, ws), ("chain_ours_w8", chain_ours_w8, w8s)):
                if name == "chain_ours_w8" and "ours_w8_error" in row:
                    continue
                tm = time_launches(lambda i, fn=fn, wl=wl: fn(q, tables[i % 4], wl[i % len(wl)],
                                                              op_copies[i % len(op_copies)]),
                                   launches, device=dev, replays=a.replays)
                row[f"{name}_us"] = tm.median_us
        row["speedup_vs_stock_quant"] = row["stock_quant_us"] / row["ours_us"]
        row["ours_over_floor"] = row["ours_us"] / row["floor_us"]
        if chain:
            row["chain_speedup"] = row["chain_stock_us"] / row["chain_ours_us"]
        rows.append(row)
        print("[v-up] " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in row.items()),
              flush=True)
    return {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "preset": a.preset,
            "copy_bandwidth": bw, "l2_bytes": l2, "rotation": plan.to_dict(), "replays": a.replays, "seed": a.seed,
            "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 2) -> str:
        return "-" if x is None else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    bw = (res.get("copy_bandwidth") or {}).get("bytes_per_s")
    lines = [f"# bench v-up: W_UV + o_proj act quant ({res.get('gpu')}, {res.get('date')}, commit {res.get('commit')})",
             "", f"Copy bandwidth {bw / 1e12:.2f} TB/s; preset {res.get('preset')}; times: median us per launch, "
             "CUDA-graph replays, weights rotated past L2." if bw else "", "",
             "| T | stock bmm | stock bmm + act quant | ours | floor | ours / floor | speedup | ours W8 | core alone "
             "| chain stock | chain ours | chain ours W8 | chain floor (W_UV + o_proj) | chain speedup | ours y rel L2 "
             "| y > 1 ulp | quant bitwise | W8 bitwise ours |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res.get("rows", []):
        lines.append("| " + " | ".join([
            str(r["T"]), f(r.get("stock_bmm_us")), f(r.get("stock_quant_us")), f(r.get("ours_us")), f(r.get("floor_us")),
            f(r.get("ours_over_floor")), f(r.get("speedup_vs_stock_quant")), f(r.get("ours_w8_us")),
            f(r.get("chain_core_us")), f(r.get("chain_stock_us")),
            f(r.get("chain_ours_us")), f(r.get("chain_ours_w8_us")), f(r.get("chain_floor_us")),
            f(r.get("chain_speedup")), f"{r.get('ours_y_rel_l2', 0):.2e}", f"{r.get('ours_y_over_1ulp', 0):.4f}",
            str(r.get("ours_quant_bitwise")), str(r.get("ours_w8_bitwise_ours", r.get("ours_w8_error", "-")))]) + " |")
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    try:
        validate(a)
    except ValueError as e:
        print(e)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench v-up: needs a CUDA GPU (Hopper)")
        return 2
    res = run(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "v_up.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "v_up.md").write_text(markdown(res))
    print(markdown(res))
    return 0
