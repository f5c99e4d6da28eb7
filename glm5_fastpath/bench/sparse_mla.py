"""`glm5-fastpath bench sparse-mla`: the DSA attention core at decode sizes, ours vs FlashMLA, vs the bytes floor.

Per token count T: q [T, H, 576] bf16, one KV cache of S slots x 576 bf16 (SGLang's MLA key buffer), a slot
table [T, K] int32 of K distinct random slots per token (K = 2048: GLM-5's index top-k), sm_scale of GLM-5.
- ours:  glm5_fastpath.ops.sparse_mla.sparse_mla_decode (split-KV + combine);
- stock: sgl_kernel.flash_mla.flash_mla_sparse_fwd, what SGLang's DSA backend runs with the flashmla_sparse
  decode backend and a bf16 KV cache (skipped, with the reason, where sgl_kernel does not import).
Times: median per launch, CUDA-graph replay (bench.timing.time_launches), each launch on its own slot table
(R tables of fresh random slots over a cache far larger than L2, so the gathered rows come from HBM as in a
decode step). Floor: gathered KV rows (T K 1152 B) + q + o + the slot table, at the copy bandwidth measured in
the same run. Correctness, same run: each output against the reference ref.attn_core.sparse_mla_flat (fp32
math, bf16 out; the float64 comparison of the kernel is tests/ops/test_sparse_mla.py), relative L2.
Output: OUT/sparse_mla.json, OUT/sparse_mla.md.
"""
from __future__ import annotations

import argparse
import json
import math
from pathlib import Path
from typing import Any, Callable

D_QK, D_V = 576, 512
DEFAULT_TOKENS = (1, 2, 4, 8, 16, 32, 64)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="directory for sparse_mla.json / .md")
    p.add_argument("--tokens", default=",".join(map(str, DEFAULT_TOKENS)), help="comma list of token counts T")
    p.add_argument("--topk", type=int, default=2048, help="slots per token (GLM-5: 2048)")
    p.add_argument("--heads", type=int, default=64, help="query heads (GLM-5 TP1: 64)")
    p.add_argument("--kv-slots", type=int, default=1 << 17, help="KV cache slots (1.2 KB each; default 151 MB)")
    p.add_argument("--tables", type=int, default=8, help="slot tables rotated over the launches")
    p.add_argument("--replays", type=int, default=30)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--splits", default="", help="comma list of explicit num_splits to time besides the op's "
                   "heuristic (e.g. 4,8,16,32,64); the fastest per T is reported")
    p.add_argument("--stages", default="", help="comma list of extra split-kernel builds to time with the "
                   "heuristic's splits, e.g. 5 (ops.sparse_mla.STAGE_CHOICES; the default build is always timed)")
    p.add_argument("--kernels", default="", help="comma list of split tiles to time besides the op default, each "
                   "at its own heuristic splits (ops.sparse_mla.KERNEL_CHOICES: mma, wgmma, auto)")
    p.add_argument("--split-kernel", default="", help="the split tile the --splits sweep times (default: the op "
                   "default)")
    p.add_argument("--write-splits", default="", help="with --splits: write the fastest num_splits per T as a JSON "
                   "table for GLM5_FASTPATH_SPARSE_MLA_SPLITS")


