"""CMP prefix benchmark: each executor mode's full-prefix time vs the stock sequence, the bytes floor,
and the per-mechanism decomposition (serial -> multistream -> + PDL at entry / after prologue / full).

    python -m glm5_fastpath.attn_pre.cmp.bench --out DIR [--ms 1,8,16,32,64,128,256] [--kv-len 8192]

Method, per M (M independent sequences of kv_len context, testing.decode_step):
- `sets` independent copies of the layer weights + decode step (caches included), so one pass over
  the sets touches > 2x L2 where memory allows (bench.timing.plan_rotation, capped at MAX_SETS);
- each mode: one CmpExecutor per set (bucket = M); `launches` prefixes (rotating over the sets) are
  enqueued into ONE CUDA graph (bench.timing.time_launches; each prefix forks to its side streams
  and joins back), replayed; per-prefix time = replay time / launches; median reported;
- stock: SGLang's kernel sequence (bench/stock_prefix.py building blocks: DeepGEMM GEMMs and paged
  MQA logits, cuBLAS bf16 GEMM / bmm, torch.compile'd norm / rope / quant / store / top-k) chained as
  spec/glm5_layer.md section 3.2 runs it, on the main + one alt stream, captured the same way;
- floor: cost.fused_prefix_costs(cfg, M, kv_len) bytes summed, at the copy bandwidth measured in
  this run (and at the 4.27 TB/s constant);
- decomposition: serial -> multistream (branches) -> each PDL wait point; a mode the kernels cannot
  realize (modes.py: entry / prologue need a kernel flag) is recorded "not implemented" with why;
- timeline: one graph replay of the --timeline-modes (default "full", "serial") at the first M, profiled with
  torch.profiler (kernel start / end per stream), drawn as a PNG when matplotlib is installed.
Output: cmp_prefix.json, cmp_prefix.md, cmp_timeline_M<M>.png, cmp_timeline_M<M>.json under --out.
"""
from __future__ import annotations

import argparse
import json
import time
import traceback
from pathlib import Path
from typing import Any, Callable, Sequence

import torch
import torch.nn.functional as F

from ... import cost
from ...config import INDEX_K_PAGE_TOKENS, Glm5Config
from .modes import DECOMPOSITION, MODES, get_mode

PAGE = INDEX_K_PAGE_TOKENS
DEFAULT_MS = (1, 8, 16, 32, 64, 128, 256)
DEFAULT_MODES = ("serial", "serial_pdl", "multistream", "multistream_pdl_entry", "multistream_pdl_prologue", "full")
MAX_SETS = 3


def _log(msg: str) -> None:
    print(f"[cmp-bench {time.strftime('%H:%M:%S')}] {msg}", flush=True)


# ---- data ---------------------------------------------------------------------------------------------------

class _Set:
    """One independent copy of the weights and the decode step (M sequences of kv_len), with a pad page."""

    def __init__(self, cfg: Glm5Config, layer: int, m: int, kv_len: int, seed: int, device: str):
        from ...testing.decode_step import make_decode_step
        from ...weights import random_layer

        self.w = random_layer(cfg, layer, seed=seed, device=device).attn
        self.step = make_decode_step(cfg, [kv_len] * m, seed=seed, device=device, spare_pages=1)
        used = set(self.step.block_table[self.step.block_table >= 0].tolist())
        self.pad_page = min(set(range(self.step.index_k_cache.shape[0])) - used)
        s = self.step
        self.inputs = {"hidden": s.hidden, "residual": s.residual, "positions": s.positions,
                       "out_cache_loc": s.out_cache_loc, "seq_lens": s.seq_lens, "block_table": s.block_table}


class _StockData:
    """The duck-typed data set StockPrefix needs for its building blocks (cfg, device, copy_of)."""

    def __init__(self, cfg: Glm5Config, device: str):
        self.cfg, self.device = cfg, device
        self._copies: dict = {}

    def copy_of(self, key, j, factory):
        if (key, j) not in self._copies:
            self._copies[(key, j)] = factory()
        return self._copies[(key, j)]


