"""`glm5-fastpath bench l2-prefetch`: does pulling the next weight-bound kernel's weights into L2 during a
latency-bound window (ops.prefetch.l2_prefetch) pay, and what does the extra launch cost? (GPU)

Three sequences, each timed as one CUDA-graph launch (bench.timing.time_launches: median over replays), without
and with an l2_prefetch launch at its head, in each of the variants of --variants:
  none         no prefetch (the baseline);
  chain-bulk   on the main stream in the PDL chain, 16 KB bulk (TMA) prefetches;
  chain-lines  on the main stream in the PDL chain, 128-byte line prefetches;
  side-lines   on a side stream forked at the head and joined at the end of the sequence, line prefetches;
  side-bulk    the same with bulk prefetches.

- probe:  [prefetch X] -> a ~`--sleep-us` busy-wait kernel -> a read of X (32 MB bf16 sum). Shows the mechanism
          alone: how much of X's read the prefetch hides, and what the prefetch launch itself costs.
- tail:   [prefetch o_proj K-prefix + W_UV] -> our sparse MLA (T tokens, 2048 slots) -> the W_UV bmm (cuBLAS)
          -> o_proj (DeepGEMM fp8_gemm_nt when it runs here, else a cuBLAS bf16 GEMM of the same shape, which
          moves 2x the bytes): the attention tail of a GLM-5 layer, as the engine's `tail` site issues it.
          Swept over the o_proj fractions in --fractions.
- moe:    [prefetch the shared expert's w13 + w2] -> ops.moe_route -> act_quant -> mega_moe (256 + 1 experts,
          random routing): the engine's `moe` site.

Rotation: the probe and the tail alternate over two copies of their data (the probe's two 32 MB buffers fit
the L2 only partly, so its baseline may find some lines there); the moe sequence streams > 300 MB of expert
weights per call, which leaves nothing of the shared expert in L2 for the next call. JSON + markdown under --out.
"""
from __future__ import annotations

import argparse
import json
import traceback
from pathlib import Path
from typing import Any, Callable

H, I, E, TOPK = 6144, 2048, 256, 8
NH, KVL, DV, DQK = 64, 512, 256, 576
VARIANTS = ("none", "chain-bulk", "chain-lines", "side-lines", "side-bulk")


class Prefetch:
    """One variant's head (`start`) and end (`finish`) of a sequence."""

    def __init__(self, variant: str) -> None:
        from ..ops.prefetch import SideStream
        if variant not in VARIANTS:
            raise ValueError(f"unknown variant {variant!r} (one of {VARIANTS})")
        self.variant = variant
        self.side = SideStream() if variant.startswith("side") else None
        self.bulk = variant.endswith("bulk")

    def start(self, tensors, fractions=None) -> None:
        from ..ops.prefetch import l2_prefetch
        if self.variant == "none":
            return
        if self.side is not None:
            self.side.issue(tensors, fractions, bulk=self.bulk)
        else:
            l2_prefetch(tensors, fractions, pdl=True, bulk=self.bulk)

    def finish(self) -> None:
        if self.side is not None:
            self.side.join()


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output folder (l2_prefetch.json / .md)")
    p.add_argument("--tokens", default="1,8", help="token counts for the tail and moe sequences")
    p.add_argument("--fractions", default="0.35", help="o_proj K-prefix fractions to try at the tail site")
    p.add_argument("--variants", default=",".join(VARIANTS), help="prefetch variants (module doc)")
    p.add_argument("--cases", default="probe,tail,moe", help="which sequences to time")
    p.add_argument("--sleep-us", type=float, default=15.0, help="probe: the latency-bound window to hide behind")
    p.add_argument("--replays", type=int, default=20)
    p.add_argument("--launches", type=int, default=8, help="sequences per captured graph")
    p.add_argument("--seed", type=int, default=0)


def _rand_fp8(shape, dev, g):
    import torch
    # finite e4m3 bytes (exponent field < 15): timing only, values do not matter
    return torch.randint(0, 0x70, shape, dtype=torch.uint8, device=dev, generator=g).view(torch.float8_e4m3fn)


def _time(fn: Callable[[int], Any], a, dev) -> float:
    from .timing import time_launches
    return time_launches(fn, a.launches, device=dev, replays=a.replays).median_us


def _sleep_cycles(us: float, dev) -> int:
    import torch
    return int(us * torch.cuda.get_device_properties(dev).clock_rate / 1e3) if hasattr(
        torch.cuda.get_device_properties(dev), "clock_rate") else int(us * 1755)


def case_probe(a, dev, g) -> list[dict]:
    import torch

    xs = [torch.randn(16 * 2**20, device=dev, generator=g).to(torch.bfloat16) for _ in range(2)]
    cyc = _sleep_cycles(a.sleep_us, dev)
    rows = []
    for v in a.variant_list:
        pf = Prefetch(v)

        def seq(i, pf=pf):
            x = xs[i % 2]
            pf.start([x])
            torch.cuda._sleep(cyc)
            y = x.sum()
            pf.finish()
            return y
        rows.append({"case": "probe", "variant": v, "us": _time(seq, a, dev)})
    sleep_only = _time(lambda i: torch.cuda._sleep(cyc), a, dev)
    read_only = _time(lambda i: xs[i % 2].sum(), a, dev)
    for r in rows:
        r.update(sleep_us=sleep_only, read_us=read_only)
    return rows


