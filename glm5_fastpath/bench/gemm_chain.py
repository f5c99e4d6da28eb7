"""`glm5-fastpath bench gemm-chain`: two dependent prefix GEMMs as two launches vs one persistent chain launch.

The question behind MegaRTP's weight loader (issue #5): how much of a GEMM's fixed per-launch cost (~3 us on the
H200: `bench gemm-phases`, `bench gemm-layout`) disappears when the dependent GEMM's weights stream into the same
ring while the first GEMM finishes? Pairs: QKV-A -> indexer Q (B0 -> D1, the critical path at 16 tokens) and QKV-A ->
q_b (B0 -> D0). Per pair and token count:
  separate      A then B, each at its default config (ops.fp8_gemm), PDL off
  separate_pdl  the same with PDL (B's weight prologue may overlap A's tail where its CTAs fit)
  chain <cfg>   ops.fp8_gemm_chain.gemm_chain: one launch, B's activations gated on A's completion
Times: CUDA-graph replays, weights rotated past 2x L2, median; floor = both GEMMs' bytes at the copy bandwidth.
Every chain config's outputs are checked bitwise against two forced-config launches of the same tile code.
Output: OUT/gemm_chain.json, OUT/gemm_chain.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping

# (pair name, A (N, K), B (N, K))
PAIRS = {"qkv_a>index_q": ((2624, 6144), (4096, 2048)), "qkv_a>q_b": ((2624, 6144), (16384, 2048))}
DEFAULT_TOKENS = (1, 16)


def chain_configs(m: int) -> list[tuple[int, int, int, int, int | None, str]]:
    """(tm, stages, splits A, splits B, CTAs, dependency) candidates per token count. CTAs = A's unit count makes
    every CTA start with an A unit, so each one's B weights stream into its ring right behind its A stages (None:
    min(units, SMs), where CTAs past A's units start B early and wait). "tile": A tile-major, B's k block g gated on
    A's tile g only; with 12 splits A's 21 tiles finish in two waves (tiles 0-10, then 11-20), so half of B can start
    while A's second wave streams."""
    tm = 8 if m <= 8 else 16 if m <= 16 else 32
    return [(tm, 6, 4, 2, 84, "grid"), (tm, 6, 6, 4, 126, "grid"), (tm, 6, 12, 4, None, "grid"),
            (tm, 6, 12, 4, None, "tile"), (tm, 6, 6, 4, None, "tile"), (tm, 6, 12, 2, None, "tile")]


def summarize_phases(rows: list[list[int]]) -> dict[str, Any]:
    """One phase-build launch's per-CTA marks (ops.fp8_gemm_chain.PHASE_NAMES) -> us after the first entry:
    median / max of each mark over the CTAs that reached it."""
    import statistics

    live = [r for r in rows if r[0] > 0]
    if not live:
        raise ValueError("gemm_chain phases: no CTA recorded its entry")
    t0 = min(r[0] for r in live)
    out: dict[str, Any] = {"ctas": len(live)}
    for i, name in enumerate(("entry", "a_loop_done", "a_signalled", "b_wait_passed", "b_loop_done", "last_unit_done",
                              "producer_b_wait_passed")):
        xs = [(r[i] - t0) / 1e3 for r in live if r[i] > 0]
        out[name] = (round(statistics.median(xs), 2), round(max(xs), 2)) if xs else None
    return out


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for gemm_chain.json / .md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts")
    p.add_argument("--pairs", default=",".join(PAIRS), help="comma list of " + ", ".join(PAIRS))
    p.add_argument("--replays", type=int, default=50, help="graph replays per timing (median)")


