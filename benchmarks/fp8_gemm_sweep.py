#!/usr/bin/env python3
"""One-shot H200 sweep of the skinny FP8 GEMM family (glm5_fastpath.ops.fp8_gemm): configs + diagnostics.

Shapes (GLM-5): QKV-A 2624x6144 (B0), q_b 16384x2048 (D0), wq_b 4096x2048 (D1), wk 128x6144 (B1);
M in {1, 16, 64, 128}.

Phases (each writes its records as it goes; the JSON is rewritten after every phase):
  A  plain GEMM (EPI_PLAIN, PDL off) over a grid: token block tm x K splits x ring stages x
     launch-bounds min CTAs/SM (minb=2 only where 2 CTAs fit and the grid exceeds one wave).
     Every config's output (weight set 0) is checked against a float64 reference (rel. err of the
     max |y|); a wrong config is reported and never "best".
  B  diagnostics at the heuristic config and at the best plain config of each (shape, M):
     loads only (cp.async ring + waits; achieved streaming bandwidth), no split-K reduce (MMA path
     without the reduce), no loads in the K loop (MMA + promotion + barriers only); plus the best
     config with PDL on. At M=1 the loads-only variant also over the splits x stages grid (tm=8).
  C  the fused op of each shape (B0 / D0 / D1 / B1) at the heuristic config, the best plain config
     and the best plain config of each other token block (epilogue / row-tail cost vs tm); for B0
     also split mode (plain GEMM at config_for's EPI_PLAIN choice, and at the best plain config,
     then the b0_row_norms row kernel), PDL off and on.

Timing: glm5_fastpath.bench.timing.time_launches (CUDA-graph replays), weights rotated over enough
distinct sets to exceed 2x L2 per replay; activations random (never zeros). Floor = (weights +
activations + bf16 output bytes) / measured device copy bandwidth.

    PYTHONPATH=$PWD GLM5_FASTPATH_CACHE_DIR=/tmp/jit python benchmarks/fp8_gemm_sweep.py --out /tmp/sweep

Writes DIR/fp8_gemm_sweep.json (every record) and DIR/fp8_gemm_sweep.md (summary tables).
"""
from __future__ import annotations

import argparse
import concurrent.futures as cf
import datetime as _dt
import json
import os
import sys
import time
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from glm5_fastpath.bench.timing import (CudaContextLost, l2_cache_bytes, measure_copy_bandwidth,  # noqa: E402
                                        plan_rotation, time_launches)
from glm5_fastpath.config import INDEXER_K_NORM_EPS, Glm5Config  # noqa: E402
from glm5_fastpath.ops import fp8_gemm as F  # noqa: E402

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
MS = (1, 16, 64, 128)
SPLITS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48)
STAGES = (3, 4, 6, 8)
SHAPES = {  # name: (N, K, fused epilogue)
    "qkv_a": (2624, 6144, F.EPI_QKV_A),
    "q_b": (16384, 2048, F.EPI_Q_B),
    "wq_b": (4096, 2048, F.EPI_IDX_Q),
    "wk": (128, 6144, F.EPI_IDX_K),
}
DIAG_NAMES = {0: "full", 1: "loads_only", 2: "no_reduce", 3: "no_loads"}
SMEM_PER_SM = 228 * 1024
SMEM_RESERVED = 1024
REPLAYS = 12


