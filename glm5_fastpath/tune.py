"""`glm5-fastpath tune`: measure the prefix executors and the MoE per token bucket on this GPU and write a
selection table.

Prefix: for every bucket M it runs the CMP benchmark (attn_pre/cmp/bench.py: each CMP mode and SGLang's
stock kernel sequence, captured as CUDA graphs, inputs rotated past L2, median of replays) and picks, per
bucket, the fastest of: stock, and CMP in its fastest mode. A CMP mode has to beat stock by `min_gain`
(default 3 %) to be chosen: a tie within timing noise keeps SGLang's own path. MegaRTP is not a
candidate until its device kernel exists (issue #5).

MoE (`--moe auto`, the default; issue #7): per bucket M, MegaMoE (moe.megamoe.mega_moe over
prepare_weights' zero-copy view of GLM-5-shaped synthetic experts: 256 routed + 1 shared, H 6144, I 2048,
top-8, bench/moe.py's weights and uniform random routing) in a few candidate configs (`moe_candidates`),
each checked against the bucket's default config before it is timed, against the stock MoE SGLang would
run (`STOCK_KINDS`: SGLang's Triton fused MoE when importable, else DeepGEMM fp8_mega_moe, else none).
The fastest candidate is written as "megamoe:<config name>" when it beats stock by more than
`--moe-margin` (default 3 %), else "stock" (`choose_moe`). Without any stock timing the MoE stays "stock"
unless `--moe-without-stock` is given. `--moe off` is the prefix-only tune of before: MoE column "stock",
no MoE report.

The table goes to --out (a JSON file for `--glm5-fastpath-config`); the measured report goes next to it
(table.json -> table/: cmp_prefix.{json,md}, and with --moe auto moe_tune.{json,md}), so every choice can
be traced to the numbers that made it.

Module-level imports stay light (stdlib + selection): the CLI parser imports this module; torch, the
kernels and SGLang are imported only when a tune runs.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
import math
import time
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

from . import selection
from .selection import SCHEMA_VERSION, STOCK, parse

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
# candidates per bucket (the _prio modes: launch priorities for the indexer branch; chosen only where measured faster)
# + pin:D1=0 (D1 as B0's same-stream PDL consumer, its weights prefetched during B0) and after:D1>D0 (D0 waits for D1):
# on the H200 full+pin:D1=0 was 2.5-4.8 % faster than every named mode at 1-4 tokens in six rounds; at 16-128 no
# composite beat the best named mode beyond the run-to-run spread (benchmarks/results/2026-11-30_h200_session16)
TUNE_MODES = ("serial", "multistream", "multistream_pdl_entry", "multistream_pdl_prologue", "full", "full_prio_index",
              "full_prio_b1", "multistream+pin:D1=0", "multistream_pdl_prologue+pin:D1=0", "full+pin:D1=0",
              "full+after:D1>D0")
MIN_GAIN = 0.03
# CMP modes within this fraction of the fastest count as tied; the first in TUNE_MODES order wins (choose_prefix).
# On the H200 one mode's replay median moves by up to ~10 % between calls and by ~1 % between rounds of one call
# (2026-11-30 session 16); 1.5 % kept every gain that held in all six rounds there and no ~1 % one.
MODE_MARGIN = 0.015
ROUNDS = 3  # prefix benchmark rounds per tune (merge_rounds: the median over rounds decides)

# ---- MoE (issue #7) ------------------------------------------------------------------------------------
MOE_MODES = ("auto", "off")
MOE_MARGIN = 0.03           # MegaMoE must beat stock by more than this fraction
MOE_CANDIDATES = 4          # configs timed per bucket (at most)
MOE_EXPERTS, MOE_TOPK, MOE_SHARED = 256, 8, 1  # GLM-5 (H, I, rsf: bench/moe.py)
MOE_LAUNCHES = 10           # launches per captured graph (as bench moe)
MOE_WEIGHT_SEED = 256       # = bench moe setting (b): the same 257 experts
MOE_INPUT_SEED = 1000       # + M: the same tokens and routing as bench moe
MOE_REPORT = "moe_tune"     # <report dir>/moe_tune.{json,md}
STOCK_TRITON = "sglang_triton_fused_moe"
STOCK_DEEPGEMM = "deepgemm_fp8_mega_moe"
STOCK_KINDS = {
    STOCK_TRITON: "SGLang's Triton fused MoE (fused_experts): 257 experts with the shared expert fused as the 9th "
                  "top-k column (weight 1/rsf), block-FP8 w8a8 [128, 128], bf16 input quantised inside (what SGLang "
                  "runs for GLM-5 FP8 at TP1 with the Triton MoE runner)",
    STOCK_DEEPGEMM: "DeepGEMM fp8_mega_moe (bench/moe.py DeepGemmMegaMoE, single-rank group): the 256 routed experts "
                    "only, input pre-quantised; the shared expert is NOT included (MegaMoE's times include it, so the "
                    "comparison favours stock)",
}


def _median(x: Any) -> float | None:
    return x.get("median_us") if isinstance(x, dict) else None


def tune_modes(raw: str | None) -> tuple[str, ...]:
    """The CMP modes `tune --modes` names (TUNE_MODES when None), each one a mode the selection table accepts."""
    if raw is None:
        return TUNE_MODES
    modes = tuple(dict.fromkeys(m.strip() for m in raw.split(",") if m.strip()))
    bad = [m for m in modes if not selection.valid_cmp_mode(m)]
    if not modes or bad:
        raise ValueError(f"tune: --modes {raw!r}: {'no mode given' if not modes else f'unknown mode(s) {bad}'} "
                         f"(named modes: {', '.join(TUNE_MODES)}; composites: attn_pre/cmp/modes.py)")
    return modes


def choose_prefix(row: Mapping[str, Any], min_gain: float = MIN_GAIN,
                  mode_margin: float = MODE_MARGIN) -> tuple[str, str | None, str]:
    """(executor, cmp_mode or None, why) for one benchmark row {"M", "modes": {mode: {median_us}}, "stock"}.

    Among the CMP modes within `mode_margin` of the fastest, the one listed first in the row (the benchmark's
    order: TUNE_MODES, named modes before composites) wins: a difference inside the run-to-run spread does not
    buy a more exotic schedule."""
    cmp = {m: _median(t) for m, t in row.get("modes", {}).items() if _median(t) is not None}
    stock = _median(row.get("stock"))
    if not cmp:
        return STOCK, None, "no CMP mode ran"
    fastest = min(cmp.values())
    mode = next(m for m, v in cmp.items() if v <= fastest * (1.0 + mode_margin))
    if stock is None:
        return "cmp", mode, f"CMP {mode} {cmp[mode]:.2f} us; stock not measured"
    if cmp[mode] * (1.0 + min_gain) < stock:
        return "cmp", mode, f"CMP {mode} {cmp[mode]:.2f} us vs stock {stock:.2f} us ({stock / cmp[mode]:.2f}x)"
    return STOCK, None, f"stock {stock:.2f} us vs best CMP {mode} {cmp[mode]:.2f} us: no gain above {min_gain:.0%}"


def merge_rounds(reps: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """One report from several `bench prefix` rounds over the same modes and buckets: per (M, mode) and for the
    stock row, median_us = the median of the rounds' medians (`rounds_us` lists them). Why: one mode's replay
    median moves by up to ~10 % between runs on the H200 while the modes differ by a few percent (2026-11-30
    session 16), so a table chosen from one round is partly chosen by chance. A bucket or mode missing from a
    round (a run cut short) counts with the rounds that have it."""
    import copy
    import statistics

    from .attn_pre.cmp.bench import derive_row

    if not reps:
        raise ValueError("merge_rounds: no rounds")

    def merged(entries: list[Any]) -> Any:
        """One timing entry from the rounds' entries of one (M, mode) or stock row: the first timed entry's
        fields with median_us over the timed ones, else the first entry as it is (an error, a skip)."""
        timed = [e for e in entries if _median(e) is not None]
        if not timed:
            return copy.deepcopy(entries[0])
        vals = [_median(e) for e in timed]
        return {**copy.deepcopy(dict(timed[0])), "median_us": statistics.median(vals), "rounds_us": vals}

    by_m: dict[int, list[Mapping[str, Any]]] = {}
    for rep in reps:
        for row in rep.get("rows", []):
            by_m.setdefault(int(row["M"]), []).append(row)
    rows: dict[int, dict[str, Any]] = {}
    for m, rs in by_m.items():
        row = copy.deepcopy(dict(rs[0]))
        modes = list(dict.fromkeys(k for r in rs for k in r.get("modes", {})))  # first-seen order (choose_prefix)
        row["modes"] = {k: merged([r["modes"][k] for r in rs if k in r.get("modes", {})]) for k in modes}
        stock = [r["stock"] for r in rs if "stock" in r]
        if stock:
            row["stock"] = merged(stock)
        if "floor_us" in row:  # (every bench_prefix row has it; hand-made reports may not)
            derive_row(row)
        rows[m] = row
    out = copy.deepcopy(dict(reps[0]))
    out["rows"] = [rows[m] for m in sorted(rows)]
    out["rounds"] = len(reps)
    return out


# ---- MoE: candidates, choice, report --------------------------------------------------------------------

def expected_distinct_experts(m: int, experts: int = MOE_EXPERTS, topk: int = MOE_TOPK) -> float:
    """Expected routed experts touched by m tokens under uniform top-k routing: E (1 - (1 - k/E)^m)."""
    return experts * (1.0 - (1.0 - topk / experts) ** max(m, 0))


def _expected_counts(m: int, experts: int, topk: int) -> list[int]:
    """A routing-free stand-in for the per-expert token counts: the expected distinct experts, each with the
    mean load (used by moe_candidates when no routing is given)."""
    d = max(1, round(expected_distinct_experts(m, experts, topk)))
    return [math.ceil(m * topk / d)] * d


def fc1_split(cfg: Any, counts: Sequence[int], m: int, num_sms: int = 132, inter: int = 2048,
              num_shared: int = MOE_SHARED) -> bool:
    """Whether MegaMoE with `cfg` splits its FC1 tiles in two K halves for this routing (counts = tokens per
    routed expert; the shared expert holds all m tokens): the plan kernel's rule (megamoe.plan_reference),
    token blocks x FC1 row tiles <= split_max_tiles (capped at 8 waves as in the kernel parameters)."""
    from .moe import megamoe as MM

    limit = min(cfg.split_max_tiles(num_sms), 8 * num_sms)
    if limit <= 0:
        return False
    blocks = sum(-(-int(c) // cfg.block_n) for c in counts if c > 0) + (-(-m // cfg.block_n) if num_shared else 0)
    return blocks * (2 * inter // MM.TILE_ROWS) <= limit


# expected largest routed expert from which tune also times bn64's token-major build (below the default's threshold)
TOKEN_MAJOR_CANDIDATE_MIN_LOAD = 40


def moe_candidates(m: int, n: int = MOE_CANDIDATES, *, num_sms: int = 132, counts: Sequence[int] | None = None,
                   experts: int = MOE_EXPERTS, topk: int = MOE_TOPK, num_shared: int = MOE_SHARED,
                   inter: int = 2048) -> list[Any]:
    """At most n MegaMoE configs for a bucket of m tokens, best guess first:

    1. the default config (megamoe.default_config: the smallest block_n holding the expected largest
       expert, the shared expert included; deepest stages; split-K FC1 tiles at 1 token only);
    2. its split twin (split_waves flipped), only when the FC1 K split actually differs between the two for this
       routing (`counts`, else the expected routing): otherwise the twin runs the same schedule;
    3. the other block_n in BLOCK_NS that hold the expected routed load (megamoe.expected_max_load: the
       shared expert may span several token blocks), nearest to the default's block_n first (ties: the
       larger), each with the deepest stages and the default's split_waves;
    4. the split twins of those, under the same rule as 2.
    Only block_n <= SPLIT_MAX_BN splits at all, so larger blocks never get a twin. A bn64 default from an expected
    largest routed expert of TOKEN_MAJOR_CANDIDATE_MIN_LOAD tokens gets bn64's token-major build (no pool) as the
    first alternative. From megamoe.TOKEN_MAJOR_POOL_MIN_LOAD tokens the default is bn64's token-major pool build with
    the end combine; its alternatives are bn64's token-major build without the pool, plain bn64 and the wide
    token-major pool build (WIDE_BN, the default there in session 13) with the end combine. The wide block is no
    candidate otherwise: its cp.async build took 1.15-1.35x bn64's time at 256-4096 tokens (H200, session 11), and
    bn64's token-major pool build beat its token-major pool build at every bucket from (a) 256 (session 14); time
    other combinations with `bench moe --configs`.
    """
    from dataclasses import replace

    from .moe import megamoe as MM

    if n < 1:
        raise ValueError(f"tune: --moe-candidates must be >= 1, got {n}")
    cnt = list(counts) if counts is not None else _expected_counts(m, experts, topk)
    d = MM.default_config(m, experts, topk, num_shared, num_sms, inter)
    load = MM.expected_max_load(m, experts, topk)
    i0 = MM.BLOCK_NS.index(d.block_n)
    near = sorted((b for b in MM.BLOCK_NS if b not in (d.block_n, MM.WIDE_BN) and b >= load),
                  key=lambda b: (abs(MM.BLOCK_NS.index(b) - i0), -b))
    primary = [d] + [MM.MegaMoEConfig(b, MM.max_stages(b), split_waves=d.split_waves,
                                      lean_fences=d.lean_fences).validate() for b in near]
    # bn64's token-major build without the pool: 3-4 % faster than plain bn64 at (a) 128 tokens (expected largest
    # expert 48) and than both plain bn64 and the token-major pool default at (a) 192 (67), in every run; 2-5 % slower
    # or even at (b) 1024 (50) (H200, session 14): a tuner's call
    if d.block_n == 64 and not d.token_major and load >= TOKEN_MAJOR_CANDIDATE_MIN_LOAD:
        primary.insert(1, replace(d, token_major=True).validate())
    if d.token_major:  # the token-major pool default
        primary = [d, replace(d, pool=False, end_combine=False).validate(),
                   replace(d, pool=False, token_major=False, end_combine=False).validate(),
                   MM.MegaMoEConfig(MM.WIDE_BN, MM.max_stages(MM.WIDE_BN), split_waves=0, lean_fences=d.lean_fences,
                                    pool=True, token_major=True, end_combine=d.end_combine).validate()]

    def twin(c: Any) -> Any | None:
        t = replace(c, split_waves=0 if c.split_waves else MM.SPLIT_WAVES).validate()
        return t if fc1_split(t, cnt, m, num_sms, inter, num_shared) != fc1_split(c, cnt, m, num_sms, inter,
                                                                                 num_shared) else None

    order = [d, twin(d), *primary[1:], *(twin(c) for c in primary[1:])]
    out: dict[str, Any] = {}
    for c in order:
        if c is not None and c.name not in out:
            out[c.name] = c
    return list(out.values())[:n]


def _ours_us(row: Mapping[str, Any], name: str) -> tuple[float | None, str]:
    """A candidate's time as compared with stock: + our activation quant when the stock quantises inside."""
    t = _median(row.get("candidates", {}).get(name))
    if t is None:
        return None, ""
    st = row.get("stock") or {}
    if not st.get("includes_quant"):
        return t, ""
    q = _median(row.get("quant"))
    if q is None:
        return t, " (our act quant not measured: not added)"
    return t + q, f" (incl. {q:.2f} us act quant)"


