"""MegaMoE (ours) vs DeepGEMM fp8_mega_moe vs the weight-bytes floor, GLM-5 MoE shapes, one GPU.

Settings (issue #6, shared/anchors.md):
  (a) one EP8 rank's shard: 32 local experts, top-8 over the 32;
  (b) all 256 experts on one GPU (TP1), top-8.
Both with H = 6144, I = 2048, FP8 e4m3 weights with 128x128 block scales, 1x128 activations, uniform
random routing (seeded; the same ids and weights for every implementation).

Columns per token count:
- ours:         glm5_fastpath.moe.mega_moe without the shared expert (the same work DeepGEMM's
                SM90 fp8_mega_moe does: routed experts only), default config of the token bucket;
- ours+shared:  with the fused shared expert (what GLM-5 runs: one more always-selected expert);
- deepgemm:     deep_gemm.fp8_mega_moe (sgl-deep-gemm) on a single-rank group, when importable;
- dg masked:    the DeepGEMM masked grouped-GEMM pipeline SGLang runs with DeepEP low-latency dispatch
                (bench/moe_masked.py): FC1 masked GEMM -> SwiGLU + requant -> FC2 masked GEMM, routed experts,
                dispatch and combine outside the timed region (a lower bound for that path);
- floor:        experts touched x 37.75 MB / 4.27 TB/s (ours+shared: touched + 1); ratios to it.
Method: glm5_fastpath.bench.timing.time_launches: K launches captured in one CUDA graph, replayed,
median per launch. The expert weights touched per launch (>= 8 x 37.75 MB = 302 MB) are far past 2x
L2 (50 MB), so every replay streams them from HBM; activations are tiny. The plan kernel (token
lists + task list) is inside our time; DeepGEMM's input copy into its symmetric buffer is not
(it is part of its dispatch, done before the timed call, as in DeepGEMM's own benchmarks).

Writes <out>/megamoe_bench.json, <out>/megamoe_bench.md and <out>/megamoe_bench.png (time / floor per
token count and setting, when matplotlib imports).

    glm5-fastpath bench moe --out benchmarks/results/megamoe
    glm5-fastpath bench moe --settings a --tokens 1,8,64 --out /tmp/mm --no-deepgemm
    (benchmarks/megamoe_bench.py is the same, for scripts/gpu_check.sh)
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime as _dt
import json
import os
import sys
import traceback
from pathlib import Path

import torch

from ..moe import megamoe as MM
from ..ref.fp8 import quant_act_per_token, quant_weight_block
from ..testing.numerics import rel_err
from .meta import git_commit
from .timing import measure_copy_bandwidth, time_launches

BW_FLOOR = 4.27e12
H, I, TOPK, RSF = 6144, 2048, 8, 2.5
EXPERT_BYTES = 3 * H * I  # 37.75 MB of FP8 weights per expert (scales: +0.03 %)
FP8 = torch.float8_e4m3fn
SETTINGS = {"a": 32, "b": 256}
DEFAULT_TOKENS = "1,2,4,8,16,32,64,128,256,512,1024,2048,4096"


# ---- data -----------------------------------------------------------------------------------------------

def make_weights(n: int, seed: int, dev: torch.device):
    """n experts (stacked checkpoint layout) generated and quantised on the GPU, one at a time."""
    g = torch.Generator(device=dev).manual_seed(seed)
    w13 = torch.empty(n, 2 * I, H, dtype=FP8, device=dev)
    s13 = torch.empty(n, 2 * I // 128, H // 128, dtype=torch.float32, device=dev)
    w2 = torch.empty(n, H, I, dtype=FP8, device=dev)
    s2 = torch.empty(n, H // 128, I // 128, dtype=torch.float32, device=dev)
    for e in range(n):
        w13[e], s13[e] = quant_weight_block(torch.randn(2 * I, H, generator=g, device=dev) * 0.02)
        w2[e], s2[e] = quant_weight_block(torch.randn(H, I, generator=g, device=dev) * 0.02)
    return w13, s13, w2, s2


def make_inputs(m: int, experts: int, seed: int, dev: torch.device):
    g = torch.Generator(device=dev).manual_seed(seed)
    h = torch.randn(m, H, generator=g, device=dev).to(torch.bfloat16)
    x8, xs = quant_act_per_token(h)
    ids = torch.argsort(torch.rand(m, experts, generator=g, device=dev), dim=1)[:, :TOPK].to(torch.int32)
    w = torch.rand(m, TOPK, generator=g, device=dev) + 0.05
    return x8, xs, ids, (w / w.sum(-1, keepdim=True)).float()


# ---- DeepGEMM --------------------------------------------------------------------------------------------

class DeepGemmMegaMoE:
    """deep_gemm.fp8_mega_moe on a single-rank process group.

    TODO(verify on the H200): the call sequence is inferred from public DeepGEMM / SGLang sources of
    several versions, not read from the installed sgl-deep-gemm 0.1.3:
      buf = get_symm_buffer_for_sm90_mega_moe(group, E, max_tokens, k, H, I)   (or get_symm_buffer_for_mega_moe)
      l1, l2 = transform_weights_for_mega_moe_sm90((w13, s13), (w2, s2))       (gate/up interleave by 8)
      buf.x[:M], buf.x_sf[:M], buf.topk_idx[:M], buf.topk_weights[:M] <- inputs (rows past M: idx -1)
      fp8_mega_moe(y[M, H], l1, l2, buf, recipe=(128, 128, 128), activation="swiglu",
                   activation_clamp=None, fast_math=True)
    Any failure is reported in the results ("deepgemm_error") instead of aborting the benchmark.
    NOTE: DeepGEMM's SM90 kernel quantises the FC2 input per 64 channels (ours and SGLang's reference:
    per 128), so its output differs from ours by FP8 noise (rel_err ~ 2-3e-2 is expected).
    """

    def __init__(self, experts: int, max_tokens: int, weights, dev: torch.device):
        import deep_gemm  # noqa: F401 - ImportError is reported by the caller
        import torch.distributed as dist
        self.dg = deep_gemm
        if not hasattr(deep_gemm, "fp8_mega_moe"):
            raise RuntimeError(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} has no fp8_mega_moe")
        if not dist.is_initialized():
            os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
            os.environ.setdefault("MASTER_PORT", "29533")
            dist.init_process_group("nccl", rank=0, world_size=1, device_id=dev)
        self.group = dist.group.WORLD
        get_buf = getattr(deep_gemm, "get_symm_buffer_for_sm90_mega_moe", None) or deep_gemm.get_symm_buffer_for_mega_moe
        self.buf = get_buf(self.group, experts, max_tokens, TOPK, H, I)
        w13, s13, w2, s2 = weights
        tr = getattr(deep_gemm, "transform_weights_for_mega_moe_sm90", None)
        if tr is not None:
            self.l1, self.l2 = tr((w13, s13), (w2, s2))
        else:  # same interleave as ours ([g0..7, u0..7, ...]); SM90 scale factors are used as they are
            self.l1, self.l2 = (MM.interleave_gate_up(w13), s13), (w2, s2)

    def load(self, x8, xs, ids, wts) -> None:
        m = x8.shape[0]
        b = self.buf
        b.x[:m].copy_(x8)
        b.x_sf[:m].copy_(xs.to(b.x_sf.dtype))
        b.topk_idx[:m].copy_(ids.to(b.topk_idx.dtype))
        b.topk_idx[m:].fill_(-1)
        b.topk_weights[:m].copy_(wts.to(b.topk_weights.dtype))

    def __call__(self, y: torch.Tensor) -> torch.Tensor:
        self.dg.fp8_mega_moe(y, self.l1, self.l2, self.buf, recipe=(128, 128, 128), activation="swiglu",
                             activation_clamp=None, fast_math=True)
        return y


# ---- main -----------------------------------------------------------------------------------------------

def floor_us(touched: int) -> float:
    return touched * EXPERT_BYTES / BW_FLOOR * 1e6


def run_setting(name: str, experts: int, tokens: list[int], args, dev: torch.device) -> list[dict]:
    print(f"setting ({name}): {experts} experts (+1 shared), generating weights ...", flush=True)
    raw = make_weights(experts + 1, seed=experts, dev=dev)
    shared = MM.prepare_weights(*raw, num_shared=1)  # routed experts first, the shared expert last
    routed = MM.MegaMoEWeights(shared.w13[:experts], shared.w13_scale[:experts], shared.w2[:experts],
                               shared.w2_scale[:experts], experts, 0)  # views: the same bytes without the shared expert
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    extra = _extra_configs(args)
    dg, dg_error = None, ""
    masked_gemm, masked_error, act, act_name, input_sf = None, "", None, "", None
    if not args.no_deepgemm:
        from . import moe_masked as MK
        try:
            masked_gemm = MK.deepgemm_masked_gemm()
            act, act_name = MK.sglang_act()
            input_sf = MK.deepgemm_input_sf()
        except Exception as e:  # noqa: BLE001 - reported, the rest of the benchmark still runs
            masked_error = f"{type(e).__name__}: {e}"
        try:
            dg = DeepGemmMegaMoE(experts, max(tokens), tuple(t[:experts] for t in raw), dev)
        except Exception as e:  # noqa: BLE001 - reported, the rest of the benchmark still runs
            dg_error = f"{type(e).__name__}: {e}"
            print(f"  deepgemm unavailable: {dg_error}", flush=True)
    rows = []
    for m in tokens:
        x8, xs, ids, wts = make_inputs(m, experts, seed=1000 + m, dev=dev)
        touched = int(torch.unique(ids).numel())
        row = {"tokens": m, "experts_touched": touched, "floor_us": floor_us(touched),
               "floor_shared_us": floor_us(touched + 1)}
        default = {w.num_shared: MM.default_config(m, experts, TOPK, w.num_shared, sms) for w in (routed, shared)}
        variants = [("ours", routed, default[0]), ("ours_shared", shared, default[1])]
        if getattr(args, "lean_fences", False):  # both fence builds of ours + shared (megamoe.cuh, kLeanFences)
            variants += [(f"ours_shared_{n}", shared, dataclasses.replace(default[1], lean_fences=lf))
                         for n, lf in (("fenced", False), ("lean", True))]
        # --configs: the routed experts again with each named config (an A/B in the same run, same inputs)
        variants += [(f"ours@{c.name}", routed, c) for c in extra]
        for key, wt, cfg in variants:
            try:
                MM.precompile(wt, TOPK, max_tokens=m, device=dev, configs=[cfg])
                t = time_launches(lambda i: MM.mega_moe(x8, xs, ids, wts, wt, routed_scaling_factor=RSF, config=cfg),
                                  args.launches, device=dev, replays=args.replays)
                row[key] = {"median_us": t.median_us, "min_us": t.min_us, "method": t.method, "config": cfg.name,
                            "note": t.note}
            except Exception as e:  # noqa: BLE001
                row[key] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
        if dg is not None:
            try:
                dg.load(x8, xs, ids, wts)
                y = torch.empty(m, H, dtype=torch.bfloat16, device=dev)
                t = time_launches(lambda i: dg(y), args.launches, device=dev, replays=args.replays)
                row["deepgemm"] = {"median_us": t.median_us, "min_us": t.min_us, "method": t.method, "note": t.note}
                ours = MM.mega_moe(x8, xs, ids, wts, routed, routed_scaling_factor=1.0)
                torch.cuda.synchronize(dev)
                row["deepgemm"]["rel_err_vs_ours_rsf1"] = rel_err(dg(y), ours)
            except Exception as e:  # noqa: BLE001
                row["deepgemm"] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
        elif dg_error:
            row["deepgemm"] = {"error": dg_error}
        if masked_gemm is not None:
            try:
                pipe = MK.MaskedPipeline(tuple(t[:experts] for t in raw), masked_gemm, act, act_name, input_sf)
                lay = pipe.prepare(x8, xs, ids)
                t = time_launches(lambda i: pipe(), args.launches, device=dev, replays=args.replays)
                row["deepgemm_masked"] = {"median_us": t.median_us, "min_us": t.min_us, "method": t.method,
                                          "note": t.note, "act": act_name, "max_m": lay.max_m,
                                          "expected_m": lay.expected_m, "input_sf_mn_major": input_sf is not None}
                pipe()
                got = pipe.output(wts, m)
                ours = MM.mega_moe(x8, xs, ids, wts, routed, routed_scaling_factor=1.0)
                torch.cuda.synchronize(dev)
                row["deepgemm_masked"]["rel_err_vs_ours_rsf1"] = rel_err(got, ours)
                pipe = None
            except Exception as e:  # noqa: BLE001
                row["deepgemm_masked"] = {"error": f"{type(e).__name__}: {e}"}
                traceback.print_exc()
        elif masked_error:
            row["deepgemm_masked"] = {"error": masked_error}
        # where the persistent kernel's time goes (trace build, one launch): the default config, then each --configs one
        for cfg in ([default[1]] + extra) if getattr(args, "trace", False) else []:
            key = "ours_shared_trace" + (f"@{cfg.name}" if cfg is not default[1] else "")
            try:
                tr = MM.trace_run(x8, xs, ids, wts, shared, config=cfg, routed_scaling_factor=RSF, cap=4096)
                row[key] = tr["summary"]
                print(f"  M={m:5d} trace {cfg.name}: {MM.trace_markdown(tr['summary'])}", flush=True)
                if m <= getattr(args, "trace_save_max_tokens", 0):  # raw rows, trimmed to the used depth
                    used = int((tr["rows"][..., 0] > 0).sum(dim=1).max())
                    d = Path(args.out) / "trace_rows"
                    d.mkdir(parents=True, exist_ok=True)
                    torch.save({"rows": tr["rows"][:, :max(used, 1)].clone(), "columns": MM.TRACE_COLUMNS,
                                "config": tr["config"], "setting": name, "tokens": m},
                               d / f"{name}_M{m}{'_' + cfg.name if cfg is not default[1] else ''}.pt")
            except Exception as e:  # noqa: BLE001 - a diagnostic: the timings above stand
                row[key] = {"error": f"{type(e).__name__}: {str(e)[:300]}"}
                traceback.print_exc()
        o, osh, d, dm = (row.get(k, {}).get("median_us")
                         for k in ("ours", "ours_shared", "deepgemm", "deepgemm_masked"))
        if dm:
            row["deepgemm_masked_vs_floor"] = dm / row["floor_us"]
            if o:
                row["speedup_vs_deepgemm_masked"] = dm / o
        if o:
            row["ours_vs_floor"] = o / row["floor_us"]
        if osh:
            row["ours_shared_vs_floor"] = osh / row["floor_shared_us"]
        if o and d:
            row["deepgemm_vs_floor"] = d / row["floor_us"]
            row["speedup_vs_deepgemm"] = d / o
        print(f"  M={m:5d} touched={touched:3d} floor={row['floor_us']:8.1f} us  ours={o or float('nan'):8.1f}  "
              f"ours+shared={osh or float('nan'):8.1f}  deepgemm={d or float('nan'):8.1f}  "
              f"dg-masked={dm or float('nan'):8.1f}", flush=True)
        rows.append(row)
    raw = routed = shared = dg = None  # free this setting's weights before the next
    torch.cuda.empty_cache()
    return rows


def _extra_configs(args) -> list:
    """--configs as validated MegaMoEConfigs (run() calls this first: a typo fails before any GPU work)."""
    return [MM.MegaMoEConfig.from_name(c.strip()).validate()
            for c in (getattr(args, "configs", None) or "").split(",") if c.strip()]


def markdown(result: dict) -> str:
    lines = [f"# MegaMoE benchmark ({result['gpu']}, {result['date']}, commit {result['commit']})", "",
             "Median of CUDA-graph replays per launch; floor = experts touched x 37.75 MB / 4.27 TB/s "
             f"(measured copy bandwidth this run: {result['copy_bandwidth_tb_s']:.2f} TB/s). "
             "ours / deepgemm: routed experts only (same work); ours+shared: with the fused shared expert "
             "(floor + 1 expert).", ""]
    for name, rows in result["settings"].items():
        lines += [f"## Setting ({name}): {SETTINGS[name]} experts, top-{TOPK}", "",
                  "| tokens | touched | floor us | ours us | ours/floor | deepgemm us | dg/floor | speedup vs dg | "
                  "dg masked us | masked/floor | speedup vs masked | ours+shared us | (+shared)/floor |",
                  "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
        for r in rows:
            def g(k, f="{:.1f}"):
                v = r.get(k, {}).get("median_us") if isinstance(r.get(k), dict) else r.get(k)
                return f.format(v) if isinstance(v, (int, float)) else (r.get(k, {}).get("error", "-")[:40]
                                                                        if isinstance(r.get(k), dict) else "-")
            lines.append(f"| {r['tokens']} | {r['experts_touched']} | {r['floor_us']:.1f} | {g('ours')} | "
                         f"{g('ours_vs_floor', '{:.3f}')} | {g('deepgemm')} | {g('deepgemm_vs_floor', '{:.3f}')} | "
                         f"{g('speedup_vs_deepgemm', '{:.2f}x')} | {g('deepgemm_masked')} | "
                         f"{g('deepgemm_masked_vs_floor', '{:.3f}')} | {g('speedup_vs_deepgemm_masked', '{:.2f}x')} | "
                         f"{g('ours_shared')} | {g('ours_shared_vs_floor', '{:.3f}')} |")
        lines.append("")
    lean = [(name, r) for name, rows in result["settings"].items() for r in rows if r.get("ours_shared_lean")]
    if lean:
        lines += ["## Fence builds (ours + shared; MegaMoEConfig.lean_fences, on in default_config)", "",
                  "| setting | tokens | fenced us | lean us | fenced / lean |", "|---|---|---|---|---|"]
        for name, r in lean:
            a, b = (r.get(k, {}).get("median_us") for k in ("ours_shared_fenced", "ours_shared_lean"))
            lines.append(f"| {name} | {r['tokens']} | {a if a is None else f'{a:.1f}'} | "
                         f"{b if b is None else f'{b:.1f}'} | {f'{a / b:.3f}' if a and b else '-'} |")
        lines.append("")
    extra = [(name, r, k) for name, rows in result["settings"].items() for r in rows for k in r if k.startswith("ours@")]
    if extra:
        lines += ["## Other configs (routed experts, same inputs and run; bench moe --configs)", "",
                  "| setting | tokens | config | us | / floor | default config | default us | default / this |",
                  "|---|---|---|---|---|---|---|---|"]
        for name, r, k in extra:
            v, o = r[k].get("median_us"), r.get("ours", {}).get("median_us")
            lines.append(f"| {name} | {r['tokens']} | {k[5:]} | " + (f"{v:.1f} | {v / r['floor_us']:.3f}" if v else
                         f"{r[k].get('error', '-')[:60]} | -") + f" | {r.get('ours', {}).get('config', '-')} | "
                         + (f"{o:.1f} | {o / v:.3f} |" if v and o else "- | - |"))
        lines.append("")
    traced = [(name, r, k) for name, rows in result["settings"].items() for r in rows for k in r
              if k.startswith("ours_shared_trace")]
    if traced:
        lines += ["## Where the time goes (trace build, ours + shared, one launch each)", ""]
        for name, r, k in traced:
            t = r[k]
            lines.append(f"- ({name}) {r['tokens']} tokens{' ' + k.split('@')[1] if '@' in k else ''}: "
                         + (t["error"] if "error" in t else MM.trace_markdown(t)))
        lines.append("")
    acts = sorted({r["deepgemm_masked"]["act"] for rows in result["settings"].values() for r in rows
                   if isinstance(r.get("deepgemm_masked"), dict) and r["deepgemm_masked"].get("act")})
    if acts:
        lines += [f"dg masked: FC1 / FC2 deep_gemm masked grouped GEMMs + activation by {', '.join(acts)}; dispatch "
                  "and combine outside the timed region (a lower bound for that path).", ""]
    return "\n".join(lines)


def write_plot(result: dict, path: Path) -> bool:
    """time / weight-bytes floor vs token count, one panel per setting: ours, ours+shared, DeepGEMM
    fp8_mega_moe, DeepGEMM masked pipeline. False when matplotlib does not import."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001 - the plot is optional
        return False
    names = list(result["settings"])
    fig, axes = plt.subplots(1, max(1, len(names)), figsize=(6 * max(1, len(names)), 4), squeeze=False)
    series = (("ours_vs_floor", "ours"), ("ours_shared_vs_floor", "ours + shared"),
              ("deepgemm_vs_floor", "DeepGEMM fp8_mega_moe"), ("deepgemm_masked_vs_floor", "DeepGEMM masked pipeline"))
    for ax, name in zip(axes[0], names):
        rows = result["settings"][name]
        for key, label in series:
            pts = [(r["tokens"], r[key]) for r in rows if isinstance(r.get(key), (int, float))]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", label=label)
        ax.axhline(1.0, color="grey", ls="--", lw=1)
        ax.axhline(1.1, color="grey", ls=":", lw=1)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("tokens")
        ax.set_ylabel("time / weight-bytes floor")
        ax.set_title(f"setting ({name}): {SETTINGS.get(name, '?')} experts, top-{TOPK}")
        ax.legend(fontsize=8)
    fig.suptitle(f"MegaMoE vs DeepGEMM ({result.get('gpu')}, {result.get('date')}, {result.get('commit')})")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