class StockChain:
    """SGLang's decode prefix (spec section 3.2) chained on the current (main) stream + one alt stream."""

    def __init__(self, cfg: Glm5Config, device: str):
        from ...bench.stock_prefix import StockPrefix, stock_topk

        self.cfg, self.sp = cfg, StockPrefix(_StockData(cfg, device))
        self.alt = torch.cuda.Stream(device)
        self.reason = "" if self.sp.dg is not None else f"stock needs DeepGEMM: {self.sp.dg_reason}"
        # E2 (step 11): SGLang's fused decode top-k + page-table transform when sgl_kernel has it (what its DSA
        # decode runs); else the compiled torch.topk stand-in, labelled as such (~4x slower: session-8 note)
        self.topk_fused, self.e2 = stock_topk(cfg)

    def bind(self, st: _Set, j: int) -> dict[str, Any]:
        from ...ref.rope import rope_cos_sin

        c, sp, w, s = self.cfg, self.sp, st.w, st.step
        idx = w.indexer
        cos, sin = rope_cos_sin(torch.arange(int(s.positions.max()) + 1, device=s.hidden.device), c.qk_rope_head_dim,
                                c.rope_theta)
        ctx = s.seq_lens.to(torch.int32).view(-1, 1).contiguous()
        from ...bench.stock_prefix import page_table_1

        extra = {}
        if self.topk_fused is not None:  # SGLang's metadata before the indexer runs: not part of the timed chain
            extra = {"sl32": s.seq_lens.to(torch.int32).contiguous(),
                     "pt1": page_table_1(s.block_table, int(s.seq_lens.max())),
                     "cu": torch.arange(s.seq_lens.numel() + 1, dtype=torch.int32, device=s.seq_lens.device)}
        return {**extra, "w": w, "s": s, "cos_sin": torch.cat([cos, sin], -1).contiguous(),
                "qkv_a": sp._fp8_weight("qkv_a", w.qkv_a, j), "wq_b": sp._fp8_weight("wq_b", idx.wq_b, j),
                "q_b": sp._fp8_weight("q_b", w.q_b, j),
                "wk_wp": torch.cat([idx.wk.dequant().to(torch.bfloat16), idx.weights_proj]).contiguous(),
                "ctx": ctx, "meta": sp.dg.get_paged_mqa_logits_metadata(ctx, PAGE, sp.num_sms),
                "bt": s.block_table.to(torch.int32).contiguous(), "max_ctx": int(s.seq_lens.max()),
                "kv4": s.index_k_cache.view(s.index_k_cache.shape[0], PAGE, 1, c.index_head_dim + 4)}

    def _fork(self, a, b):
        ev = torch.cuda.Event()
        ev.record(a)
        b.wait_event(ev)

    def enqueue(self, d: dict[str, Any]) -> tuple:
        c, sp, C = self.cfg, self.sp, self.sp._c
        w, s, cs = d["w"], d["s"], d["cos_sin"]
        main, alt = torch.cuda.current_stream(), self.alt
        q_end, kv_end = c.q_lora_rank, c.q_lora_rank + c.kv_lora_rank
        hi, di, r, nh = c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim, c.num_attention_heads
        x, res = C["add_rmsnorm"](s.hidden, s.residual, w.input_norm, c.rms_norm_eps)  # 1
        x8, xs = sp._quant(x)  # 2
        qkv = sp._gemm(x8, xs, d["qkv_a"], c.qkv_a_out)  # 3
        q_lora, c_kv = C["qkv_a_norms"](qkv, w.q_a_norm, w.kv_a_norm, q_end, kv_end, c.rms_norm_eps)  # 4, 5
        k_pe = qkv[:, kv_end:]
        self._fork(main, alt)
        with torch.cuda.stream(alt):  # 7: indexer Q GEMM on alt
            q8, qs = sp._quant(q_lora)
            qi = sp._gemm(q8, qs, d["wq_b"], hi * di).view(-1, hi, di)
        kw = F.linear(x, d["wk_wp"])  # 6: wk + weights_proj, bf16, main
        self._fork(main, alt)
        with torch.cuda.stream(alt):  # 9: indexer K post + store on alt
            C["indexer_k_post_store"](kw[:, :di], w.indexer.k_norm_weight, w.indexer.k_norm_bias, cs, s.positions,
                                      s.out_cache_loc, s.index_k_cache, r)
        self._fork(alt, main)  # 8 needs 7
        iq8, head_w = C["indexer_q_post"](qi, kw[:, di:], cs, s.positions, r, c.index_weight_scale)  # 8
        self._fork(alt, main)  # 10 needs 9
        self._fork(main, alt)
        with torch.cuda.stream(alt):  # 12: q_b on alt, overlapping 10-11
            q8b, qsb = sp._quant(q_lora)
            q = sp._gemm(q8b, qsb, d["q_b"], nh * c.qk_head_dim).view(-1, nh, c.qk_head_dim)
            q_pe = C["rope_q_pe"](q[..., c.qk_nope_head_dim:], cs, s.positions)
        logits = sp.dg.fp8_paged_mqa_logits(iq8.view(-1, 1, hi, di), d["kv4"], head_w, d["ctx"], d["bt"], d["meta"],
                                            d["max_ctx"], False)  # 10
        if self.topk_fused is not None:  # 11
            if logits.shape[1] != d["pt1"].shape[1]:
                raise RuntimeError(f"stock E2: logits width {logits.shape[1]} != page table width {d['pt1'].shape[1]}")
            topk = self.topk_fused(logits, d["sl32"], d["pt1"], d["cu"], c.index_topk)
        else:
            topk = C["topk_translate"](logits, s.seq_lens, s.block_table, c.index_topk)
        self._fork(alt, main)
        q_lat = torch.bmm(q[..., :c.qk_nope_head_dim].transpose(0, 1), w.w_kc).transpose(0, 1)  # 13
        C["kv_rope_store"](c_kv, k_pe, cs, s.positions, s.kv_cache, s.out_cache_loc)  # 14 (k), 15
        return res, q_pe, q_lat, topk


