"""Scrape-side aggregation for `glm5-fastpath dashboard`: Prometheus text -> the JSON the page draws.

Parsing uses prometheus_client's text parser. Histograms are merged over all their label sets
(e.g. SGLang's model_name / is_streaming); percentiles use Prometheus' histogram_quantile rule
(linear interpolation inside the bucket). Between two scrapes the page shows the *window*
(bucket deltas since the previous scrape); with no new observations it shows the cumulative values.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

# SGLang's per-request latency histograms (sglang/srt/observability/metrics_collector.py, 0.5.23; see
# deploy/sglang_metrics.txt) and ours (glm5_fastpath/metrics.py).
LATENCY = {
    "ttft": "sglang:time_to_first_token_seconds",
    "itl": "sglang:inter_token_latency_seconds",
    "tpot": "sglang:request_time_per_output_token_seconds",
    "e2e": "sglang:e2e_request_latency_seconds",
}
GEN_TOKENS = "sglang:generation_tokens_total"
STEP = "glm5_fastpath_decode_step_seconds"
PATH = "glm5_fastpath_path_total"
SELECTED = "glm5_fastpath_selected_info"
QUANTILES = (0.5, 0.9, 0.99)


@dataclass
class Hist:
    buckets: dict = field(default_factory=dict)  # le (float, inf included) -> cumulative count
    sum: float = 0.0
    count: float = 0.0

    def minus(self, prev: "Hist | None") -> "Hist":
        if prev is None:
            return self
        return Hist({le: c - prev.buckets.get(le, 0.0) for le, c in self.buckets.items()},
                    self.sum - prev.sum, self.count - prev.count)


@dataclass
class Snapshot:
    ts: float
    hists: dict = field(default_factory=dict)  # (metric, group label value or "") -> Hist
    counters: dict = field(default_factory=dict)  # (metric, tuple(sorted labels)) -> value
    gauges: list = field(default_factory=list)  # (metric, labels, value)


def parse(text: str, ts: float, group_by: dict | None = None) -> Snapshot:
    """`group_by`: histogram name -> label to keep separate (e.g. STEP -> "bucket"); others merge."""
    from prometheus_client.parser import text_string_to_metric_families

    group_by = group_by if group_by is not None else {STEP: "bucket"}
    snap = Snapshot(ts)
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            name, labels, value = s.name, dict(s.labels), float(s.value)
            if fam.type == "histogram" and name in (fam.name + "_bucket", fam.name + "_sum", fam.name + "_count"):
                key = (fam.name, labels.get(group_by.get(fam.name, ""), ""))
                h = snap.hists.setdefault(key, Hist())
                if name.endswith("_bucket"):
                    le = float(labels["le"])
                    h.buckets[le] = h.buckets.get(le, 0.0) + value
                elif name.endswith("_sum"):
                    h.sum += value
                else:
                    h.count += value
            elif fam.type == "counter" and name.endswith("_total"):
                key = (name, tuple(sorted(labels.items())))
                snap.counters[key] = snap.counters.get(key, 0.0) + value
            elif fam.type in ("gauge", "unknown") and fam.name == SELECTED:
                snap.gauges.append((fam.name, labels, value))
    return snap


def quantile(q: float, h: Hist) -> float | None:
    """Prometheus histogram_quantile over cumulative buckets; None without observations."""
    items = sorted(h.buckets.items())
    if not items or items[-1][1] <= 0:
        return None
    total = items[-1][1]
    rank = q * total
    prev_le, prev_c = 0.0, 0.0
    for le, c in items:
        if c >= rank:
            if math.isinf(le):
                return prev_le  # the highest finite bound, as Prometheus does
            if c == prev_c:
                return le
            return prev_le + (le - prev_le) * (rank - prev_c) / (c - prev_c)
        prev_le, prev_c = le, c
    return prev_le


def summarize_hist(cur: Hist, prev: Hist | None) -> dict:
    win = cur.minus(prev)
    use, window = (win, True) if prev is not None and win.count > 0 else (cur, False)
    out = {f"p{int(q * 100)}": quantile(q, use) for q in QUANTILES}
    out.update(mean=(use.sum / use.count) if use.count > 0 else None, count=cur.count, window=window)
    return out


def _counter_sum(snap: Snapshot, name: str, **match) -> float:
    return sum(v for (n, labels), v in snap.counters.items()
               if n == name and all(dict(labels).get(k) == val for k, val in match.items()))


def summarize(cur: Snapshot, prev: Snapshot | None) -> dict:
    def ph(key):
        return prev.hists.get(key) if prev is not None else None

    latency = {k: summarize_hist(cur.hists.get((m, ""), Hist()), ph((m, ""))) for k, m in LATENCY.items()}
    dt = (cur.ts - prev.ts) if prev is not None else 0.0
    tokens = _counter_sum(cur, GEN_TOKENS)
    tps = (tokens - _counter_sum(prev, GEN_TOKENS)) / dt if prev is not None and dt > 0 else None

    def share(s: Snapshot | None) -> tuple[float, float]:
        return (_counter_sum(s, PATH, path="fast"), _counter_sum(s, PATH)) if s is not None else (0.0, 0.0)

    (f1, t1), (f0, t0) = share(cur), share(prev)
    if t1 - t0 > 0:
        fast_share = (f1 - f0) / (t1 - t0)
    else:
        fast_share = f1 / t1 if t1 > 0 else None
    reasons = {}
    for (n, labels), v in sorted(cur.counters.items()):
        if n == PATH:
            d = dict(labels)
            reasons[f"{d.get('path', '?')}/{d.get('reason', '?')}"] = v
    steps = {b: summarize_hist(h, ph((STEP, b))) for (m, b), h in cur.hists.items() if m == STEP}
    order = sorted(steps, key=lambda b: (not b.isdigit(), int(b) if b.isdigit() else 0, b))
    selected = sorted(({k: lab.get(k, "") for k in ("bucket", "prefix", "moe")} for _, lab, v in cur.gauges if v > 0),
                      key=lambda r: int(r["bucket"]) if r["bucket"].isdigit() else 1 << 30)
    return {"ts": cur.ts, "latency": latency, "tokens_per_s": tps, "generation_tokens": tokens,
            "fast_path_share": fast_share, "path_reasons": reasons,
            "step": {b: steps[b] for b in order}, "selected": selected}
