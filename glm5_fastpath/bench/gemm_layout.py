"""`glm5-fastpath bench gemm-layout`: the skinny FP8 GEMM with row-major vs k-block-major weights.

Why: the wgmma mainloop streams each weight tile as 128-row x 128-byte TMA boxes. With the weight row-major
([N, K]) every box is 128 pieces of 128 bytes, K bytes apart; k-block-major ([K / 128, N, 128], the same bytes
permuted once at load: ops.fp8_gemm.kblock_major) makes every box 16 KB of contiguous memory, and the CTAs that
read one k block at a time read one contiguous region together. Shared memory receives the same bytes either
way, so the results are bitwise equal; only the DRAM access pattern changes. On the H200 the ring alone (loads
only) streamed QKV-A at 2.3 TB/s and q_b at 3.1 TB/s (2026-11-29 sweep), well below the copy bandwidth.

Per (shape, M) and layout: the default config's GEMM (CUDA-graph replays of back-to-back launches, PDL off,
weight sets rotated past 2x L2), the same config's loads-only ring (diag 1, global split-K reduce), the bytes
floor at the measured copy bandwidth, and a bitwise check of the k-block-major output against the row-major one.
Output: OUT/gemm_layout.json, OUT/gemm_layout.md.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any, Mapping

# (name, N, K): the prefix's FP8 GEMMs and o_proj
SHAPES = (("qkv_a", 2624, 6144), ("index_q", 4096, 2048), ("q_b", 16384, 2048), ("index_k", 128, 6144),
          ("o_proj", 6144, 16384))
DEFAULT_SHAPES = ("qkv_a", "index_q", "q_b")
DEFAULT_TOKENS = (1, 16, 64)
LAYOUTS = ("row", "kb")
VARIANTS = ("full", "loads")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for gemm_layout.json / .md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts")
    p.add_argument("--shapes", default=",".join(DEFAULT_SHAPES), help="comma list of " + ", ".join(s[0] for s in SHAPES))
    p.add_argument("--variants", default=",".join(VARIANTS), help="full (the GEMM) and / or loads (the ring alone)")
    p.add_argument("--replays", type=int, default=50, help="graph replays per timing (median)")


def parse_list(raw: str, allowed: tuple[str, ...], what: str) -> list[str]:
    got = [x for x in raw.split(",") if x]
    bad = [x for x in got if x not in allowed]
    if bad or not got:
        raise ValueError(f"bench gemm-layout: unknown {what} {bad or raw!r}; choose from {', '.join(allowed)}")
    return got


def ratio(a: float | None, b: float | None) -> float | None:
    return None if not a or not b else a / b


def render_markdown(rep: Mapping[str, Any]) -> str:
    f = lambda x, d=2: "-" if x is None else f"{x:.{d}f}"  # noqa: E731
    lines = [f"# Skinny FP8 GEMM: row-major vs k-block-major weights ({rep['device']}, {rep['date']}, commit "
             f"{rep['commit']})", "",
             f"CUDA-graph replays of back-to-back launches, PDL off, weights rotated past 2x L2; floor = bytes / "
             f"{rep['copy_tbs']:.2f} TB/s (measured copy). loads = the same config's ring alone (diag 1, global "
             f"reduce). us per launch (median).", "",
             "| GEMM | M | MB | config | row us | kb us | row/kb | row floor x | kb floor x | row loads TB/s | "
             "kb loads TB/s | bitwise |",
             "|---|---:|---:|---|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rep["rows"]:
        c = r["config"]
        cfg = f"tm{c['tm']} s{c['splits']} st{c['stages']} {c['reduce']}"
        eq = {True: "yes", False: "NO", None: "-"}[r.get("bitwise")]
        lines.append(f"| {r['name']} | {r['M']} | {r['mb']:.1f} | {cfg} | {f(r.get('row_full_us'))} | "
                     f"{f(r.get('kb_full_us'))} | {f(ratio(r.get('row_full_us'), r.get('kb_full_us')), 3)} | "
                     f"{f(ratio(r.get('row_full_us'), r['floor_us']))} | {f(ratio(r.get('kb_full_us'), r['floor_us']))} | "
                     f"{f(r.get('row_loads_tbs'))} | {f(r.get('kb_loads_tbs'))} | {eq} |")
    return "\n".join(lines) + "\n"


def run_case(name: str, n: int, k: int, m: int, variants: list[str], replays: int, copy_bps: float,
             dev: str = "cuda") -> dict[str, Any]:
    import torch

    from ..ops import fp8_gemm as F
    from ..weights import Fp8Linear
    from .gemm_inputs import fp8_gemm_bytes, random_fp8_act, random_fp8_linear
    from .timing import l2_cache_bytes, plan_rotation, time_launches

    cfg = F.config_for(m, n, k)
    if cfg.impl != "wgmma":
        return {"name": name, "N": n, "K": k, "M": m, "config": cfg.describe(), "mb": 0.0, "floor_us": 0.0,
                "skipped": f"the default config runs impl {cfg.impl!r} (k-block-major weights need wgmma)"}
    wbytes = fp8_gemm_bytes(0, n, k)
    set_bytes = fp8_gemm_bytes(m, n, k)
    plan = plan_rotation(set_bytes, l2_cache_bytes(dev), min_launches=20)
    g = torch.Generator(device=dev).manual_seed(m * 7919 + n)
    row, kb, xs_, x8_ = [], [], [], []
    for _ in range(plan.sets):
        row.append(random_fp8_linear(n, k, g, dev))
        kb.append(Fp8Linear(F.kblock_major(row[-1].weight), row[-1].scale_inv))
        x8, xs = random_fp8_act(m, k, g, dev)
        x8_.append(x8)
        xs_.append(xs)
    out: dict[str, Any] = {"name": name, "N": n, "K": k, "M": m, "config": cfg.describe(), "mb": set_bytes / 1e6,
                           "floor_us": set_bytes / copy_bps * 1e6, "rotation": plan.to_dict()}
    y_row = F.fp8_gemm_skinny(x8_[0], xs_[0], row[0], pdl=False)
    y_kb = F.fp8_gemm_skinny(x8_[0], xs_[0], kb[0], pdl=False)
    torch.cuda.synchronize()
    out["bitwise"] = bool(torch.equal(y_row.view(torch.int16), y_kb.view(torch.int16)))
    loads = F.forced_config(cfg.tm, cfg.splits, cfg.stages, diag=F.DIAG_LOADS_ONLY, impl="wgmma")
    for layout, lins in (("row", row), ("kb", kb)):
        for v in variants:
            def launch(i: int, lins=lins) -> Any:
                j = i % plan.sets
                return F.fp8_gemm_skinny(x8_[j], xs_[j], lins[j], pdl=False)
            if v == "loads":
                with loads:
                    t = time_launches(launch, plan.launches, device=dev, replays=replays)
                out[f"{layout}_loads_us"] = t.median_us
                out[f"{layout}_loads_tbs"] = wbytes / (t.median_us * 1e-6) / 1e12
            else:
                t = time_launches(launch, plan.launches, device=dev, replays=replays)
                out[f"{layout}_full_us"] = t.median_us
            out[f"{layout}_{v}_method"] = t.method
    return out


def run(a: argparse.Namespace) -> int:
    import datetime
    import os

    import torch

    from .timing import measure_copy_bandwidth

    if not torch.cuda.is_available():
        raise ValueError("bench gemm-layout times the wgmma kernel: it needs a CUDA GPU (sm_90)")
    shapes = {s[0]: s for s in SHAPES}
    want = parse_list(a.shapes, tuple(shapes), "shape(s)")
    variants = parse_list(a.variants, VARIANTS, "variant(s)")
    tokens = sorted({int(x) for x in a.tokens.split(",") if x})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = measure_copy_bandwidth("cuda")
    copy_bps = float(bw["bytes_per_s"])
    rep: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                           "commit": os.environ.get("GLM5_FASTPATH_COMMIT", "unknown"), "copy_tbs": copy_bps / 1e12,
                           "rows": []}
    for s in want:
        name, n, k = shapes[s]
        for m in tokens:
            rep["rows"].append(run_case(name, n, k, m, variants, a.replays, copy_bps))
            print(render_markdown(rep).splitlines()[-1], flush=True)
            (out / "gemm_layout.json").write_text(json.dumps(rep, indent=1))
            (out / "gemm_layout.md").write_text(render_markdown(rep))
    return 0


__all__ = ["DEFAULT_SHAPES", "LAYOUTS", "SHAPES", "VARIANTS", "add_arguments", "render_markdown", "run", "run_case"]