def parse_tokens(s: str) -> list[int]:
    try:
        ts = sorted({int(x) for x in s.split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bench sparse-mla: --tokens must be a comma list of integers, got {s!r}") from None
    if not ts or ts[0] < 1:
        raise ValueError(f"bench sparse-mla: --tokens must be positive, got {s!r}")
    return ts


def validate(a: argparse.Namespace) -> list[int]:
    ts = parse_tokens(a.tokens)
    if not 1 <= a.topk <= 2048:
        raise ValueError(f"bench sparse-mla: --topk must be in 1..2048, got {a.topk}")
    if a.heads < 16 or a.heads % 16:
        raise ValueError(f"bench sparse-mla: --heads must be a positive multiple of 16, got {a.heads}")
    if a.kv_slots < a.topk:
        raise ValueError(f"bench sparse-mla: --kv-slots ({a.kv_slots}) must be >= --topk ({a.topk})")
    if a.tables < 1 or a.replays < 1:
        raise ValueError("bench sparse-mla: --tables and --replays must be >= 1")
    parse_splits(getattr(a, "splits", ""))
    parse_stages(getattr(a, "stages", ""))
    parse_kernels(getattr(a, "kernels", ""))
    parse_kernels(getattr(a, "split_kernel", ""))
    if getattr(a, "write_splits", "") and not getattr(a, "splits", ""):
        raise ValueError("bench sparse-mla: --write-splits needs --splits")
    return ts


def parse_splits(s: str) -> list[int]:
    try:
        out = sorted({int(x) for x in (s or "").split(",") if x.strip()})
    except ValueError:
        raise ValueError(f"bench sparse-mla: --splits must be a comma list of integers, got {s!r}") from None
    if any(not 1 <= n <= 64 for n in out):
        raise ValueError(f"bench sparse-mla: --splits entries must be in 1..64, got {s!r}")
    return out


def parse_kernels(s: str) -> list[str]:
    from ..ops.sparse_mla import KERNEL_CHOICES

    out = [x.strip() for x in (s or "").split(",") if x.strip()]
    bad = [x for x in out if x not in KERNEL_CHOICES]
    if bad:
        raise ValueError(f"bench sparse-mla: kernels must be in {KERNEL_CHOICES}, got {bad[0]!r}")
    return list(dict.fromkeys(out))


def parse_stages(s: str) -> list[int]:
    from ..ops.sparse_mla import DEFAULT_STAGES, STAGE_CHOICES

    try:
        out = sorted({int(x) for x in (s or "").split(",") if x.strip()} - {DEFAULT_STAGES})
    except ValueError:
        raise ValueError(f"bench sparse-mla: --stages must be a comma list of integers, got {s!r}") from None
    if any(n not in STAGE_CHOICES for n in out):
        raise ValueError(f"bench sparse-mla: --stages entries must be in {STAGE_CHOICES}, got {s!r}")
    return out


def best_splits(row: dict[str, Any], auto_splits: int) -> tuple[int, float] | None:
    """The fastest num_splits of a row: the explicit sweep (ours_split_us) and the heuristic's own choice
    (auto_splits at ours_us), ties to the heuristic."""
    cands = {int(k): v for k, v in (row.get("ours_split_us") or {}).items() if v is not None}
    if row.get("ours_us") is not None and row.get("split_kernel") is None:  # the sweep timed the op's default tile
        cands[auto_splits] = min(row["ours_us"], cands.get(auto_splits, math.inf))
    if not cands:
        return None
    n = min(cands, key=lambda k: (cands[k], k != auto_splits))
    return n, cands[n]


def split_table_json(res: dict[str, Any]) -> dict[str, Any]:
    """What --write-splits writes: {"splits": {T: num_splits}} (+ where it was measured), the format
    ops.sparse_mla.parse_split_table reads."""
    return {"gpu": res.get("gpu"), "date": res.get("date"), "commit": res.get("commit"),
            "source": "glm5-fastpath bench sparse-mla --splits",
            "splits": {str(r["T"]): r["best_splits"] for r in res.get("rows", []) if r.get("best_splits")}}


def floor_bytes(t: int, k: int, h: int) -> int:
    """Bytes one call must move: the gathered KV rows, q, o and the slot table."""
    return t * k * D_QK * 2 + t * h * D_QK * 2 + t * h * D_V * 2 + t * k * 4


def reference(q, kv, idx, sm_scale: float, d_v: int = D_V):
    """The project's reference (ref.attn_core.sparse_mla_flat: valid slots only, zeros for an empty row)."""
    from ..ref.attn_core import sparse_mla_flat

    return sparse_mla_flat(q, kv, idx, sm_scale, d_v)


def _stock_fn() -> tuple[Callable | None, str]:
    try:
        from sgl_kernel.flash_mla import flash_mla_sparse_fwd
    except Exception as e:  # noqa: BLE001 - report why the stock column is empty
        return None, f"sgl_kernel.flash_mla not importable: {type(e).__name__}: {e}"

    def stock(q, kv, idx, scale):
        o, _, _ = flash_mla_sparse_fwd(q=q, kv=kv, indices=idx.unsqueeze(1), sm_scale=scale, d_v=D_V)
        return o

    return stock, "sgl_kernel.flash_mla.flash_mla_sparse_fwd"


def run(a: argparse.Namespace) -> dict[str, Any]:
    import torch

    from ..config import Glm5Config
    from ..ops import sparse_mla as SM
    from ..testing.numerics import rel_err
    from .meta import git_commit, utc_now
    from .timing import measure_copy_bandwidth, time_launches

    tokens = validate(a)
    dev = torch.device("cuda", torch.cuda.current_device())
    g = torch.Generator(device=dev).manual_seed(a.seed)
    scale = float(Glm5Config.preset("glm5").softmax_scale)
    kv = (torch.randn(a.kv_slots, 1, D_QK, device=dev, generator=g) * 0.5).to(torch.bfloat16)
    bw = measure_copy_bandwidth(dev)
    stock, stock_name = _stock_fn()
    rows = []
    for t in tokens:
        q = (torch.randn(t, a.heads, D_QK, device=dev, generator=g) * 0.5).to(torch.bfloat16)
        tables = [torch.stack([torch.randperm(a.kv_slots, device=dev, generator=g)[: a.topk] for _ in range(t)])
                  .to(torch.int32) for _ in range(a.tables)]
        ref = reference(q, kv, tables[0], scale)
        row: dict[str, Any] = {"T": t, "K": a.topk, "H": a.heads, "floor_bytes": floor_bytes(t, a.topk, a.heads)}
        row["floor_us"] = row["floor_bytes"] / (bw["bytes_per_s"]) * 1e6 if bw.get("bytes_per_s") else None
        paths = {"ours": lambda q_, idx: SM.sparse_mla_decode(q_, kv, idx, scale, D_V)}
        if stock is not None:
            paths["stock"] = lambda q_, idx: stock(q_, kv, idx, scale)
        for name, fn in paths.items():
            try:
                row[f"{name}_rel_l2"] = rel_err(fn(q, tables[0]), ref)
                tm = time_launches(lambda i, fn=fn: fn(q, tables[i % len(tables)]), len(tables), device=dev,
                                   replays=a.replays)
                row[f"{name}_us"] = tm.median_us
                row[f"{name}_timing"] = tm.method
            except Exception as e:  # noqa: BLE001 - one failing path must not lose the other's numbers
                row[f"{name}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        auto = SM.split_plan(t, a.heads, a.topk, torch.cuda.get_device_properties(dev).multi_processor_count)
        row["auto_splits"] = auto.num_splits
        for kern in parse_kernels(getattr(a, "kernels", "")):
            fn = lambda q_, idx, kern=kern: SM.sparse_mla_decode(q_, kv, idx, scale, D_V, kernel=kern)  # noqa: E731
            try:
                err = rel_err(fn(q, tables[0]), ref)
                if not err < 0.02:
                    raise RuntimeError(f"rel L2 {err:.4g} vs the reference")
                tm = time_launches(lambda i, fn=fn: fn(q, tables[i % len(tables)]), len(tables), device=dev,
                                   replays=a.replays)
                row.setdefault("ours_kernel_us", {})[kern] = tm.median_us
                row.setdefault("ours_kernel_rel_l2", {})[kern] = err
            except Exception as e:  # noqa: BLE001
                row[f"ours_kernel_{kern}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        skern = parse_kernels(getattr(a, "split_kernel", "")) or [None]
        row["split_kernel"] = skern[0]
        for n in parse_splits(getattr(a, "splits", "")):
            fn = lambda q_, idx, n=n: SM.sparse_mla_decode(q_, kv, idx, scale, D_V, num_splits=n,  # noqa: E731
                                                           kernel=skern[0])
            try:
                err = rel_err(fn(q, tables[0]), ref)
                if not err < 0.02:  # a wrong split must not win on speed
                    raise RuntimeError(f"rel L2 {err:.4g} vs the reference")
                tm = time_launches(lambda i, fn=fn: fn(q, tables[i % len(tables)]), len(tables), device=dev,
                                   replays=a.replays)
                row.setdefault("ours_split_us", {})[str(n)] = tm.median_us
            except Exception as e:  # noqa: BLE001
                row[f"ours_split{n}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        for st in parse_stages(getattr(a, "stages", "")):
            fn = lambda q_, idx, st=st: SM.sparse_mla_decode(q_, kv, idx, scale, D_V, stages=st)  # noqa: E731
            try:
                err = rel_err(fn(q, tables[0]), ref)
                if not err < 0.02:
                    raise RuntimeError(f"rel L2 {err:.4g} vs the reference")
                tm = time_launches(lambda i, fn=fn: fn(q, tables[i % len(tables)]), len(tables), device=dev,
                                   replays=a.replays)
                row.setdefault("ours_stages_us", {})[str(st)] = tm.median_us
                row.setdefault("ours_stages_auto_splits", {})[str(st)] = SM.split_plan(
                    t, a.heads, a.topk, torch.cuda.get_device_properties(dev).multi_processor_count,
                    SM.ctas_per_sm(st)).num_splits
                row.setdefault("ours_stages_rel_l2", {})[str(st)] = err
            except Exception as e:  # noqa: BLE001
                row[f"ours_stages{st}_error"] = f"{type(e).__name__}: {str(e)[:300]}"
        b = best_splits(row, auto.num_splits)
        if b is not None:
            row["best_splits"], row["best_us"] = b
        if row.get("ours_us") and row.get("stock_us"):
            row["stock_over_ours"] = row["stock_us"] / row["ours_us"]
        if row.get("ours_us") and row.get("floor_us"):
            row["ours_over_floor"] = row["ours_us"] / row["floor_us"]
        rows.append(row)
        print(f"[sparse-mla] T={t}: " + ", ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                                    for k, v in row.items() if k not in ("T",)), flush=True)
    return {"gpu": torch.cuda.get_device_name(dev), "date": utc_now(), "commit": git_commit(), "stock": stock_name,
            "copy_bandwidth": bw, "sm_scale": scale, "kv_slots": a.kv_slots, "rows": rows}


def markdown(res: dict[str, Any]) -> str:
    def f(x: Any, nd: int = 2) -> str:
        return "-" if x is None or (isinstance(x, float) and math.isnan(x)) else (f"{x:.{nd}f}" if isinstance(x, float) else str(x))

    lines = [f"# Sparse MLA decode core: ours vs FlashMLA ({res.get('gpu')}, {res.get('date')}, commit {res.get('commit')})",
             "", f"Stock: {res.get('stock')}. KV cache {res.get('kv_slots')} slots x 576 bf16; slots per token drawn at "
             "random (rows from HBM); CUDA-graph replay median per launch; floor at the measured copy bandwidth.", "",
             "| T | K | H | floor us | ours us | stock us | stock/ours | ours/floor | ours rel L2 | stock rel L2 |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in res.get("rows", []):
        lines.append(f"| {r['T']} | {r['K']} | {r['H']} | {f(r.get('floor_us'))} | {f(r.get('ours_us'))} | "
                     f"{f(r.get('stock_us'))} | {f(r.get('stock_over_ours'))} | {f(r.get('ours_over_floor'))} | "
                     f"{f(r.get('ours_rel_l2'), 4)} | {f(r.get('stock_rel_l2'), 4)} |")
    if any(r.get("ours_split_us") for r in res.get("rows", [])):
        ns = sorted({int(k) for r in res["rows"] for k in (r.get("ours_split_us") or {})})
        lines += ["", "num_splits sweep (ours, us; 'auto' = the op's heuristic, its split count in brackets):", "",
                  "| T | auto | " + " | ".join(f"{n}" for n in ns) + " | best splits | best us |",
                  "|---:|---:|" + "---:|" * len(ns) + "---:|---:|"]
        for r in res["rows"]:
            sw = r.get("ours_split_us") or {}
            lines.append(f"| {r['T']} | {f(r.get('ours_us'))} [{r.get('auto_splits')}] | "
                         + " | ".join(f(sw.get(str(n))) for n in ns)
                         + f" | {r.get('best_splits', '-')} | {f(r.get('best_us'))} |")
    if any(r.get("ours_stages_us") for r in res.get("rows", [])):
        sts = sorted({int(k) for r in res["rows"] for k in (r.get("ours_stages_us") or {})})
        lines += ["", "Split-kernel builds (ours, each build's own heuristic splits in brackets, us; the default build "
                  "is the 'ours us' column):", "",
                  "| T | default | " + " | ".join(f"stages={n}" for n in sts) + " |",
                  "|---:|---:|" + "---:|" * len(sts)]
        for r in res["rows"]:
            sw, sp = r.get("ours_stages_us") or {}, r.get("ours_stages_auto_splits") or {}
            lines.append(f"| {r['T']} | {f(r.get('ours_us'))} [{r.get('auto_splits', '-')}] | " + " | ".join(
                f"{f(sw.get(str(n)))} [{sp.get(str(n), '-')}]" for n in sts) + " |")
    if any(r.get("ours_kernel_us") for r in res.get("rows", [])):
        ks = list(dict.fromkeys(k for r in res["rows"] for k in (r.get("ours_kernel_us") or {})))
        lines += ["", "Split tiles (ours, us, each at its own heuristic splits; rel L2 vs the reference in brackets; "
                  "the op default is the 'ours us' column):", "",
                  "| T | default | " + " | ".join(ks) + " | stock | stock / best |",
                  "|---:|---:|" + "---:|" * len(ks) + "---:|---:|"]
        for r in res["rows"]:
            ku, ke = r.get("ours_kernel_us") or {}, r.get("ours_kernel_rel_l2") or {}
            best = min([v for v in [r.get("ours_us"), *ku.values()] if v is not None], default=None)
            ratio = r["stock_us"] / best if best and r.get("stock_us") else None
            lines.append(f"| {r['T']} | {f(r.get('ours_us'))} | " + " | ".join(
                f"{f(ku.get(k))} [{f(ke.get(k), 4)}]" for k in ks) + f" | {f(r.get('stock_us'))} | {f(ratio)} |")
    errs = [f"- T={r['T']} {k}: {v}" for r in res.get("rows", []) for k, v in r.items() if k.endswith("_error")]
    if errs:
        lines += ["", "Errors:", *errs]
    return "\n".join(lines) + "\n"


def main(a: argparse.Namespace) -> int:
    try:
        validate(a)
    except ValueError as e:
        print(e)
        return 2
    import torch

    if not torch.cuda.is_available():
        print("bench sparse-mla: needs a CUDA GPU (Hopper)")
        return 2
    res = run(a)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sparse_mla.json").write_text(json.dumps(res, indent=1, default=str))
    (out / "sparse_mla.md").write_text(markdown(res))
    if getattr(a, "write_splits", ""):
        tab = split_table_json(res)
        Path(a.write_splits).parent.mkdir(parents=True, exist_ok=True)
        Path(a.write_splits).write_text(json.dumps(tab, indent=1))
        print(f"wrote {a.write_splits}: splits {tab['splits']} (GLM5_FASTPATH_SPARSE_MLA_SPLITS={a.write_splits})")
    print(markdown(res))
    return 0
