"""`glm5-fastpath bench gemm-phases`: where one skinny FP8 GEMM launch spends its time, per CTA.

Why: on the H200 each prefix GEMM spends ~3.5-5 us beyond streaming its weights (Nsight Compute, 2026-11-30
session 16: QKV-A 9.4 us for 16 MB), and the prefix pays that on its critical path several times. This runs the
GLM5_SKINNY_PHASES build of the wgmma kernel (ops.fp8_gemm.phase_build), whose thread 0 of every CTA records
%globaltimer at: entry, past griddepcontrol.wait, first stage landed, K loop done, split-K finish done, epilogue
done (csrc/attn_pre/fp8_gemm_wgmma.cu), and summarises one launch:
  launch spread  last CTA entry - first CTA entry (how long the grid takes to start)
  first byte     past_wait -> first stage landed (the ring's first TMA round trip), median / max over CTAs
  stream         first stage -> K loop done (the rest of the split's weights), median / max
  finish         K loop done -> split-K finish done (cluster / global reduce), median / max
  epilogue       finish -> epilogue done, over the CTAs that run it
  span           first entry -> last mark of any CTA
next to the same launch's CUDA-event time with the normal build (median of back-to-back launches, caches
flushed before each measured launch). The phase build's output is checked bitwise against the normal build.
Output: OUT/gemm_phases.json, OUT/gemm_phases.md.
"""
from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Any, Mapping, Sequence

# (name, N, K): the prefix's three large FP8 GEMMs (plain epilogue)
SHAPES = (("qkv_a", 2624, 6144), ("index_q", 4096, 2048), ("q_b", 16384, 2048))
DEFAULT_TOKENS = (1, 16, 64)
NAMES = ("entry", "past_wait", "first_stage", "k_loop_done", "finish_done", "epilogue_done")


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for gemm_phases.json / .md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts")
    p.add_argument("--shapes", default=",".join(s[0] for s in SHAPES), help="comma list of " +
                   ", ".join(s[0] for s in SHAPES))
    p.add_argument("--launches", type=int, default=5, help="phase-build launches summarised per case (median)")
    p.add_argument("--layouts", default="row", help="comma list of weight layouts: row (row-major [N, K]), kb "
                                                   "(k-block-major, ops.fp8_gemm.kblock_major)")


def summarize(ph: Sequence[Sequence[int]]) -> dict[str, float]:
    """One launch's phase rows ([ctas][8] ns; 0 = mark not reached) -> the module doc's quantities in us."""
    rows = [list(r) for r in ph if r[0] > 0]
    if not rows:
        raise ValueError("gemm_phases: no CTA recorded its entry mark")
    t0 = min(r[0] for r in rows)

    def deltas(a: int, b: int) -> list[float]:
        return [(r[b] - r[a]) / 1e3 for r in rows if r[a] > 0 and r[b] > 0]

    def med_max(xs: list[float]) -> tuple[float | None, float | None]:
        return (statistics.median(xs), max(xs)) if xs else (None, None)

    out: dict[str, Any] = {"ctas": len(rows), "sms": len({r[7] for r in rows}),
                           "launch_spread_us": (max(r[0] for r in rows) - t0) / 1e3,
                           "span_us": (max(max(r[:6]) for r in rows) - t0) / 1e3}
    for name, (a, b) in (("wait", (0, 1)), ("first_byte", (1, 2)), ("stream", (2, 3)), ("finish", (3, 4)),
                         ("epilogue", (4, 5))):
        out[f"{name}_med_us"], out[f"{name}_max_us"] = med_max(deltas(a, b))
    # when the last CTA's K loop ended, relative to the first entry: the streaming part of the span
    out["last_k_loop_done_us"] = (max(r[3] for r in rows) - t0) / 1e3
    return out