def _o_proj(dev, g):
    """(label, weights (2 copies) as fn takes them, fn(x_bf16 [T, 16384], w) -> [T, 6144], the 2 weight tensors
    to prefetch)."""
    import torch
    try:
        from ..ops.act_quant import act_quant_fp8
        from .stock_prefix import load_deep_gemm  # sets DeepGEMM's JIT environment, says why it is unusable

        deep_gemm, why = load_deep_gemm()
        if deep_gemm is None:
            raise ImportError(why)
        ws = [(_rand_fp8((H, NH * DV), dev, g), torch.rand(H // 128, NH * DV // 128, device=dev, generator=g) * 1e-3)
              for _ in range(2)]

        def fp8(x, w):
            x8, xs = act_quant_fp8(x)
            out = torch.empty(x.shape[0], H, dtype=torch.bfloat16, device=dev)
            deep_gemm.fp8_gemm_nt((x8, xs), w, out)
            return out
        x = torch.randn(1, NH * DV, device=dev, generator=g).to(torch.bfloat16)
        fp8(x, ws[0])
        torch.cuda.synchronize(dev)
        return "DeepGEMM fp8_gemm_nt", ws, fp8, [w[0] for w in ws]
    except Exception as e:  # noqa: BLE001 - the stand-in below
        print(f"[l2-prefetch] DeepGEMM o_proj unavailable ({type(e).__name__}: {str(e)[:200]}); cuBLAS bf16 stand-in",
              flush=True)
    ws = [(torch.randn(H, NH * DV, device=dev, generator=g) * 0.02).to(torch.bfloat16) for _ in range(2)]
    return "cuBLAS bf16 (stand-in, 2x bytes)", ws, lambda x, w: x @ w.t(), ws


def case_tail(a, dev, g, tokens: list[int], fractions: list[float]) -> list[dict]:
    import torch

    from ..config import Glm5Config
    from ..ops import sparse_mla as SM
    scale = float(Glm5Config.preset("glm5").softmax_scale)
    kv = (torch.randn(131072, 1, DQK, device=dev, generator=g) * 0.5).to(torch.bfloat16)
    w_uv = [(torch.randn(NH, KVL, DV, device=dev, generator=g) * 0.02).to(torch.bfloat16) for _ in range(2)]
    label, ws, gemm, wmain = _o_proj(dev, g)
    rows = []
    for t in tokens:
        q = (torch.randn(t, NH, DQK, device=dev, generator=g) * 0.5).to(torch.bfloat16)
        idx = torch.stack([torch.randperm(131072, device=dev, generator=g)[:2048] for _ in range(t)]).to(torch.int32)
        for variant in a.variant_list:
            for f in ([0.0] if variant == "none" else fractions):
                pf = Prefetch(variant)

                def seq(i, f=f, pf=pf):
                    pf.start([wmain[i % 2], w_uv[i % 2]], [f, 1.0])
                    o = SM.sparse_mla_decode(q, kv, idx, scale, KVL)          # [T, H, 512]
                    v = torch.bmm(o.transpose(0, 1), w_uv[i % 2])             # [H, T, 256]
                    y = gemm(v.transpose(0, 1).reshape(t, NH * DV), ws[i % 2])
                    pf.finish()
                    return y
                row = {"case": "tail", "T": t, "o_proj": label, "variant": variant, "fraction": f}
                try:
                    row["us"] = _time(seq, a, dev)
                except Exception as e:  # noqa: BLE001
                    row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    traceback.print_exc()
                rows.append(row)
                print(f"[l2-prefetch] {row}", flush=True)
    return rows


def case_moe(a, dev, g, tokens: list[int]) -> list[dict]:
    import torch

    from ..config import Glm5Config
    from ..moe import megamoe as MM
    from ..ops.act_quant import act_quant_fp8
    from ..ops import moe_router as R
    cfg = Glm5Config.preset("glm5")
    w13 = _rand_fp8((E + 1, 2 * I, H), dev, g)
    w2 = _rand_fp8((E + 1, H, I), dev, g)
    s13 = torch.rand(E + 1, 2 * I // 128, H // 128, device=dev, generator=g) * 1e-3
    s2 = torch.rand(E + 1, H // 128, I // 128, device=dev, generator=g) * 1e-3
    wt = MM.prepare_weights(w13, s13, w2, s2, num_shared=1)
    gate = (torch.randn(E, H, device=dev, generator=g) * 0.02).to(torch.bfloat16)
    bias = torch.zeros(E, device=dev)
    gap = _sleep_cycles(2.0, dev)
    rows = []
    for t in tokens:
        hs = [torch.randn(t, H, device=dev, generator=g).to(torch.bfloat16) for _ in range(2)]
        mcfg = MM.default_config(t, E, TOPK, 1, torch.cuda.get_device_properties(dev).multi_processor_count)
        MM.precompile(wt, TOPK, max_tokens=t, device=dev, configs=[mcfg])
        for variant in a.variant_list:
            pf = Prefetch(variant)

            def seq(i, pf=pf):
                torch.cuda._sleep(gap)  # the post-attention norm's stand-in: no PDL trigger, the prefetch starts after it
                pf.start([wt.w13[E], wt.w2[E]])
                ids, wts, _ = R.moe_route(hs[i % 2], gate, bias, cfg)
                x8, xs = act_quant_fp8(hs[i % 2])
                y = MM.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=2.5, config=mcfg)
                pf.finish()
                return y
            row = {"case": "moe", "T": t, "variant": variant}
            try:
                row["us"] = _time(seq, a, dev)
            except Exception as e:  # noqa: BLE001
                row["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                traceback.print_exc()
            rows.append(row)
            print(f"[l2-prefetch] {row}", flush=True)
    return rows


def markdown(res: dict) -> str:
    out = [f"# L2 prefetch ahead of weight-bound kernels ({res['gpu']}, {res['date']}, commit {res['commit']})", "",
           "CUDA-graph replay median per sequence (us); in brackets: saved against `none` (positive = faster). "
           "Variants in the module doc of glm5_fastpath/bench/l2_prefetch.py.", ""]
    rows = [r for r in res["rows"] if "variant" in r]
    variants = list(dict.fromkeys(r["variant"] for r in rows))
    titles = {"probe": "probe: [prefetch 32 MB] -> busy-wait -> read the 32 MB",
              "tail": "tail: [prefetch o_proj K-prefix (fraction) + W_UV] -> sparse MLA -> W_UV bmm -> o_proj",
              "moe": "moe: 2 us gap -> [prefetch the shared expert] -> router -> act quant -> MegaMoE (256 + 1 experts)"}
    for case in ("probe", "tail", "moe"):
        cr = [r for r in rows if r["case"] == case]
        if not cr:
            continue
        keys = list(dict.fromkeys((r.get("T", "-"), r.get("fraction", "-")) for r in cr if r["variant"] != "none")) \
            or list(dict.fromkeys((r.get("T", "-"), "-") for r in cr))
        out += [f"## {titles[case]}" + (f" ({cr[0].get('o_proj')})" if case == "tail" else ""), "",
                "| T | fraction | " + " | ".join(variants) + " |", "|---:|---:|" + "---:|" * len(variants)]
        for t, f in keys:
            base = next((r.get("us") for r in cr if r["variant"] == "none" and r.get("T", "-") == t), None)
            cells = []
            for v in variants:
                r = next((r for r in cr if r["variant"] == v and r.get("T", "-") == t
                          and (v == "none" or r.get("fraction", "-") == f)), None)
                if r is None or r.get("us") is None:
                    cells.append("error" if r is not None else "-")
                elif v == "none" or base is None:
                    cells.append(f"{r['us']:.1f}")
                else:
                    cells.append(f"{r['us']:.1f} ({base - r['us']:+.1f})")
            out.append(f"| {t} | {f} | " + " | ".join(cells) + " |")
        out.append("")
    probe = [r for r in res["rows"] if r["case"] == "probe" and "sleep_us" in r]
    if probe:
        out += [f"Probe parts alone: busy-wait {probe[0]['sleep_us']:.1f} us, read {probe[0]['read_us']:.1f} us.", ""]
    errs = [r for r in res["rows"] if r.get("error")]
    out += [f"- error: {r['case']} {r.get('variant', '')} T={r.get('T', '-')}: {r['error'][:200]}" for r in errs]
    return "\n".join(out)


def main(a: argparse.Namespace) -> int:
    import torch

    from .meta import git_commit, utc_now
    if not torch.cuda.is_available():
        print("bench l2-prefetch needs a CUDA GPU")
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(a.seed)
    tokens = [int(x) for x in a.tokens.split(",") if x.strip()]
    fractions = [float(x) for x in a.fractions.split(",") if x.strip()]
    cases = {c.strip() for c in a.cases.split(",") if c.strip()}
    a.variant_list = [v.strip() for v in a.variants.split(",") if v.strip()]
    bad = [v for v in a.variant_list if v not in VARIANTS]
    if bad or "none" not in a.variant_list:
        print(f"--variants: unknown {bad} or no 'none' baseline (variants: {', '.join(VARIANTS)})")
        return 2
    rows: list[dict] = []
    for name, fn in (("probe", lambda: case_probe(a, dev, g)), ("tail", lambda: case_tail(a, dev, g, tokens, fractions)),
                     ("moe", lambda: case_moe(a, dev, g, tokens))):
        if name in cases:
            try:
                rows += fn()
            except Exception as e:  # noqa: BLE001 - one case failing keeps the others
                rows.append({"case": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
                traceback.print_exc()
    res = {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "rows": rows}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "l2_prefetch.json").write_text(json.dumps(res, indent=1))
    (out / "l2_prefetch.md").write_text(markdown(res))
    print(markdown(res))
    return 0
