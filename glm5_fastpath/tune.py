"""`glm5-fastpath tune`: measure the prefix executors per token bucket on this GPU and write a selection table.

For every bucket M it runs the CMP benchmark (attn_pre/cmp/bench.py: each CMP mode and SGLang's stock
kernel sequence, captured as CUDA graphs, inputs rotated past L2, median of replays) and picks, per
bucket, the fastest of: stock, and CMP in its fastest mode. A CMP mode has to beat stock by
`min_gain` (default 3 %) to be chosen: a tie within timing noise keeps SGLang's own path. The MoE
column stays "stock" until MegaMoE is built (issue #6); MegaRTP is not a candidate until its device
kernel exists (issue #5).

The table goes to --out (a JSON file for `--glm5-fastpath-config`); the measured report (JSON +
markdown) goes next to it, so every choice can be traced to the numbers that made it.
"""
from __future__ import annotations

import argparse
import datetime as _dt
import json
from pathlib import Path
from typing import Any, Mapping, Sequence

from .selection import SCHEMA_VERSION, STOCK, parse

DEFAULT_BUCKETS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
TUNE_MODES = ("serial", "multistream", "multistream_pdl_entry", "multistream_pdl_prologue", "full")  # candidates per bucket
MIN_GAIN = 0.03


def _median(x: Any) -> float | None:
    return x.get("median_us") if isinstance(x, dict) else None


def choose_prefix(row: Mapping[str, Any], min_gain: float = MIN_GAIN) -> tuple[str, str | None, str]:
    """(executor, cmp_mode or None, why) for one benchmark row {"M", "modes": {mode: {median_us}}, "stock"}."""
    cmp = {m: _median(t) for m, t in row.get("modes", {}).items() if _median(t) is not None}
    stock = _median(row.get("stock"))
    if not cmp:
        return STOCK, None, "no CMP mode ran"
    mode = min(cmp, key=cmp.get)
    if stock is None:
        return "cmp", mode, f"CMP {mode} {cmp[mode]:.2f} us; stock not measured"
    if cmp[mode] * (1.0 + min_gain) < stock:
        return "cmp", mode, f"CMP {mode} {cmp[mode]:.2f} us vs stock {stock:.2f} us ({stock / cmp[mode]:.2f}x)"
    return STOCK, None, f"stock {stock:.2f} us vs best CMP {mode} {cmp[mode]:.2f} us: no gain above {min_gain:.0%}"


def table_from_report(rep: Mapping[str, Any], gpu: Sequence[str], min_gain: float = MIN_GAIN,
                      commit: str = "unknown") -> dict[str, Any]:
    """The selection-table document for a CMP benchmark report; validated by selection.parse."""
    buckets, why = [], []
    for row in sorted(rep["rows"], key=lambda r: r["M"]):
        ex, mode, reason = choose_prefix(row, min_gain)
        entry: dict[str, Any] = {"tokens": int(row["M"]), "prefix": ex, "moe": STOCK}
        if ex == "cmp" and mode != "full":
            entry["cmp_mode"] = mode
        buckets.append(entry)
        why.append(f"M<={row['M']}: {reason}")
    doc = {"version": SCHEMA_VERSION, "gpu": list(gpu),
           "comment": (f"glm5-fastpath tune on {rep.get('device', '?')}, {_dt.date.today().isoformat()}, commit "
                       f"{commit}, KV {rep.get('kv_len')} per sequence. MoE stays stock until MegaMoE lands. "
                       + "; ".join(why)),
           "buckets": buckets}
    parse(doc, "<tune>")  # never write a table the plugin would reject
    return doc


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--out", required=True, help="selection table JSON to write (pass it as --glm5-fastpath-config)")
    p.add_argument("--buckets", default=",".join(map(str, DEFAULT_BUCKETS)), help="token-count buckets")
    p.add_argument("--kv-len", type=int, default=8192, help="context length per sequence used for timing")
    p.add_argument("--config", default="glm5", help="model preset or config.json")
    p.add_argument("--min-gain", type=float, default=MIN_GAIN, help="CMP must beat stock by this fraction")
    p.add_argument("--replays", type=int, default=30)


def run(a: argparse.Namespace) -> int:
    import os

    import torch

    from .attn_pre.cmp.bench import bench_prefix
    from .config import Glm5Config

    if not torch.cuda.is_available():
        raise ValueError("tune measures kernels: it needs a CUDA GPU (sm_90)")
    cfg = Glm5Config.preset(a.config) if not a.config.endswith(".json") else Glm5Config.from_file(a.config)
    buckets = sorted({int(x) for x in a.buckets.split(",") if x})
    if not buckets or buckets[0] <= 0:
        raise ValueError(f"tune: --buckets must be positive integers, got {a.buckets!r}")
    out = Path(a.out)
    report_dir = out.with_suffix("")  # e.g. table.json -> table/ holding cmp_prefix.{json,md}
    rep = bench_prefix(cfg, TUNE_MODES, buckets, a.kv_len, report_dir, replays=a.replays, stock=True)
    name = torch.cuda.get_device_name()
    gpu = [tok for tok in name.replace("NVIDIA", "").split() if tok][:1] or [name]
    doc = table_from_report(rep, gpu, a.min_gain, commit=os.environ.get("GLM5_FASTPATH_COMMIT", "unknown"))
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=1) + "\n")
    print(f"glm5-fastpath tune: wrote {out} (report in {report_dir}/)")
    for b in doc["buckets"]:
        print(f"  M<={b['tokens']:>4}: prefix {b['prefix']}{':' + b['cmp_mode'] if 'cmp_mode' in b else ''}")
    return 0