def tms_for(m: int) -> list[int]:
    return [tm for tm in F.TOKEN_BLOCKS if (tm == 8 or tm // 2 < m) and -(-m // tm) <= 8]


def grid_for(m: int, n: int, k: int, sms: int) -> list[tuple[int, int, int, int]]:
    """(tm, splits, stages, minb) candidates of the plain sweep."""
    g = k // 128
    out = []
    for tm in tms_for(m):
        for s in SPLITS:
            if s > g:
                continue
            c0 = F.SkinnyConfig(F.EPI_PLAIN, m, n, k, tm, s, 4)
            if c0.ctas > 4 * sms or (c0.ctas < sms // 8 and s * 2 <= g and c0.tiles_n * c0.tiles_m * g >= sms // 8):
                continue  # far beyond a few waves, or far below one wave while more splits exist
            for st in STAGES:
                c = F.SkinnyConfig(F.EPI_PLAIN, m, n, k, tm, s, st)
                if c.smem_bytes > 227 * 1024 or (st > 4 and tm == 64 and st == 8):
                    continue
                out.append((tm, s, st, 1))
                fits2 = 2 * (c.smem_bytes + SMEM_RESERVED) <= SMEM_PER_SM
                if fits2 and c.ctas > sms and tm <= 32:
                    out.append((tm, s, st, 2))
    return out


class Case:
    """Weights (rotated sets), activations and the float64 reference of one (shape, M)."""

    def __init__(self, name: str, m: int, dev, l2: int, gen: torch.Generator, weights: dict):
        self.name, self.m = name, m
        self.n, self.k, self.epi = SHAPES[name]
        n, k = self.n, self.k
        self.sets, self.w, self.ws, self.plan = weights[name]
        self.x8 = (torch.randn(m, k, device=dev, generator=gen) * 2).to(FP8)
        self.xs = torch.rand(m, k // 128, device=dev, generator=gen) * 0.01 + 0.001
        w0 = self.w[0].float() * self.ws[0].repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)
        x0 = self.x8.float() * self.xs.repeat_interleave(128, 1)
        self.ref = (x0.double() @ w0.double().t()).float()
        self.bytes = n * k + m * k + m * n * 2 + self.ws[0].numel() * 4 + self.xs.numel() * 4

    def plain(self, i: int, pdl: bool = False):
        return torch.ops.glm5_fastpath.fp8_gemm_skinny(self.x8, self.xs, self.w[i % self.sets], self.ws[i % self.sets], pdl)


def make_weights(dev, l2: int, gen) -> dict:
    out = {}
    for name, (n, k, _) in SHAPES.items():
        set_bytes = n * k
        plan = plan_rotation(set_bytes, l2, factor=2.0, min_launches=20, max_sets=256)
        w, ws = [], []
        for _ in range(plan.sets):
            w.append((torch.randn(n, k, device=dev, generator=gen) * 0.5).to(FP8))
            ws.append(torch.rand(-(-n // 128), k // 128, device=dev, generator=gen) * 0.02 + 0.001)
        out[name] = (plan.sets, w, ws, plan)
    return out


class Fused:
    """The fused op of a shape with its extra inputs (GLM-5 dims)."""

    def __init__(self, case: Case, cfg: Glm5Config, dev, gen):
        self.c, self.cfgm = case, cfg
        m = case.m
        self.pos = torch.randint(0, 4096, (m,), device=dev, generator=gen, dtype=torch.int64)
        self.table = F.rope_table(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings, dev)
        self.q_norm = (torch.rand(cfg.q_lora_rank, device=dev, generator=gen) + 0.5).to(BF16)
        self.kv_norm = (torch.rand(cfg.kv_lora_rank, device=dev, generator=gen) + 0.5).to(BF16)
        self.w_raw = torch.randn(m, cfg.index_n_heads, device=dev, generator=gen).to(BF16)
        d = cfg.index_head_dim
        self.ln_w = torch.rand(d, device=dev, generator=gen) + 0.5
        self.ln_b = torch.randn(d, device=dev, generator=gen) * 0.1
        pages = -(-max(m, 1) // 64) + 1
        self.cache = torch.zeros(pages, 64 * (d + 4), dtype=torch.uint8, device=dev)
        self.slots = torch.randperm(pages * 64, device=dev, generator=gen)[:m].to(torch.int64)

    def split(self, i: int, pdl: bool = False):
        """B0 split mode: plain GEMM [M, 2624] bf16, then the row kernel (both with `pdl`)."""
        cs, c = self.c, self.cfgm
        w, ws = cs.w[i % cs.sets], cs.ws[i % cs.sets]
        o = torch.ops.glm5_fastpath
        qkv = o.fp8_gemm_skinny(cs.x8, cs.xs, w, ws, pdl)
        return o.b0_row_norms(qkv, self.q_norm, self.kv_norm, c.q_lora_rank, c.kv_lora_rank, c.qk_rope_head_dim,
                              float(c.rms_norm_eps), pdl)

    def __call__(self, i: int, pdl: bool = False):
        cs, c = self.c, self.cfgm
        w, ws = cs.w[i % cs.sets], cs.ws[i % cs.sets]
        o = torch.ops.glm5_fastpath
        if cs.epi == F.EPI_QKV_A:
            return o.fp8_qkv_a(cs.x8, cs.xs, w, ws, self.q_norm, self.kv_norm, c.q_lora_rank, c.kv_lora_rank,
                               c.qk_rope_head_dim, float(c.rms_norm_eps), pdl)
        if cs.epi == F.EPI_Q_B:
            return o.fp8_q_b_rope(cs.x8, cs.xs, w, ws, self.pos, self.table, c.num_attention_heads,
                                  c.qk_nope_head_dim, c.qk_rope_head_dim, float(c.rope_theta), pdl)
        if cs.epi == F.EPI_IDX_Q:
            return o.fp8_indexer_q(cs.x8, cs.xs, w, ws, self.w_raw, self.pos, self.table, c.index_n_heads,
                                   c.index_head_dim, c.qk_rope_head_dim, float(c.index_weight_scale),
                                   float(c.rope_theta), pdl)
        return o.fp8_indexer_k(cs.x8, cs.xs, w, ws, self.ln_w, self.ln_b, self.pos, self.slots, self.cache,
                               self.table, c.qk_rope_head_dim, float(INDEXER_K_NORM_EPS), float(c.rope_theta), pdl)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", required=True, type=Path)
    ap.add_argument("--budget-s", type=float, default=170.0, help="hard wall budget of the timing phases")
    ap.add_argument("--shapes", default=",".join(SHAPES))
    ap.add_argument("--ms", default=",".join(map(str, MS)))
    args = ap.parse_args()
    t_start = time.time()
    deadline_a = t_start + 0.55 * args.budget_s
    deadline_b = t_start + 0.75 * args.budget_s
    deadline = t_start + args.budget_s
    args.out.mkdir(parents=True, exist_ok=True)
    if not torch.cuda.is_available():
        print("fp8_gemm_sweep: needs a CUDA device", file=sys.stderr)
        return 2
    dev = torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    l2 = l2_cache_bytes(dev)
    shapes = [s for s in args.shapes.split(",") if s]
    ms = [int(x) for x in args.ms.split(",") if x]
    cfg = Glm5Config.preset("glm5")
    gen = torch.Generator(device=dev)
    gen.manual_seed(1234)

    # ---- compile every variant in parallel (nvcc subprocesses; the JIT cache is process-safe) ----
    specs = set()
    grids = {}
    for name in shapes:
        n, k, epi = SHAPES[name]
        for m in ms:
            grids[(name, m)] = grid_for(m, n, k, sms)
            for tm, s, st, mb in grids[(name, m)]:
                specs.add((tm, st, F.EPI_PLAIN, mb, 0))
            for tm in tms_for(m):
                for st in STAGES:
                    for d in (1, 2, 3):
                        specs.add((tm, st, F.EPI_PLAIN, 1, d))
                    specs.add((tm, st, epi, 1, 0))
                    if tm <= 32:
                        specs.add((tm, st, epi, 2, 0))
            h = F.config_for(m, n, k, epi, sms)  # heuristic configs
            specs.add((h.tm, h.stages, epi, 1, 0))
            hp = F.config_for(m, n, k, F.EPI_PLAIN, sms)
            specs.add((hp.tm, hp.stages, F.EPI_PLAIN, 1, 0))
    specs = sorted(s for s in specs if F.SkinnyConfig(s[2], 1, 128, 128, s[0], 1, s[1]).smem_bytes <= 227 * 1024)
    from glm5_fastpath.jit import compile_kernel
    t0 = time.time()
    comp_err = {}
    with cf.ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 8)) as ex:
        futs = {ex.submit(compile_kernel, F.kernel_spec(*s), None, device=dev): s for s in specs}
        for f in cf.as_completed(futs):
            try:
                f.result()
            except Exception as e:  # noqa: BLE001
                comp_err[futs[f]] = f"{type(e).__name__}: {str(e)[:400]}"
    t_compile = time.time() - t0
    print(f"compiled {len(specs)} variants in {t_compile:.1f} s ({len(comp_err)} failed)", flush=True)
    for s, e in comp_err.items():
        print(f"  compile failed {s}: {e}", flush=True)
    try:  # B0 split mode's row kernel (phase C); a failure only loses the C_split records
        F._row_kernel(cfg.q_lora_rank, cfg.kv_lora_rank, cfg.qk_rope_head_dim, dev)
    except Exception as e:  # noqa: BLE001
        print(f"  b0_row_norms kernel failed to load: {type(e).__name__}: {str(e)[:400]}", flush=True)

    bw = measure_copy_bandwidth(dev, 1 << 30, 10)
    bps = bw["bytes_per_s"]
    weights = make_weights(dev, l2, gen)
    meta = {"date": _dt.datetime.now().isoformat(timespec="seconds"), "device": torch.cuda.get_device_name(dev),
            "sms": sms, "l2_bytes": l2, "copy_bw": bw, "compile_s": t_compile, "variants": len(specs),
            "compile_errors": {str(k): v for k, v in comp_err.items()},
            "rotation": {k: v[3].to_dict() for k, v in weights.items()}}
    records: list[dict] = []
    cases = {(name, m): Case(name, m, dev, l2, gen, weights) for name in shapes for m in ms}
    lost = [False]

    def write():
        (args.out / "fp8_gemm_sweep.json").write_text(json.dumps({"meta": meta, "records": records}, indent=1))

    def run(case: Case, phase: str, fn, knobs, epi: int, diag: int = 0, pdl: bool = False, check: bool = False,
            **extra) -> dict | None:
        if lost[0]:
            return None
        tm, s, st, mb = knobs
        c = F.SkinnyConfig(epi, case.m, case.n, case.k, tm, s, st, mb, diag)
        rec = {"phase": phase, "shape": case.name, "M": case.m, "epi": epi, "tm": tm, "splits": s, "stages": st,
               "minb": mb, "diag": DIAG_NAMES[diag], "pdl": pdl, "ctas": c.ctas, "smem": c.smem_bytes, **extra}
        if (tm, st, epi, mb, diag) in comp_err:
            rec["error"] = "compile failed"
            records.append(rec)
            return rec
        try:
            with F.forced_config(tm, s, st, mb, diag):
                if check:
                    y = fn(0, pdl).float()
                    torch.cuda.synchronize(dev)
                    err = float((y - case.ref).abs().max() / case.ref.abs().max().clamp_min(1e-30))
                    rec["rel_err"] = err
                    rec["ok"] = bool(err < 2e-2)
                t = time_launches(lambda i: fn(i, pdl), case.plan.launches, device=dev, replays=REPLAYS, warmup=2)
        except CudaContextLost as e:
            rec["error"] = f"CUDA context lost: {e}"
            lost[0] = True
            records.append(rec)
            print(f"!! {rec}", flush=True)
            return None
        except Exception as e:  # noqa: BLE001
            rec["error"] = f"{type(e).__name__}: {str(e)[:300]}"
            records.append(rec)
            return rec
        rec.update(us=t.median_us, us_min=t.min_us, us_p90=t.p90_us, method=t.method,
                   tbps=case.bytes / (t.median_us * 1e-6) / 1e12, x_floor=t.median_us / (case.bytes / bps * 1e6))
        records.append(rec)
        return rec

    def heur(case: Case, epi: int):
        h = F.config_for(case.m, case.n, case.k, epi, sms)
        return (h.tm, h.splits, h.stages, 1)

    # ---- phase A: plain grid -----------------------------------------------------------------------
    best: dict[tuple, dict] = {}
    best_tm: dict[tuple, dict] = {}
    for key, case in cases.items():
        hk = heur(case, F.EPI_PLAIN)
        r = run(case, "A_heuristic", case.plain, hk, F.EPI_PLAIN, check=True)
        grid = [g for g in grids[key] if g != hk]
        for g in grid:
            if time.time() > deadline_a:
                break
            run(case, "A_grid", case.plain, g, F.EPI_PLAIN, check=True)
        ok = [x for x in records if x["shape"] == case.name and x["M"] == case.m and x["phase"].startswith("A")
              and "us" in x and x.get("ok", True)]
        if ok:
            best[key] = min(ok, key=lambda x: x["us"])
            for tm in {x["tm"] for x in ok}:
                best_tm[key + (tm,)] = min((x for x in ok if x["tm"] == tm), key=lambda x: x["us"])
            b = best[key]
            h = r if r and "us" in r else None
            print(f"A {case.name:6s} M={case.m:3d}: heuristic {h['us'] if h else float('nan'):7.2f} us | best "
                  f"{b['us']:7.2f} us tm={b['tm']} s={b['splits']} st={b['stages']} mb={b['minb']} "
                  f"({b['tbps']:.2f} TB/s, x{b['x_floor']:.2f} floor) [{len(ok)} ok configs]", flush=True)
        if lost[0]:
            break
    write()

    # ---- phase B: diagnostics ------------------------------------------------------------------------
    for key, case in cases.items():
        if lost[0] or time.time() > deadline_b:
            break
        hk = heur(case, F.EPI_PLAIN)
        knob_sets = [("heuristic", hk)]
        if key in best:
            b = best[key]
            bk = (b["tm"], b["splits"], b["stages"], b["minb"])
            if bk != hk:
                knob_sets.append(("best", bk))
            run(case, "B_pdl", case.plain, bk, F.EPI_PLAIN, pdl=True, at="best")
        for label, k in knob_sets:
            for d in (1, 2, 3):
                run(case, "B_diag", case.plain, (k[0], k[1], k[2], 1), F.EPI_PLAIN, diag=d, at=label)
        if case.m == 1:
            for s in SPLITS:
                for st in STAGES:
                    if s <= case.k // 128 and time.time() < deadline_b:
                        run(case, "B_stream", case.plain, (8, s, st, 1), F.EPI_PLAIN, diag=1)
    write()

    # ---- phase C: fused ops ----------------------------------------------------------------------------
    for key, case in cases.items():
        if lost[0] or time.time() > deadline:
            break
        fused = Fused(case, cfg, dev, gen)
        hk = heur(case, case.epi)
        run(case, "C_fused", fused, hk, case.epi, at="heuristic")
        run(case, "C_fused", fused, hk, case.epi, pdl=True, at="heuristic")
        seen = {hk}
        cands = ([("best", best[key])] if key in best else []) + \
                [(f"best_tm{tm}", best_tm[key + (tm,)]) for tm in F.TOKEN_BLOCKS if key + (tm,) in best_tm]
        for label, b in cands:
            bk = (b["tm"], b["splits"], b["stages"], b["minb"])
            if bk in seen:
                continue
            seen.add(bk)
            run(case, "C_fused", fused, bk, case.epi, at=label)
        if case.epi == F.EPI_QKV_A:  # B0 split mode: the plain GEMM's config (forced = config_for's) + row kernel
            pk = heur(case, F.EPI_PLAIN)
            run(case, "C_split", fused.split, pk, F.EPI_PLAIN, at="heuristic")
            run(case, "C_split", fused.split, pk, F.EPI_PLAIN, pdl=True, at="heuristic")
            if key in best:
                b = best[key]
                bk = (b["tm"], b["splits"], b["stages"], b["minb"])
                if bk != pk:
                    run(case, "C_split", fused.split, bk, F.EPI_PLAIN, pdl=True, at="best")
    write()

    md = summarize(meta, records, cases, best, bps)
    (args.out / "fp8_gemm_sweep.md").write_text(md)
    print(md)
    print(f"total {time.time() - t_start:.1f} s; wrote {args.out}/fp8_gemm_sweep.json and .md", flush=True)
    return 1 if lost[0] else 0


def summarize(meta, records, cases, best, bps) -> str:
    def get(case, **kw):
        for r in records:
            if r["shape"] == case.name and r["M"] == case.m and "us" in r and all(r.get(a) == v for a, v in kw.items()):
                return r
        return None

    def us(r):
        return f"{r['us']:.2f}" if r else "-"

    lines = [f"# fp8_gemm skinny sweep ({meta['device']}, {meta['date']})", "",
             f"copy bandwidth {bps / 1e12:.3f} TB/s (floor = weight+act+out bytes / that); {meta['variants']} "
             f"variants compiled in {meta['compile_s']:.0f} s; failed: {len(meta['compile_errors'])}", "",
             "## Plain GEMM: heuristic vs best config; diagnostics at the best config (us)", "",
             "| shape | M | floor | heuristic (tm/s/st) | best (tm/s/st/mb) | best us | TB/s | x floor | best+PDL | "
             "loads only | no reduce | no loads (MMA) | bad configs |", "|" + "---|" * 13]
    for key, case in cases.items():
        fl = case.bytes / bps * 1e6
        h = get(case, phase="A_heuristic")
        b = best.get(key)
        bad = sum(1 for r in records if r["shape"] == case.name and r["M"] == case.m and r.get("ok") is False)
        at = "best" if b and get(case, phase="B_diag", at="best") else "heuristic"
        lines.append(
            f"| {case.name} | {case.m} | {fl:.2f} | {us(h)} ({h['tm']}/{h['splits']}/{h['stages']}) | "
            if h else f"| {case.name} | {case.m} | {fl:.2f} | - | ")
        if b:
            lines[-1] += (f"{b['tm']}/{b['splits']}/{b['stages']}/{b['minb']} | {b['us']:.2f} | {b['tbps']:.2f} | "
                          f"{b['x_floor']:.2f} | {us(get(case, phase='B_pdl'))} | "
                          f"{us(get(case, phase='B_diag', at=at, diag='loads_only'))} | "
                          f"{us(get(case, phase='B_diag', at=at, diag='no_reduce'))} | "
                          f"{us(get(case, phase='B_diag', at=at, diag='no_loads'))} | {bad} |")
        else:
            lines[-1] += "- | - | - | - | - | - | - | - | " + f"{bad} |"
    lines += ["", "## Fused ops (us): heuristic config, best plain config, best plain config per token block", "",
              "| shape | M | fused heuristic | fused heuristic+PDL | fused at best plain | per-tm (tm: us) | plain best |",
              "|---|---|---|---|---|---|---|"]
    for key, case in cases.items():
        rs = [r for r in records if r["shape"] == case.name and r["M"] == case.m and r["phase"] == "C_fused" and "us" in r]
        h = next((r for r in rs if r.get("at") == "heuristic" and not r["pdl"]), None)
        hp = next((r for r in rs if r.get("at") == "heuristic" and r["pdl"]), None)
        fb = next((r for r in rs if r.get("at") == "best"), None)
        per = ", ".join(f"{r['tm']}/{r['splits']}/{r['stages']}: {r['us']:.1f}" for r in rs if r.get("at", "").startswith("best_tm"))
        b = best.get(key)
        lines.append(f"| {case.name} | {case.m} | {us(h)} | {us(hp)} | {us(fb)} | {per} | {us(b)} |")
    lines += ["", "## B0 fused vs split (us; split = plain GEMM + b0_row_norms)", "",
              "| M | fused heuristic | fused heuristic+PDL | split heuristic | split heuristic+PDL | split best plain+PDL |",
              "|---|---|---|---|---|---|"]
    for key, case in cases.items():
        if case.epi != F.EPI_QKV_A:
            continue
        rs = [r for r in records if r["shape"] == case.name and r["M"] == case.m and "us" in r]
        pick = lambda ph, at, pdl: next((r for r in rs if r["phase"] == ph and r.get("at") == at and r["pdl"] == pdl), None)  # noqa: E731
        lines.append(f"| {case.m} | {us(pick('C_fused', 'heuristic', False))} | {us(pick('C_fused', 'heuristic', True))} | "
                     f"{us(pick('C_split', 'heuristic', False))} | {us(pick('C_split', 'heuristic', True))} | "
                     f"{us(pick('C_split', 'best', True))} |")
    lines += ["", "## Streaming (loads only, tm=8, M=1): us by splits x stages", ""]
    for key, case in cases.items():
        rs = [r for r in records if r["shape"] == case.name and r["M"] == case.m and r["phase"] == "B_stream" and "us" in r]
        if not rs:
            continue
        best_s = min(rs, key=lambda r: r["us"])
        lines.append(f"- {case.name}: best {best_s['us']:.2f} us ({best_s['tbps']:.2f} TB/s) at s={best_s['splits']} "
                     f"st={best_s['stages']}; " + " ".join(f"{r['splits']}/{r['stages']}:{r['us']:.1f}" for r in rs))
    errs = [r for r in records if "error" in r or r.get("ok") is False]
    if errs:
        lines += ["", f"## Errors / wrong results ({len(errs)})", ""]
        for r in errs[:40]:
            lines.append(f"- {r['phase']} {r['shape']} M={r['M']} tm={r['tm']} s={r['splits']} st={r['stages']} "
                         f"mb={r['minb']} diag={r['diag']}: {r.get('error', 'rel_err=%.3g' % r.get('rel_err', -1))}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    try:
        sys.exit(main())
    except Exception:  # noqa: BLE001
        traceback.print_exc()
        sys.exit(3)