def choose_moe(row: Mapping[str, Any], margin: float = MOE_MARGIN, without_stock: bool = False) -> tuple[str, str]:
    """(table moe value, why) for one MoE row {"M", "candidates": {name: {median_us} | {excluded} | {error}},
    "stock": {kind, median_us, includes_quant, ...} | {kind, skipped | error}, "quant": {median_us} | None}."""
    cands: dict[str, float] = {}
    for k in row.get("candidates", {}):
        v = _ours_us(row, k)[0]
        if v is not None:
            cands[k] = v
    bad = [k for k, c in row.get("candidates", {}).items() if _median(c) is None]
    if not cands:
        return STOCK, "no MegaMoE candidate ran" + (f" ({', '.join(bad)} excluded/failed)" if bad else "")
    best = min(cands, key=cands.get)
    ours, note = cands[best], _ours_us(row, best)[1]
    st = row.get("stock") or {}
    stock = _median(st)
    if stock is None:
        why = st.get("skipped") or st.get("error") or "not measured"
        if without_stock:
            return (f"megamoe:{best}",
                    f"MegaMoE {best} {ours:.2f} us{note}; no stock timing ({why}); --moe-without-stock")
        return STOCK, (f"no stock MoE timing ({why}): MegaMoE {best} {ours:.2f} us not chosen "
                       "(pass --moe-without-stock to choose it anyway)")
    kind = st.get("kind", "stock")
    if ours * (1.0 + margin) < stock:
        return f"megamoe:{best}", f"MegaMoE {best} {ours:.2f} us{note} vs {kind} {stock:.2f} us ({stock / ours:.2f}x)"
    return STOCK, f"{kind} {stock:.2f} us vs best MegaMoE {best} {ours:.2f} us{note}: no gain above {margin:.0%}"