def median_summary(sums: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """Per key, the median over launches (None where every launch had None)."""
    out: dict[str, Any] = {}
    for k in sums[0]:
        vals = [s[k] for s in sums if s.get(k) is not None]
        out[k] = statistics.median(vals) if vals else None
    return out


def run_case(name: str, n: int, k: int, m: int, launches: int, dev: str = "cuda", layout: str = "row") -> dict[str, Any]:
    import torch

    from ..ops import fp8_gemm as F
    from ..weights import Fp8Linear
    from .gemm_inputs import flush_l2, fp8_gemm_bytes, random_fp8_act, random_fp8_linear

    if layout not in ("row", "kb"):
        raise ValueError(f"bench gemm-phases: layout {layout!r}: expected row or kb")
    g = torch.Generator(device=dev).manual_seed(m * 7919 + n)
    row = random_fp8_linear(n, k, g, dev)
    x8, xs = random_fp8_act(m, k, g, dev)
    ref = F.fp8_gemm_skinny(x8, xs, row, pdl=False)
    lin = Fp8Linear(F.kblock_major(row.weight), row.scale_inv) if layout == "kb" else row
    cfg = F._with_layout(F.EPI_PLAIN, F.config_for(m, n, k), lin.weight)  # the config the op launches
    times = []
    for _ in range(launches):
        flush_l2(dev)
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        # the GPU busy past the host's op dispatch: the events time the kernel, not the Python call (session 17's
        # first run recorded 77-273 us here without it)
        torch.cuda._sleep(2_000_000)
        e0.record()
        F.fp8_gemm_skinny(x8, xs, lin, pdl=False)
        e1.record()
        torch.cuda.synchronize()
        times.append(e0.elapsed_time(e1) * 1e3)
    sums = []
    with F.phase_build():
        y = F.fp8_gemm_skinny(x8, xs, lin, pdl=False)  # compile / load, and the bitwise check
        torch.cuda.synchronize()
        same = bool(torch.equal(y.view(torch.int16), ref.view(torch.int16)))
        for _ in range(launches):
            F.reset_phases(cfg)
            flush_l2(dev)
            F.fp8_gemm_skinny(x8, xs, lin, pdl=False)
            torch.cuda.synchronize()
            sums.append(summarize(F.read_phases(cfg).cpu().tolist()))
    mb = fp8_gemm_bytes(m, n, k) / 1e6
    return {"name": name, "layout": layout, "N": n, "K": k, "M": m, "config": cfg.describe(), "mb": mb,
            "event_us": statistics.median(times), "phase_build_equal": same, **median_summary(sums)}


def render_markdown(rep: Mapping[str, Any]) -> str:
    f = lambda x: "-" if x is None else f"{x:.2f}"  # noqa: E731
    lines = [f"# Skinny FP8 GEMM phases ({rep['device']}, {rep['date']}, commit {rep['commit']})", "",
             "One launch, caches flushed, PDL off; per-CTA %globaltimer marks (bench/gemm_phases.py). us; med / max "
             "over CTAs; median of the launches.", "",
             "| GEMM | layout | M | MB | CTAs | event us | spread | wait | first byte | stream | finish | epilogue | last K loop "
             "| span | bitwise |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]
    for r in rep["rows"]:
        lines.append(f"| {r['name']} | {r.get('layout', 'row')} | {r['M']} | {r['mb']:.1f} | {r['ctas']:.0f} | {f(r['event_us'])} | "
                     f"{f(r['launch_spread_us'])} | {f(r['wait_med_us'])} | {f(r['first_byte_med_us'])} / "
                     f"{f(r['first_byte_max_us'])} | {f(r['stream_med_us'])} / {f(r['stream_max_us'])} | "
                     f"{f(r['finish_med_us'])} / {f(r['finish_max_us'])} | {f(r['epilogue_med_us'])} | "
                     f"{f(r['last_k_loop_done_us'])} | {f(r['span_us'])} | {'yes' if r['phase_build_equal'] else 'NO'} |")
    return "\n".join(lines) + "\n"


def run(a: argparse.Namespace) -> int:
    import datetime
    import os

    import torch

    if not torch.cuda.is_available():
        raise ValueError("bench gemm-phases times the wgmma kernel: it needs a CUDA GPU (sm_90)")
    shapes = {s[0]: s for s in SHAPES}
    want = [x for x in a.shapes.split(",") if x]
    bad = [x for x in want if x not in shapes]
    if bad:
        raise ValueError(f"bench gemm-phases: unknown shape(s) {bad}; choose from {', '.join(shapes)}")
    tokens = sorted({int(x) for x in a.tokens.split(",") if x})
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rep: dict[str, Any] = {"device": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(),
                           "commit": os.environ.get("GLM5_FASTPATH_COMMIT", "unknown"), "rows": []}
    layouts = [x for x in a.layouts.split(",") if x]
    if not layouts or any(x not in ("row", "kb") for x in layouts):
        raise ValueError(f"bench gemm-phases: --layouts {a.layouts!r}: choose from row, kb")
    for s in want:
        name, n, k = shapes[s]
        for m in tokens:
            for lay in layouts:
                rep["rows"].append(run_case(name, n, k, m, a.launches, layout=lay))
                print(render_markdown(rep).splitlines()[-1], flush=True)
                (out / "gemm_phases.json").write_text(json.dumps(rep, indent=1))
                (out / "gemm_phases.md").write_text(render_markdown(rep))
    return 0