def render_markdown(rep: Mapping[str, Any]) -> str:
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [f"# Two prefix GEMMs: two launches vs one chain launch ({rep['device']}, {rep['date']}, commit "
             f"{rep['commit']})", "",
             f"CUDA-graph replays, weights rotated past 2x L2, median us; floor = both GEMMs' bytes at "
             f"{rep['copy_tbs']:.2f} TB/s. chain tm/stages/splits A/splits B; bitwise = equal to two forced-config "
             f"launches of the same tile code.", "",
             "| pair | M | MB | floor | A alone | B alone | separate | separate PDL | best chain | chain cfg | "
             "separate PDL / chain | chain x floor | bitwise |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---|"]
    for r in rep["rows"]:
        ch = r.get("chains") or []
        ok = [c for c in ch if c.get("us") is not None]
        best = min(ok, key=lambda c: c["us"]) if ok else None
        eq = "-" if not ch else ("yes" if all(c.get("bitwise") for c in ch if "bitwise" in c) else "NO")
        sp = r.get("separate_pdl_us")
        lines.append(f"| {r['pair']} | {r['M']} | {r['mb']:.1f} | {f(r['floor_us'])} | {f(r.get('a_us'))} | "
                     f"{f(r.get('b_us'))} | {f(r.get('separate_us'))} | {f(sp)} | {f(best and best['us'])} | "
                     f"{best['cfg'] if best else '-'} | {f(sp / best['us'] if best and sp else None)} | "
                     f"{f(best['us'] / r['floor_us'] if best else None)} | {eq} |")
    lines += ["", "Phase build, one launch per chain config (us after the first CTA entry; median / max over CTAs):", "",
              "| pair | M | chain cfg | A loop done | A signalled | producer past B wait | math past B wait | "
              "B loop done | last unit done |", "|---|---:|---|---|---|---|---|---|---|"]
    g = lambda x: "-" if x is None else f"{x[0]:.2f} / {x[1]:.2f}"  # noqa: E731
    for r in rep["rows"]:
        for c in r.get("chains") or []:
            ph = c.get("phases")
            if ph:
                lines.append(f"| {r['pair']} | {r['M']} | {c['cfg']} | {g(ph['a_loop_done'])} | {g(ph['a_signalled'])} | "
                             f"{g(ph['producer_b_wait_passed'])} | {g(ph['b_wait_passed'])} | {g(ph['b_loop_done'])} | "
                             f"{g(ph['last_unit_done'])} |")
    return "\n".join(lines) + "\n"