def render_moe_markdown(rep: Mapping[str, Any]) -> str:
    """The MoE part of the tune report (moe_tune.md)."""
    margin, wo = rep.get("margin", MOE_MARGIN), bool(rep.get("without_stock"))
    f = lambda x, p=".2f": "-" if x is None else format(x, p)  # noqa: E731
    st = rep.get("stock") or {}
    kind = st.get("kind")
    lines = [f"# MoE tune ({rep.get('device', '?')}, {rep.get('date', '?')}, commit {rep.get('commit', '?')})", "",
             f"MegaMoE: {rep.get('experts', MOE_EXPERTS)} routed + {rep.get('shared', MOE_SHARED)} shared experts, "
             f"H {rep.get('hidden')}, I {rep.get('inter')}, top-{rep.get('topk', MOE_TOPK)}, rsf {rep.get('rsf')}; "
             "bench/moe.py synthetic FP8 experts (zero-copy prepare_weights) and uniform random routing.",
             f"Stock: **{kind or 'none'}**" + (f": {STOCK_KINDS.get(kind, '')}" if kind else "")
             + (f". {st['note']}" if st.get("note") else "") + ".",
             *(f"- {t['kind']} not used: {t['error']}" for t in st.get("tried", []) if t.get("error")),
             "",
             f"Times: median per launch of {rep.get('launches')} launches captured in one CUDA graph, "
             f"{rep.get('replays')} replays (bench/timing.py; the expert weights one launch reads are far past 2x L2). "
             "Floor: (expected distinct routed experts + 1 shared) x 37.75 MB / 4.27 TB/s. "
             "When the stock quantises its bf16 input inside, our act_quant_fp8 time (quant us) is added to MegaMoE's "
             "for stock/best and the choice (the MoE route runs it too); best us and best/floor are MegaMoE alone. "
             f"Choice: MegaMoE when faster than stock by more than {margin:.0%}"
             + (" (or when stock could not be timed: --moe-without-stock)" if wo else "") + ".", ""]
    if rep.get("aborted"):
        lines += [f"**MoE tune stopped early:** {rep['aborted']}", ""]
    lines += ["| M | experts exp. / touched | floor us | default config | best MegaMoE | best us | quant us | "
              "stock us | best/floor | stock/best | choice | reason |",
              "|---:|---|---:|---|---|---:|---:|---:|---:|---:|---|---|"]
    for r in rep.get("rows", []):
        meds = {k: _median(c) for k, c in r.get("candidates", {}).items() if _median(c) is not None}
        best = min(meds, key=meds.get) if meds else None
        stock = _median(r.get("stock"))
        choice, why = choose_moe(r, margin, wo)
        ours = _ours_us(r, best)[0] if best else None
        lines.append(f"| {r['M']} | {f(r.get('experts_expected'), '.1f')} / {r.get('experts_touched', '-')} | "
                     f"{f(r.get('floor_us'), '.1f')} | {r.get('default_config', '-')} | {best or '-'} | "
                     f"{f(meds.get(best) if best else None)} | {f(_median(r.get('quant')))} | "
                     f"{f(stock) if stock is not None else (r.get('stock') or {}).get('skipped', 'err')[:24]} | "
                     f"{f(meds[best] / r['floor_us'] if best and r.get('floor_us') else None, '.3f')} | "
                     f"{f(stock / ours if stock and ours else None)} | {choice} | {why} |")
    lines += ["", "## Candidates", "", "| M | config | FC1 K split | check vs default | median us | min us | p90 us | "
              "/floor | note |", "|---:|---|---|---|---:|---:|---:|---:|---|"]
    for r in rep.get("rows", []):
        for name, c in r.get("candidates", {}).items():
            med = _median(c)
            note = c.get("excluded") or c.get("error") or c.get("note") or ""
            lines.append(f"| {r['M']} | {name} | {'yes' if c.get('fc1_split') else 'no'} | {c.get('check', '-')} | "
                         f"{f(med)} | {f(c.get('min_us'))} | {f(c.get('p90_us'))} | "
                         f"{f(med / r['floor_us'] if med and r.get('floor_us') else None, '.3f')} | "
                         f"{str(note)[:160].replace('|', '/')} |")
    lines.append("")
    return "\n".join(lines)