# ---- timing -------------------------------------------------------------------------------------------------

def _time(fn: Callable[[int], Any], sets: int, device: str, replays: int) -> dict[str, Any]:
    from ...bench.timing import time_launches

    launches = sets * max(1, -(-8 // sets))
    t = time_launches(fn, launches, device=device, replays=replays)
    return t.to_dict()


def _floor(cfg: Glm5Config, m: int, kv_len: int, bw: float) -> dict[str, float]:
    rows = cost.fused_prefix_costs(cfg, m, kv_len)
    b = sum(r.bytes for r in rows)
    return {"bytes": b, "floor_us": b / bw * 1e6, "floor_us_const": cost.floor_us(rows)}


def _executors(cfg, mode: str, sets: list[_Set], m: int, kv_len: int, device: str):
    from .executor import CmpExecutor

    out = []
    for st in sets:
        ex = CmpExecutor(cfg, st.w, device, buckets=(m,), mode=mode, kv_cache=st.step.kv_cache,
                         index_k_cache=st.step.index_k_cache, max_pages=-(-kv_len // PAGE), pad_slot=st.pad_page * PAGE)
        ex.prepare()
        ex.staging.load(st.inputs, m)
        out.append(ex)
    return out


MEGARTP = "megartp"  # the MegaRTP megakernel's row (--executors megartp): the whole prefix, one launch per step
MEGARTP_DYNAMIC = "megartp_dynamic"  # the same, dynamic dispatch (one list the CTAs claim from at run time)
MEGARTP_SCHEDULERS = {MEGARTP: "list", MEGARTP_DYNAMIC: "dynamic"}


def _megartp_runners(cfg, sets: list[_Set], m: int, kv_len: int, device: str, scheduler: str = "list"):
    """Per set: a MegaRtpExecutor on the whole prefix, planned, bound and run once (checked); -> its PlanRunners,
    whose launch(None) takes the epoch from device memory (CUDA-graph capture and replay)."""
    from ...graph import ShapeContext
    from ..megartp.device import MegaRtpExecutor

    ctx = ShapeContext.independent([kv_len] * m)
    out = []
    for st in sets:
        ex = MegaRtpExecutor(cfg, st.w, device, kv_cache=st.step.kv_cache, index_k_cache=st.step.index_k_cache,
                             max_m=m, max_pages=-(-kv_len // PAGE), pad_slot=st.pad_page * PAGE, scheduler=scheduler)
        ex.run(ctx, **st.inputs)
        out.append(ex.runner(ctx))
    return out


def check_modes(modes: Sequence[str]) -> None:
    """Each mode is MEGARTP, a named CMP mode or a composite one (modes.py); else ValueError naming the bad part."""
    for m in modes:
        if m in MEGARTP_SCHEDULERS:
            continue
        try:
            get_mode(m)
        except ValueError as e:
            raise ValueError(f"bench prefix: unknown mode {m!r}: {e}") from None


def _file_safe(mode: str) -> str:
    """A composite mode name (full+after:D1>D0) as a file-name part."""
    return "".join(c if c.isalnum() or c in "_.-" else "_" for c in mode)


def timeline(ex, m: int, inputs: dict, path_json: Path) -> list[dict[str, Any]]:
    """Kernels of one graph replay of `ex` (bucket m), from torch.profiler: name, stream, start, duration (us)."""
    from torch.profiler import ProfilerActivity, profile

    ex.capture(m)  # pads the static inputs: load the step again
    ex.staging.load(inputs, m)
    bk = ex._buckets[m]
    bk.graph.replay()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        bk.graph.replay()
        torch.cuda.synchronize()
    tmp = path_json.with_suffix(".trace.json")
    prof.export_chrome_trace(str(tmp))
    ev = [e for e in json.loads(tmp.read_text()).get("traceEvents", []) if e.get("cat") == "kernel"]
    tmp.unlink(missing_ok=True)
    t0 = min((e["ts"] for e in ev), default=0)
    # grid / smem tell the ops apart where several run one kernel (the FP8 GEMM of B0, B1, D0, D1)
    rows = [{"name": e["name"][:80], "stream": e.get("args", {}).get("stream", e.get("tid")), "start_us": e["ts"] - t0,
             "dur_us": e.get("dur", 0), "grid": e.get("args", {}).get("grid"),
             "smem": e.get("args", {}).get("dynamic shared memory")} for e in ev]
    path_json.write_text(json.dumps(rows, indent=1))
    return rows


def plot_timelines(tl: dict[str, list[dict]], path: Path) -> str | None:
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except Exception:  # noqa: BLE001
        return None
    fig, axes = plt.subplots(len(tl), 1, figsize=(12, 1.6 + 1.2 * len(tl)), squeeze=False)
    for ax, (mode, rows) in zip(axes[:, 0], tl.items()):
        streams = sorted({str(r["stream"]) for r in rows})
        for r in rows:
            y = streams.index(str(r["stream"]))
            ax.broken_barh([(r["start_us"], max(r["dur_us"], 0.05))], (y - 0.4, 0.8))
            ax.text(r["start_us"], y, r["name"][:18], fontsize=5, va="center")
        ax.set_yticks(range(len(streams)), [f"stream {s}" for s in streams])
        ax.set_title(f"{mode}: one replay ({len(rows)} kernels)", fontsize=8)
        ax.set_xlabel("us")
    fig.tight_layout()
    fig.savefig(path, dpi=150)
    plt.close(fig)
    return str(path)


# ---- the benchmark ------------------------------------------------------------------------------------------

def bench_prefix(cfg: Glm5Config, modes: Sequence[str] = DEFAULT_MODES, ms: Sequence[int] = DEFAULT_MS,
                 kv_len: int = 8192, out_dir: str | Path = "benchmarks/results/cmp_prefix", *, device: str = "cuda",
                 replays: int = 30, max_sets: int = MAX_SETS, stock: bool = True, seed: int = 0,
                 timeline_modes: Sequence[str] = ("full", "serial")) -> dict[str, Any]:
    from ...bench.prefix_ops import indexer_layer
    from ...bench.timing import l2_cache_bytes, measure_copy_bandwidth, plan_rotation

    check_modes(modes)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    bw = measure_copy_bandwidth(device)
    layer = indexer_layer(cfg)
    rep: dict[str, Any] = {"config": cfg.source, "kv_len": kv_len, "modes": list(modes), "ms": list(ms),
                           "copy_bandwidth": bw, "device": torch.cuda.get_device_name(device), "rows": [],
                           "timelines": {}}
    chain = StockChain(cfg, device) if stock else None
    for m in ms:
        fl = _floor(cfg, m, kv_len, bw["bytes_per_s"])
        plan = plan_rotation(fl["bytes"], l2_cache_bytes(device), max_sets=max_sets)
        _log(f"M={m}: {plan.sets} sets ({'covers' if plan.covers_l2 else 'does not cover'} 2x L2), floor "
             f"{fl['floor_us']:.1f} us")
        sets = [_Set(cfg, layer, m, kv_len, seed + j, device) for j in range(plan.sets)]
        row: dict[str, Any] = {"M": m, **fl, "sets": plan.sets, "covers_l2": plan.covers_l2, "modes": {}}
        for mode in modes:
            try:
                if mode in MEGARTP_SCHEDULERS:
                    runs = _megartp_runners(cfg, sets, m, kv_len, device, MEGARTP_SCHEDULERS[mode])
                    row["modes"][mode] = _time(lambda i: runs[i % len(runs)].launch(None), len(runs), device, replays)
                    runs = None
                    _log(f"M={m} {mode}: {row['modes'][mode].get('median_us')}")
                    torch.cuda.empty_cache()
                    continue
                exs = _executors(cfg, mode, sets, m, kv_len, device)
                row["modes"][mode] = _time(lambda i: exs[i % len(exs)].enqueue(m), len(exs), device, replays)
                if m == ms[0] and mode in timeline_modes:
                    rep["timelines"][mode] = timeline(exs[0], m, sets[0].inputs,
                                                        out / f"cmp_timeline_M{m}_{_file_safe(mode)}.json")
                exs = None  # free the executors (graphs, buffers) before the next mode
            except NotImplementedError as e:
                row["modes"][mode] = {"not_implemented": str(e)}
            except Exception as e:  # noqa: BLE001 - record and go on
                row["modes"][mode] = {"error": f"{type(e).__name__}: {str(e)[:400]}",
                                      "trace": traceback.format_exc()[-1500:]}
            _log(f"M={m} {mode}: {row['modes'][mode].get('median_us', row['modes'][mode])}")
            torch.cuda.empty_cache()
        if chain is not None:
            if chain.reason:
                row["stock"] = {"skipped": chain.reason}
            else:
                try:
                    bound = [chain.bind(st, j) for j, st in enumerate(sets)]
                    row["stock"] = _time(lambda i: chain.enqueue(bound[i % len(bound)]), len(bound), device, replays)
                    row["stock"]["e2"] = chain.e2
                except Exception as e:  # noqa: BLE001
                    row["stock"] = {"error": f"{type(e).__name__}: {str(e)[:400]}"}
            _log(f"M={m} stock: {row['stock'].get('median_us', row['stock'])}")
        derive_row(row)
        rep["rows"].append(row)
        del sets
        torch.cuda.empty_cache()
        write_report(rep, out, final=False)  # after every M: a run cut short keeps the rows it finished
    if rep["timelines"]:
        rep["timeline_png"] = plot_timelines(rep["timelines"], out / f"cmp_timeline_M{ms[0]}.png")
    write_report(rep, out, final=True)
    _log(f"wrote {out}/cmp_prefix.json, cmp_prefix.md")
    return rep


def write_report(rep: dict[str, Any], out: Path, final: bool) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rep["complete"] = final
    (out / "cmp_prefix.json").write_text(json.dumps(rep, indent=1, default=str))
    (out / "cmp_prefix.md").write_text(render_markdown(rep))


def _med(x: Any) -> float | None:
    return x.get("median_us") if isinstance(x, dict) else None


def derive_row(row: dict[str, Any]) -> None:
    """time / floor, speedup over stock and over serial, and the decomposition steps (us saved per step)."""
    stock = _med(row.get("stock"))
    serial = _med(row["modes"].get("serial"))
    for mode, t in row["modes"].items():
        med = _med(t)
        if med is None:
            continue
        t["time_over_floor"] = med / row["floor_us"]
        t["speedup_vs_stock"] = stock / med if stock else None
        t["speedup_vs_serial"] = serial / med if serial else None
    steps, prev = [], None
    for mode in DECOMPOSITION:
        med = _med(row["modes"].get(mode))
        if med is None:
            continue
        steps.append({"mode": mode, "median_us": med, "saved_us": (prev - med) if prev is not None else None})
        prev = med
    row["decomposition"] = steps


def render_markdown(rep: dict[str, Any]) -> str:
    modes = rep["modes"]
    f = lambda x, p=".2f": "-" if x is None else format(x, p)  # noqa: E731
    lines = [f"# CMP attention prefix ({rep['config']}, KV {rep['kv_len']} per sequence, {rep['device']})", "",
             f"Copy bandwidth {rep['copy_bandwidth']['bytes_per_s'] / 1e12:.2f} TB/s (floors use it). Times: median "
             "per prefix, CUDA-graph replay over rotating weight + cache sets."
             + (f" Each time is the median over {rep['rounds']} rounds (tune.merge_rounds)." if rep.get("rounds") else "")
             + ("" if rep.get("complete", True) else " **Partial: the run stopped before the last M.**"), "",
             "| M | floor us | MB | stock us | " + " | ".join(f"{m} us" for m in modes) + " | best/floor | stock/best |",
             "|---:|---:|---:|---:|" + "---:|" * len(modes) + "---:|---:|"]
    for r in rep["rows"]:
        meds = {m: _med(r["modes"].get(m)) for m in modes}
        ok = [v for v in meds.values() if v is not None]
        best = min(ok) if ok else None
        st = _med(r.get("stock"))
        cells = []
        for m in modes:
            t = r["modes"].get(m, {})
            cells.append(f(meds[m]) if meds[m] is not None else ("n/i" if "not_implemented" in t else "err"))
        lines.append(f"| {r['M']} | {f(r['floor_us'])} | {f(r['bytes'] / 1e6, '.1f')} | {f(st)} | " + " | ".join(cells)
                     + f" | {f(best / r['floor_us'] if best else None)} | {f(st / best if st and best else None)} |")
    e2 = sorted({r["stock"]["e2"] for r in rep["rows"] if isinstance(r.get("stock"), dict) and r["stock"].get("e2")})
    if e2:
        lines += ["", "Stock E2 (top-k, step 11): " + "; ".join(e2) + "."]
    lines += ["", "## Decomposition (each step adds one mechanism; saved = previous - this)", ""]
    for r in rep["rows"]:
        steps = ", ".join(f"{s['mode']} {s['median_us']:.2f}" + (f" (-{s['saved_us']:.2f})" if s["saved_us"] is not None else "")
                          for s in r.get("decomposition", []))
        lines.append(f"- M={r['M']}: {steps}")
    notes = {m: t["not_implemented"] for r in rep["rows"] for m, t in r["modes"].items() if "not_implemented" in t}
    if notes:
        lines += ["", "## Not implemented (n/i)", ""] + [f"- {m}: {v}" for m, v in notes.items()]
    errs = [(r["M"], m, t["error"]) for r in rep["rows"] for m, t in r["modes"].items() if "error" in t]
    errs += [(r["M"], "stock", r["stock"].get("error") or r["stock"].get("skipped")) for r in rep["rows"]
             if isinstance(r.get("stock"), dict) and ("error" in r["stock"] or "skipped" in r["stock"])]
    if errs:
        lines += ["", "## Errors / skipped", ""] + [f"- M={m} {k}: {e}" for m, k, e in errs]
    if rep.get("timeline_png"):
        lines += ["", f"Timeline of one replay: `{Path(rep['timeline_png']).name}`"]
    return "\n".join(lines) + "\n"


# `--executors` of `glm5-fastpath bench prefix`: which rows to run. "cmp" is the whole decomposition
# (every mode after serial); "megartp" the MegaRTP megakernel on the whole prefix (issue #5: the same run and
# the same rotated weight / cache sets as CMP), when the build runs every family the config's prefix needs.
EXECUTOR_MODES = {"serial": ("serial",), "cmp": tuple(m for m in DEFAULT_MODES if m != "serial"), "megartp": (MEGARTP,),
                  "megartp_dynamic": (MEGARTP_DYNAMIC,)}
EXECUTORS = ("stock",) + tuple(EXECUTOR_MODES)


def modes_for_executors(executors: Sequence[str]) -> tuple[list[str], bool]:
    """(modes to run, whether to run the stock sequence) for an --executors list; unknown names raise."""
    modes: list[str] = []
    for e in executors:
        if e not in EXECUTORS:
            raise ValueError(f"bench prefix: unknown executor {e!r}; choose from {', '.join(EXECUTORS)}")
        modes += [m for m in EXECUTOR_MODES.get(e, ()) if m not in modes]
    return modes, "stock" in executors


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="output directory")
    p.add_argument("--config", default="glm5", help="preset name or config.json path")
    p.add_argument("--executors", default=None,
                   help=f"comma list of {', '.join(EXECUTORS)} (default: stock,serial,cmp); overrides --modes")
    p.add_argument("--modes", default=",".join(DEFAULT_MODES),
                   help=f"CMP modes to run: {', '.join(MODES)}, or composites such as full+after:D1>D0+cap:D0=64 "
                        "(attn_pre/cmp/modes.py)")
    p.add_argument("--ms", default=",".join(map(str, DEFAULT_MS)), help="token counts (one bucket each)")
    p.add_argument("--kv-len", type=int, default=8192, help="context length of every sequence")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--max-sets", type=int, default=MAX_SETS, help="cap on rotated weight + cache copies")
    p.add_argument("--no-stock", action="store_true")
    p.add_argument("--timeline-modes", default="full,serial",
                   help="modes whose one replay at the first M is profiled into the timeline ('none': no timeline)")


def run(a: argparse.Namespace) -> int:
    cfg = Glm5Config.preset(a.config) if not a.config.endswith(".json") else Glm5Config.from_file(a.config)
    modes, stock = [m for m in a.modes.split(",") if m], not a.no_stock
    if a.executors:
        modes, stock = modes_for_executors([e for e in a.executors.split(",") if e])
    check_modes(modes)
    tl = [] if a.timeline_modes.strip().lower() in ("", "none") else [m for m in a.timeline_modes.split(",") if m]
    bench_prefix(cfg, modes, [int(x) for x in a.ms.split(",") if x], a.kv_len, a.out,
                 replays=a.replays, max_sets=a.max_sets, stock=stock, timeline_modes=tl)
    return 0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm5_fastpath.attn_pre.cmp.bench", description=__doc__.split("\n")[0])
    add_arguments(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    raise SystemExit(main())