def add_arguments(ap: argparse.ArgumentParser) -> None:
    ap.add_argument("--out", required=True, help="directory for the JSON and markdown results")
    ap.add_argument("--settings", default="a,b", help="comma list of a (32 experts) and b (256 experts)")
    ap.add_argument("--tokens", default=DEFAULT_TOKENS, help=f"comma list of token counts (default {DEFAULT_TOKENS})")
    ap.add_argument("--launches", type=int, default=10, help="launches per captured graph")
    ap.add_argument("--replays", type=int, default=10, help="graph replays (median reported)")
    ap.add_argument("--no-deepgemm", action="store_true", help="skip the DeepGEMM baseline")
    ap.add_argument("--configs", default="",
                    help="comma list of extra MegaMoE config names (e.g. bn32_s6_g512_w0_lf,bn64_s4_g512_w0_lf) also timed "
                         "on the routed experts in the same run (columns ours@NAME); spell every field: a bare bn<N> means "
                         "split_waves 4 and the fenced build, which the default config may not use")
    ap.add_argument("--trace", action="store_true",
                    help="also run MegaMoE's trace build once per token count: first-stage wait / MMA / epilogue "
                         "shares per FC1 / FC2 task, fc1_done spins, tail (docs/megamoe_large_m.md)")
    ap.add_argument("--lean-fences", action="store_true",
                    help="also time both fence builds of ours + shared (columns ours_shared_fenced / "
                         "ours_shared_lean; MegaMoEConfig.lean_fences, which default_config turns on)")
    ap.add_argument("--trace-save-max-tokens", type=int, default=128,
                    help="with --trace: also save the raw trace rows (OUT/trace_rows/<setting>_M<tokens>.pt, "
                         "megamoe.TRACE_COLUMNS) for token counts up to this")
    # --ep N (issue #8): expert parallelism over N GPUs, a separate harness (glm5_fastpath/moe/ep/bench.py)
    from ..moe.ep.bench import add_ep_arguments
    add_ep_arguments(ap)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_arguments(ap)
    return run(ap.parse_args(argv))