# ---- the table ---------------------------------------------------------------------------------------------

def table_from_report(rep: Mapping[str, Any], gpu: Sequence[str], min_gain: float = MIN_GAIN,
                      commit: str = "unknown", moe: Mapping[str, Any] | None = None, moe_margin: float = MOE_MARGIN,
                      moe_without_stock: bool = False, mode_margin: float = MODE_MARGIN) -> dict[str, Any]:
    """The selection-table document for a CMP benchmark report (and, with `moe`, a MoE tune report:
    tune_moe's result); validated by selection.parse. moe=None: every bucket's MoE is "stock"."""
    moe_rows = {int(r["M"]): r for r in (moe or {}).get("rows", [])}
    buckets, why = [], []
    for row in sorted(rep["rows"], key=lambda r: r["M"]):
        ex, mode, reason = choose_prefix(row, min_gain, mode_margin)
        moe_choice = STOCK
        if moe is not None:
            mr = moe_rows.get(int(row["M"]))
            moe_choice, moe_why = (choose_moe(mr, moe_margin, moe_without_stock) if mr is not None
                                   else (STOCK, "MoE not measured"))
            reason += f"; MoE {moe_choice}: {moe_why}"
        entry: dict[str, Any] = {"tokens": int(row["M"]), "prefix": ex, "moe": moe_choice}
        if ex == "cmp" and mode != "full":
            entry["cmp_mode"] = mode
        buckets.append(entry)
        why.append(f"M<={row['M']}: {reason}")
    if moe is None:
        moe_text = "MoE stays stock until MegaMoE lands."
    else:
        kind = (moe.get("stock") or {}).get("kind") or "none"
        moe_text = (f"MoE: MegaMoE candidates vs stock {kind}, margin {moe_margin:.0%}"
                    + (", --moe-without-stock" if moe_without_stock else "") + "."
                    + (f" MoE tune stopped early: {moe['aborted']}." if moe.get("aborted") else ""))
    doc = {"version": SCHEMA_VERSION, "gpu": list(gpu),
           "comment": (f"glm5-fastpath tune on {rep.get('device', '?')}, {_dt.date.today().isoformat()}, commit "
                       f"{commit}, KV {rep.get('kv_len')} per sequence. {moe_text} "
                       + "; ".join(why)),
           "buckets": buckets}
    parse(doc, "<tune>")  # never write a table the plugin would reject
    return doc


# ---- MoE measurement (GPU) ---------------------------------------------------------------------------------

def _import_triton_moe() -> tuple[Callable, Any, Any]:
    """(fused_experts, MoeRunnerConfig or None, StandardTopKOutput or None) from the installed SGLang."""
    import importlib

    mod = importlib.import_module("sglang.srt.layers.moe.fused_moe_triton")
    fn = getattr(mod, "fused_experts", None)
    if fn is None:
        fn = importlib.import_module("sglang.srt.layers.moe.fused_moe_triton.fused_moe").fused_experts
    cfg_cls = topk_cls = None
    for path in ("sglang.srt.layers.moe.moe_runner", "sglang.srt.layers.moe.moe_runner.base"):
        try:
            cfg_cls = importlib.import_module(path).MoeRunnerConfig
            break
        except (ImportError, AttributeError):
            continue
    try:
        topk_cls = importlib.import_module("sglang.srt.layers.moe.topk").StandardTopKOutput
    except (ImportError, AttributeError):
        pass
    return fn, cfg_cls, topk_cls