def run_case(pair: str, m: int, replays: int, copy_bps: float, dev: str = "cuda") -> dict[str, Any]:
    import torch

    from ..ops import fp8_gemm as F
    from ..ops import fp8_gemm_chain as C
    from .gemm_inputs import flush_l2, fp8_gemm_bytes, random_fp8_act, random_fp8_linear
    from .timing import l2_cache_bytes, plan_rotation, time_launches

    (na, ka), (nb, kb) = PAIRS[pair]
    set_bytes = fp8_gemm_bytes(m, na, ka) + fp8_gemm_bytes(m, nb, kb)
    plan = plan_rotation(set_bytes, l2_cache_bytes(dev), min_launches=20)
    g = torch.Generator(device=dev).manual_seed(1000 + m)
    sets = [(random_fp8_linear(na, ka, g, dev), random_fp8_act(m, ka, g, dev), random_fp8_linear(nb, kb, g, dev),
             random_fp8_act(m, kb, g, dev)) for _ in range(plan.sets)]
    out: dict[str, Any] = {"pair": pair, "M": m, "mb": set_bytes / 1e6, "floor_us": set_bytes / copy_bps * 1e6,
                           "rotation": plan.to_dict(), "a_config": F.config_for(m, na, ka).describe(),
                           "b_config": F.config_for(m, nb, kb).describe()}

    def timed(fn) -> float:
        return time_launches(fn, plan.launches, device=dev, replays=replays).median_us

    out["a_us"] = timed(lambda i: F.fp8_gemm_skinny(*sets[i % plan.sets][1], sets[i % plan.sets][0], pdl=False))
    out["b_us"] = timed(lambda i: F.fp8_gemm_skinny(*sets[i % plan.sets][3], sets[i % plan.sets][2], pdl=False))

    def separate(i: int, pdl: bool) -> Any:
        la, xa, lb, xb = sets[i % plan.sets]
        return F.fp8_gemm_skinny(*xa, la, pdl=pdl), F.fp8_gemm_skinny(*xb, lb, pdl=pdl)

    out["separate_us"] = timed(lambda i: separate(i, False))
    out["separate_pdl_us"] = timed(lambda i: separate(i, True))
    out["chains"] = []
    for tm, st, sa, sb, ctas, dep in chain_configs(m):
        cfg = f"tm{tm} st{st} s{sa}/s{sb}" + (f" P{ctas}" if ctas else "") + f" {dep}"
        rec: dict[str, Any] = {"cfg": cfg}
        try:
            la, xa, lb, xb = sets[0]
            ya, yb = C.gemm_chain(C.ChainGemm(*xa, la, sa), C.ChainGemm(*xb, lb, sb), tm=tm, stages=st, ctas=ctas,
                                  dep=dep)
            with F.forced_config(tm, sa, st, impl="wgmma"):  # same tile code; stages do not change the sums
                ra = F.fp8_gemm_skinny(*xa, la, pdl=False)
            with F.forced_config(tm, sb, st, impl="wgmma"):
                rb = F.fp8_gemm_skinny(*xb, lb, pdl=False)
            torch.cuda.synchronize()
            rec["bitwise"] = bool(torch.equal(ya.view(torch.int16), ra.view(torch.int16)) and
                                  torch.equal(yb.view(torch.int16), rb.view(torch.int16)))

            def chain(i: int, tm=tm, st=st, sa=sa, sb=sb, ctas=ctas, dep=dep) -> Any:
                la, xa, lb, xb = sets[i % plan.sets]
                return C.gemm_chain(C.ChainGemm(*xa, la, sa), C.ChainGemm(*xb, lb, sb), tm=tm, stages=st, ctas=ctas,
                                    dep=dep)
            rec["us"] = timed(chain)
            # one launch of the phase build (caches flushed first): where the chain's time goes
            flush_l2(dev)
            C.reset_phases(tm, st, device=dev, tile=dep == "tile")
            with C.phase_build():
                C.gemm_chain(C.ChainGemm(*xa, la, sa), C.ChainGemm(*xb, lb, sb), tm=tm, stages=st, ctas=ctas, dep=dep)
            rec["phases"] = summarize_phases(C.read_phases(tm, st, device=dev, tile=dep == "tile").cpu().tolist())
        except (C.GemmChainInputError, F.Fp8GemmInputError) as e:
            rec["skipped"] = str(e)
        out["chains"].append(rec)
    return out


def run(a: argparse.Namespace) -> int:
    import datetime
    import os

    import torch

    from .timing import measure_copy_bandwidth

    if not torch.cuda.is_available():
        raise ValueError("bench gemm-chain times the wgmma kernels: it needs a CUDA GPU (sm_90)")
    pairs = [x for x in a.pairs.split(",") if x]
    bad = [x for x in pairs if x not in PAIRS]
    if bad or not pairs:
        raise ValueError(f"bench gemm-chain: unknown pair(s) {bad or a.pairs!r}; choose from {', '.join(PAIRS)}")
    tokens = sorted({int(x) for x in a.tokens.split(",") if x})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    copy_bps = float(measure_copy_bandwidth("cuda")["bytes_per_s"])
    rep: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                           "commit": os.environ.get("GLM5_FASTPATH_COMMIT", "unknown"), "copy_tbs": copy_bps / 1e12,
                           "rows": []}
    for pair in pairs:
        for m in tokens:
            rep["rows"].append(run_case(pair, m, a.replays, copy_bps))
            print(render_markdown(rep).splitlines()[-1], flush=True)
            (out / "gemm_chain.json").write_text(json.dumps(rep, indent=1))
            (out / "gemm_chain.md").write_text(render_markdown(rep))
    return 0


__all__ = ["DEFAULT_TOKENS", "PAIRS", "add_arguments", "chain_configs", "render_markdown", "run", "run_case",
           "summarize_phases"]