def run(args: argparse.Namespace) -> int:
    if getattr(args, "ep", 1) > 1 or getattr(args, "ep_bench", False):  # the EP bench (moe/ep/bench.py), its own options
        from ..moe.ep.bench import run_ep
        return run_ep(args)
    bad = [s for s in args.settings.split(",") if s and s not in SETTINGS]
    if bad:
        raise ValueError(f"bench moe: unknown setting(s) {bad}; choose from {', '.join(SETTINGS)}")
    _extra_configs(args)  # --configs names parse and validate before any GPU work
    if not torch.cuda.is_available():
        raise ValueError("bench moe: needs a CUDA GPU (sm_90)")
    dev = torch.device("cuda", torch.cuda.current_device())
    tokens = [int(t) for t in args.tokens.split(",") if t]
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    bw = measure_copy_bandwidth(dev)
    result = {"gpu": torch.cuda.get_device_name(dev), "date": _dt.date.today().isoformat(), "commit": git_commit(),
              "torch": torch.__version__, "copy_bandwidth_tb_s": bw["bytes_per_s"] / 1e12, "floor_bw": BW_FLOOR,
              "hidden": H, "inter": I, "topk": TOPK, "settings": {}}
    try:
        import deep_gemm
        result["deep_gemm_version"] = getattr(deep_gemm, "__version__", "unknown")
    except Exception as e:  # noqa: BLE001
        result["deep_gemm_version"] = f"not importable: {type(e).__name__}: {e}"
    for s in args.settings.split(","):
        result["settings"][s] = run_setting(s, SETTINGS[s], tokens, args, dev)
        (out / "megamoe_bench.json").write_text(json.dumps(result, indent=1))
        (out / "megamoe_bench.md").write_text(markdown(result))
        write_plot(result, out / "megamoe_bench.png")
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