def triton_call(fn: Callable, runner_config_cls: Any, topk_output_cls: Any, hidden: Any, w13: Any, s13: Any,
                w2: Any, s2: Any, topk_ids: Any, topk_weights: Any, rsf: float) -> tuple[tuple, dict, bool]:
    """(args, kwargs, scale_after) calling SGLang's fused_experts out of place on block-FP8 weights, whatever
    its signature: (hidden, w1, w2, topk_output, moe_runner_config, ...) (0.5.x) or (hidden, w1, w2,
    topk_weights, topk_ids, inplace=..., ...) (older). scale_after: this version takes no
    routed_scaling_factor, so the caller multiplies the output by rsf (as SGLang's model code then does)."""
    import inspect

    params = inspect.signature(fn).parameters
    for need in ("use_fp8_w8a8", "w1_scale", "w2_scale", "block_shape"):
        if need not in params:
            raise TypeError(f"SGLang fused_experts has no {need!r} parameter: not the block-FP8 Triton MoE")
    e_tot, k = int(w13.shape[0]), int(topk_ids.shape[1])
    if "topk_output" in params:
        if topk_output_cls is None:
            raise TypeError("SGLang fused_experts takes a topk_output but StandardTopKOutput was not found")
        vals = {"topk_weights": topk_weights, "topk_ids": topk_ids, "router_logits": topk_weights}
        topk = topk_output_cls(**{fld: vals.get(fld) for fld in topk_output_cls._fields})
        args: tuple = (hidden, w13, w2, topk)
    else:
        args = (hidden, w13, w2, topk_weights, topk_ids)
    kw: dict[str, Any] = {}
    wanted = {"inplace": False, "activation": "silu", "routed_scaling_factor": rsf, "num_experts": e_tot,
              "num_local_experts": e_tot, "top_k": k, "num_fused_shared_experts": 1,
              "hidden_size": int(w13.shape[2]), "intermediate_size_per_partition": int(w2.shape[2])}
    scale_after = True
    if "moe_runner_config" in params:
        if runner_config_cls is None:
            raise TypeError("SGLang fused_experts takes a moe_runner_config but MoeRunnerConfig was not found")
        fields = set(getattr(runner_config_cls, "__dataclass_fields__", {})) or set(
            inspect.signature(runner_config_cls).parameters)
        kw["moe_runner_config"] = runner_config_cls(**{f: v for f, v in wanted.items() if f in fields})
        scale_after = "routed_scaling_factor" not in fields
    else:
        for f in ("inplace", "activation", "routed_scaling_factor"):
            if f in params:
                kw[f] = wanted[f]
        scale_after = "routed_scaling_factor" not in params
    kw.update(use_fp8_w8a8=True, w1_scale=s13, w2_scale=s2, block_shape=[128, 128])
    inspect.signature(fn).bind(*args, **kw)  # a TypeError here names the mismatch before any launch
    return args, kw, scale_after


class _TritonStock:
    kind, includes_quant, includes_shared = STOCK_TRITON, True, True

    def __init__(self, raw: tuple, rsf: float) -> None:
        self.fn, self.cfg_cls, self.topk_cls = _import_triton_moe()
        self.w13, self.s13, self.w2, self.s2 = raw
        self.rsf = rsf
        self.note = ""

    def bind(self, x8: Any, xs: Any, ids: Any, wts: Any) -> Callable[[], Any]:
        import torch

        m, h = x8.shape
        e = int(self.w13.shape[0]) - 1  # the shared expert's id (last)
        hidden = (x8.float().view(m, h // 128, 128) * xs.unsqueeze(-1)).view(m, h).to(torch.bfloat16).contiguous()
        ids9 = torch.cat([ids.to(torch.int32), torch.full((m, 1), e, dtype=torch.int32, device=ids.device)], 1)
        w9 = torch.cat([wts.float(), torch.full((m, 1), 1.0 / self.rsf, dtype=torch.float32, device=wts.device)], 1)
        args, kw, scale_after = triton_call(self.fn, self.cfg_cls, self.topk_cls, hidden, self.w13, self.s13,
                                            self.w2, self.s2, ids9.contiguous(), w9.contiguous(), self.rsf)
        if scale_after:
            self.note = "this SGLang's fused_experts takes no routed_scaling_factor: x rsf applied after it"
        rsf, fn = self.rsf, self.fn

        def call() -> Any:  # args hold hidden / ids9 / w9 alive
            out = fn(*args, **kw)
            return out * rsf if scale_after else out
        return call


class _DeepGemmStock:
    kind, includes_quant, includes_shared = STOCK_DEEPGEMM, False, False

    def __init__(self, raw: tuple, experts: int, max_tokens: int, dev: Any) -> None:
        from .bench.moe import DeepGemmMegaMoE

        self.dg = DeepGemmMegaMoE(experts, max_tokens, tuple(t[:experts] for t in raw), dev)
        self.note = "shared expert not included"

    def bind(self, x8: Any, xs: Any, ids: Any, wts: Any) -> Callable[[], Any]:
        import torch

        self.dg.load(x8, xs, ids, wts)
        y = torch.empty(x8.shape[0], x8.shape[1], dtype=torch.bfloat16, device=x8.device)
        return lambda: self.dg(y)


def _make_stock(raw: tuple, max_tokens: int, dev: Any, rsf: float, probe: tuple,
                log: Callable[[str], None]) -> tuple[Any, dict[str, Any]]:
    """The stock MoE of this environment (Triton, else DeepGEMM), each probed with one eager call on `probe`
    inputs; (impl or None, info {"kind", "includes_quant", "includes_shared", "note", "tried": [...]})."""
    import torch

    tried: list[dict[str, str]] = []
    makers = ((STOCK_TRITON, lambda: _TritonStock(raw, rsf)),
              (STOCK_DEEPGEMM, lambda: _DeepGemmStock(raw, MOE_EXPERTS, max_tokens, dev)))
    for kind, make in makers:
        try:
            impl = make()
            impl.bind(*probe)()
            torch.cuda.synchronize(dev)
            tried.append({"kind": kind})
            info = {"kind": kind, "includes_quant": impl.includes_quant, "includes_shared": impl.includes_shared,
                    "note": impl.note, "tried": tried}
            log(f"MoE stock: {kind}" + (f" ({impl.note})" if impl.note else ""))
            return impl, info
        except Exception as e:  # noqa: BLE001 - recorded; the next kind is tried
            from .bench.timing import cuda_context_error

            tried.append({"kind": kind, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            log(f"MoE stock: {kind} unavailable: {tried[-1]['error']}")
            err = cuda_context_error(dev)
            if err is not None:
                raise RuntimeError(f"the {kind} probe left the CUDA context unusable: {err}") from e
    return None, {"kind": None, "skipped": "neither SGLang's Triton fused MoE nor DeepGEMM fp8_mega_moe could run",
                  "tried": tried}


def _prewarm_megamoe(configs: Sequence[Any], hidden: int, inter: int, log: Callable[[str], None]) -> None:
    """JIT-compile the candidates' kernel variants (one per block_n x stages) in parallel (nvcc outside the GIL)."""
    from concurrent.futures import ThreadPoolExecutor

    from .jit import compile_kernel
    from .jit.compiler import current_arch

    specs = {(c.block_n, c.stages, c.lean_fences): c.spec(hidden, inter) for c in configs}
    t0 = time.time()
    try:
        arch = current_arch()
        with ThreadPoolExecutor(max_workers=len(specs)) as ex:
            done = list(ex.map(lambda s: compile_kernel(s, arch), specs.values()))
        log(f"MegaMoE kernels: {sum(not c.cache_hit for c in done)} compiled, {sum(c.cache_hit for c in done)} cached "
            f"({time.time() - t0:.0f} s)")
    except Exception as e:  # noqa: BLE001 - each candidate compiles (and reports) on its own later
        log(f"MegaMoE prewarm failed ({type(e).__name__}: {str(e)[:200]}); candidates compile one by one")


def _check(out: Any, ref: Any, same_split: bool) -> tuple[bool, str]:
    """A candidate's output vs the default config's: bitwise when the FC1 K split is the same, else within
    testing.numerics THRESHOLDS["fp8_same_quant"]."""
    import torch

    from .testing.numerics import THRESHOLDS, rel_err

    if not bool(torch.isfinite(out).all()):
        return False, "non-finite output"
    if same_split:
        if torch.equal(out.view(torch.int16), ref.view(torch.int16)):
            return True, "bitwise"
        n = int((out.view(torch.int16) != ref.view(torch.int16)).sum())
        return False, (f"not bitwise equal to the default config ({n} of {out.numel()} differ, "
                       f"rel_err {rel_err(out, ref):.2e})")
    e, tol = rel_err(out, ref), THRESHOLDS["fp8_same_quant"]
    return (e <= tol), f"rel_err {e:.2e}" + ("" if e <= tol else f" > fp8_same_quant {tol:.0e}")


def tune_moe(buckets: Sequence[int], out_dir: str | Path | None = None, *, n_candidates: int = MOE_CANDIDATES,
             replays: int = 30, launches: int = MOE_LAUNCHES, margin: float = MOE_MARGIN, without_stock: bool = False,
             device: Any = None, log: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Time MegaMoE candidates and the stock MoE per bucket (GPU); -> the MoE report (`rows` per bucket),
    written to out_dir/moe_tune.{json,md} after every bucket (a run cut short keeps what finished)."""
    import torch

    from .bench import moe as BM
    from .bench.meta import git_commit
    from .bench.timing import CudaContextLost, cuda_context_error, l2_cache_bytes, plan_rotation, time_launches
    from .moe import megamoe as MM

    def lost(what: str) -> None:
        """After a failure: stop the whole MoE tune if the CUDA context is gone (a sticky kernel error)."""
        err = cuda_context_error(dev)
        if err is not None:
            raise CudaContextLost(f"{what} left the CUDA context unusable: {err}")

    log = log or (lambda s: print(f"[tune moe {time.strftime('%H:%M:%S')}] {s}", flush=True))
    dev = torch.device(device) if device is not None else torch.device("cuda", torch.cuda.current_device())
    sms = torch.cuda.get_device_properties(dev).multi_processor_count
    t_start = time.time()
    rep: dict[str, Any] = {"device": torch.cuda.get_device_name(dev), "date": _dt.date.today().isoformat(),
                           "commit": git_commit(), "hidden": BM.H, "inter": BM.I, "experts": MOE_EXPERTS,
                           "shared": MOE_SHARED, "topk": MOE_TOPK, "rsf": BM.RSF, "num_sms": sms,
                           "margin": margin, "without_stock": without_stock, "candidates_max": n_candidates,
                           "launches": launches, "replays": replays,
                           "routing": "uniform random (bench/moe.py make_inputs)",
                           "stock": {}, "rows": [], "aborted": None}
    out = Path(out_dir) if out_dir is not None else None

    def save() -> None:
        rep["seconds"] = round(time.time() - t_start, 1)
        if out is not None:
            out.mkdir(parents=True, exist_ok=True)
            (out / f"{MOE_REPORT}.json").write_text(json.dumps(rep, indent=1, default=str))
            (out / f"{MOE_REPORT}.md").write_text(render_moe_markdown(rep))

    buckets = sorted(set(int(b) for b in buckets))
    if buckets[-1] > MM.MAX_TOKENS:
        raise ValueError(f"tune: MoE buckets must be <= {MM.MAX_TOKENS}, got {buckets[-1]}")
    log(f"generating {MOE_EXPERTS}+{MOE_SHARED} GLM-5 experts (H {BM.H}, I {BM.I}, FP8) ...")
    raw = BM.make_weights(MOE_EXPERTS + MOE_SHARED, seed=MOE_WEIGHT_SEED, dev=dev)
    weights = MM.prepare_weights(*raw, num_shared=MOE_SHARED)  # routed experts first, the shared expert last
    rep["zero_copy"] = weights.w13.data_ptr() == raw[0].data_ptr() and weights.w2.data_ptr() == raw[2].data_ptr()
    routed = MM.MegaMoEWeights(weights.w13[:MOE_EXPERTS], weights.w13_scale[:MOE_EXPERTS], weights.w2[:MOE_EXPERTS],
                               weights.w2_scale[:MOE_EXPERTS], MOE_EXPERTS, 0)  # views, for the DeepGEMM comparison
    _prewarm_megamoe([c for m in buckets for c in moe_candidates(m, n_candidates, num_sms=sms, inter=BM.I)],
                     BM.H, BM.I, log)
    try:
        MM.precompile(weights, MOE_TOPK, max_tokens=buckets[-1], device=dev, configs=[MM.default_config(
            buckets[-1], MOE_EXPERTS, MOE_TOPK, MOE_SHARED, sms, BM.I)])  # the workspace for the largest bucket
    except Exception as e:  # noqa: BLE001 - every candidate will fail the same way and say so
        log(f"MegaMoE precompile failed: {type(e).__name__}: {e}")
    try:
        stock, rep["stock"] = _make_stock(raw, buckets[-1], dev, BM.RSF, BM.make_inputs(1, MOE_EXPERTS, 7, dev), log)
    except RuntimeError as e:
        rep["aborted"] = str(e)
        save()
        return rep
    quant = None
    if stock is not None and stock.includes_quant:
        try:
            from .ops.act_quant import act_quant_fp8

            quant = act_quant_fp8
        except Exception as e:  # noqa: BLE001
            rep["quant_error"] = f"{type(e).__name__}: {e}"

    for m in buckets:
        try:
            x8, xs, ids, wts = BM.make_inputs(m, MOE_EXPERTS, seed=MOE_INPUT_SEED + m, dev=dev)
            counts = torch.bincount(ids.flatten().long(), minlength=MOE_EXPERTS).tolist()
            touched = sum(1 for c in counts if c)
            exp = expected_distinct_experts(m)
            plan = plan_rotation((touched + MOE_SHARED) * BM.EXPERT_BYTES, l2_cache_bytes(dev), min_launches=launches,
                                 available_sets=1)
            cands = moe_candidates(m, n_candidates, num_sms=sms, counts=counts, inter=BM.I)
            d = MM.default_config(m, MOE_EXPERTS, MOE_TOPK, MOE_SHARED, sms, BM.I)
            row: dict[str, Any] = {"M": m, "experts_expected": exp, "experts_touched": touched,
                                   "floor_us": BM.floor_us(exp + MOE_SHARED), "floor_touched_us":
                                   BM.floor_us(touched + MOE_SHARED), "default_config": d.name,
                                   "rotation": plan.to_dict(), "candidates": {}}
            run = lambda c: MM.mega_moe(x8, xs, ids, wts, weights, routed_scaling_factor=BM.RSF, config=c)  # noqa: E731
            ref, ref_err = None, ""
            try:
                ref = run(d)
                torch.cuda.synchronize(dev)
                if not bool(torch.isfinite(ref).all()):
                    ref, ref_err = None, "the default config's output is not finite"
            except CudaContextLost:
                raise
            except Exception as e:  # noqa: BLE001
                ref_err = f"default config {d.name} failed: {type(e).__name__}: {str(e)[:300]}"
                lost(f"M={m} {d.name}")
            for c in cands:
                split = fc1_split(c, counts, m, sms, BM.I)
                entry: dict[str, Any] = {"fc1_split": split}
                row["candidates"][c.name] = entry
                if ref is None:
                    entry["excluded"] = ref_err
                    continue
                try:
                    ok, check = _check(run(c), ref, split == fc1_split(d, counts, m, sms, BM.I))
                    entry["check"] = check
                    if not ok:
                        entry["excluded"] = f"disagrees with {d.name}: {check}"
                        log(f"M={m} {c.name}: EXCLUDED ({check})")
                        continue
                    t = time_launches(lambda i, c=c: run(c), plan.launches, device=dev, replays=replays)
                    entry.update(t.to_dict())
                    log(f"M={m} {c.name}: {t.median_us:.2f} us ({check})")
                except CudaContextLost:
                    raise
                except Exception as e:  # noqa: BLE001 - recorded, the other candidates still run
                    entry["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    log(f"M={m} {c.name}: error {entry['error']}")
                    lost(f"M={m} {c.name}")
            if stock is None:
                row["stock"] = {"kind": None, "skipped": rep["stock"].get("skipped", "no stock MoE")}
            else:
                st: dict[str, Any] = {"kind": stock.kind, "includes_quant": stock.includes_quant,
                                      "includes_shared": stock.includes_shared}
                try:
                    call = stock.bind(x8, xs, ids, wts)
                    y = call()
                    torch.cuda.synchronize(dev)
                    try:  # informative: the stock does the same math (DeepGEMM: routed only, no rsf)
                        from .testing.numerics import rel_err

                        cmp = ref if stock.includes_shared else MM.mega_moe(x8, xs, ids, wts, routed,
                                                                             routed_scaling_factor=1.0)
                        if cmp is not None:
                            st["rel_err_vs_megamoe"] = rel_err(y, cmp)
                    except Exception as e:  # noqa: BLE001
                        st["rel_err_vs_megamoe"] = f"{type(e).__name__}: {str(e)[:120]}"
                    t = time_launches(lambda i: call(), plan.launches, device=dev, replays=replays)
                    st.update(t.to_dict())
                    log(f"M={m} stock {stock.kind}: {t.median_us:.2f} us")
                except CudaContextLost:
                    raise
                except Exception as e:  # noqa: BLE001
                    st["error"] = f"{type(e).__name__}: {str(e)[:300]}"
                    log(f"M={m} stock {stock.kind}: error {st['error']}")
                    lost(f"M={m} stock {stock.kind}")
                row["stock"] = st
                if quant is not None:
                    try:
                        hidden = (x8.float().view(m, -1, 128) * xs.unsqueeze(-1)).view(m, -1).to(torch.bfloat16)
                        row["quant"] = {"what": "act_quant_fp8 (ours, 1x128)",
                                        **time_launches(lambda i: quant(hidden), plan.launches, device=dev,
                                                        replays=replays).to_dict()}
                    except CudaContextLost:
                        raise
                    except Exception as e:  # noqa: BLE001
                        row["quant"] = {"error": f"{type(e).__name__}: {str(e)[:200]}"}
                        lost(f"M={m} act quant")
            row["choice"], row["reason"] = choose_moe(row, margin, without_stock)
            log(f"M={m}: floor {row['floor_us']:.1f} us -> {row['choice']} ({row['reason']})")
            rep["rows"].append(row)
            save()
            ref = None
            torch.cuda.empty_cache()
        except CudaContextLost as e:
            rep["aborted"] = f"M={m}: {e}"
            log(f"MoE tune stopped: {e}")
            break
    save()
    raw = weights = routed = stock = None
    torch.cuda.empty_cache()
    return rep


# ---- CLI -------------------------------------------------------------------------------------------------

def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="selection table JSON to write (pass it as --glm5-fastpath-config)")
    p.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)), help="token-count buckets")
    p.add_argument("--kv-len", type=int, default=8192, help="context length per sequence used for timing")
    p.add_argument("--config", default="glm5", help="model preset or config.json")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN, help="CMP must beat stock by this fraction")
    p.add_argument("--mode-margin", type=float, default=MODE_MARGIN,
                   help="CMP modes within this fraction of the fastest are tied; the first in the candidate order wins")
    p.add_argument("--modes", default=None,
                   help="comma list of CMP modes to time (named or composite, attn_pre/cmp/modes.py), in preference "
                        "order for ties; default: TUNE_MODES")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--rounds", type=int, default=ROUNDS,
                   help="prefix benchmark rounds (the first with the stock graph); each (bucket, mode) is judged by the "
                        "median over rounds (merge_rounds)")
    p.add_argument("--moe", choices=MOE_MODES, default="auto",
                   help="auto: also time MegaMoE configs vs the stock MoE per bucket and fill the moe column; "
                        "off: MoE column 'stock' (the prefix-only tune)")
    p.add_argument("--moe-candidates", type=int, default=MOE_CANDIDATES,
                   help="MegaMoE configs timed per bucket (the default config first)")
    p.add_argument("--moe-margin", type=float, default=MOE_MARGIN, help="MegaMoE must beat stock by this fraction")
    p.add_argument("--moe-without-stock", action="store_true",
                   help="choose MegaMoE even when no stock MoE (SGLang Triton / DeepGEMM) could be timed")


def _write(out: Path, doc: Mapping[str, Any]) -> None:
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")


def run(a: argparse.Namespace) -> int:
    import os

    import torch

    from .attn_pre.cmp.bench import bench_prefix
    from .config import Glm5Config

    moe = getattr(a, "moe", "off")
    if moe not in MOE_MODES:
        raise ValueError(f"tune: --moe must be one of {', '.join(MOE_MODES)}, got {moe!r}")
    if moe == "auto" and (getattr(a, "moe_candidates", MOE_CANDIDATES) < 1 or getattr(a, "moe_margin", 0.0) < 0):
        raise ValueError("tune: --moe-candidates must be >= 1 and --moe-margin >= 0")
    if not torch.cuda.is_available():
        raise ValueError("tune measures kernels: it needs a CUDA GPU (sm_90)")
    cfg = Glm5Config.preset(a.config) if not a.config.endswith(".json") else Glm5Config.from_file(a.config)
    buckets = sorted({int(x) for x in a.buckets.split(",") if x})
    if not buckets or buckets[0] <= 0:
        raise ValueError(f"tune: --buckets must be positive integers, got {a.buckets!r}")
    out = Path(a.out)
    report_dir = out.with_suffix("")  # e.g. table.json -> table/ holding cmp_prefix.{json,md} (+ moe_tune.{json,md})
    mm = float(getattr(a, "mode_margin", MODE_MARGIN))
    if mm < 0:
        raise ValueError(f"tune: --mode-margin must be >= 0, got {mm}")
    rounds = int(getattr(a, "rounds", 1))
    if rounds < 1:
        raise ValueError(f"tune: --rounds must be >= 1, got {rounds}")
    modes = tune_modes(getattr(a, "modes", None))
    reps = [bench_prefix(cfg, modes, buckets, a.kv_len, report_dir, replays=a.replays, stock=True)]
    for r in range(2, rounds + 1):  # no stock after round 1: CMP's margin over it is far above the spread
        reps.append(bench_prefix(cfg, modes, buckets, a.kv_len, report_dir / f"round{r}", replays=a.replays,
                                 stock=False, timeline_modes=()))
    rep = merge_rounds(reps) if rounds > 1 else reps[0]
    if rounds > 1:
        from .attn_pre.cmp.bench import write_report

        write_report(rep, report_dir / "merged", final=True)
    name = torch.cuda.get_device_name()
    gpu = [tok for tok in name.replace("NVIDIA", "").split() if tok][:1] or [name]
    commit = os.environ.get("GLM5_FASTPATH_COMMIT", "unknown")
    moe_rep = None
    if moe == "auto":
        # the prefix choices first: a run cut short in the MoE part still leaves a usable table
        _write(out, table_from_report(rep, gpu, a.min_gain, commit=commit, mode_margin=mm,
                                      moe={"rows": [], "aborted": "written before the MoE part finished"}))
        try:
            moe_rep = tune_moe(buckets, report_dir, n_candidates=a.moe_candidates, replays=a.replays,
                               margin=a.moe_margin, without_stock=a.moe_without_stock)
        except Exception as e:  # noqa: BLE001 - the prefix choices stand; the MoE stays stock, with the reason
            import traceback

            traceback.print_exc()
            moe_rep = {"rows": [], "stock": {}, "aborted": f"{type(e).__name__}: {str(e)[:300]}"}
        doc = table_from_report(rep, gpu, a.min_gain, commit=commit, moe=moe_rep, moe_margin=a.moe_margin,
                                moe_without_stock=a.moe_without_stock, mode_margin=mm)
    else:
        doc = table_from_report(rep, gpu, a.min_gain, commit=commit, mode_margin=mm)
    _write(out, doc)
    print(f"glm5-fastpath tune: wrote {out} (report in {report_dir}/)")
    for b in doc["buckets"]:
        print(f"  M<={b['tokens']:>4}: prefix {b['prefix']}{':' + b['cmp_mode'] if 'cmp_mode' in b else ''}"
              + (f", moe {b['moe']}" if moe_rep is not None else ""))
    if moe_rep is not None:
        print(f"  MoE stock: {(moe_rep.get('stock') or {}).get('kind') or 'none'}"
              + (f"; stopped early: {moe_rep['aborted']}" if moe_rep.get("aborted") else ""))
    return 0
