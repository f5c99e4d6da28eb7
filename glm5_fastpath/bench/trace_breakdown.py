"""Per-decode-step breakdown of a torch-profiler Chrome trace as SGLang writes it (issue #9).

    python -m glm5_fastpath.bench.trace_breakdown TRACE_OR_DIR [--out DIR] [--split auto|host-step|gpu-step|graph|gap]

Pure Python (json, gzip; no torch): runs on the CPU machine over a trace fetched from the GPU one.

What the trace holds (Kineto's Chrome-trace export, `*.trace.json.gz`):
- GPU activity: `cat` "kernel" / "gpu_memcpy" / "gpu_memset", `ts` / `dur` in microseconds, `args.stream`,
  `args.correlation`. Kernels replayed by a CUDA graph are listed one by one on their stream, and all of them
  carry the correlation id of the `cudaGraphLaunch` that replayed them (CUPTI gives graph nodes no launch call
  of their own).
- Host launch calls: `cat` "cuda_runtime" / "cuda_driver" (`cudaGraphLaunch`, `cudaLaunchKernel`,
  `cuLaunchKernelEx`, `cudaMemcpyAsync`, ...) with the same `args.correlation` (only with the CUDA activity).
- Host ranges (`cat` "user_annotation", only with the CPU activity): SGLang 0.5.14 opens one per forward
  pass in `ModelRunner.forward`, named `step[DECODE bs=B]` / `step[EXTEND bs=B toks=T]`
  (srt/model_executor/model_runner.py:2917, name built at :3256), and one per scheduler stage
  (`scheduler.recv_requests`, `scheduler.process_input_requests`, `scheduler.get_next_batch_to_run`,
  `scheduler.run_batch`, `scheduler.process_batch_result`; srt/utils/nvtx_utils.py emits them as
  `record_function` whenever a torch profiler is active). Kineto mirrors host ranges that launched GPU work
  as "gpu_user_annotation" events on the GPU timeline.

How steps are delimited (`--split auto` tries these in order, and says which one it used):
1. `host-step`: each host `step[...]` range; the step's GPU start is the first GPU activity whose
   correlation id belongs to a launch call inside that range (the graph replay and the input copies before it).
2. `gpu-step`: the GPU-side mirror of those ranges (`gpu_user_annotation` named `step[...]`), start = its ts.
3. `graph`: each `cudaGraphLaunch` / `cuGraphLaunch` call with GPU work; start = its first kernel.
4. `gap`: GPU idle gaps of at least `--gap-us` (default: half the largest gap, at least 5 us) on the union
   of all streams.
Step i's window is [start_i, start_{i+1}): every GPU activity that starts in it is charged to step i, which
therefore includes the sampling / logits kernels and copies that follow the forward. The last window has no
next start, so it is reported but marked incomplete and left out of the summary; GPU activity before the
first start (the tail of a step launched before the profiler started) is dropped. Busy time in a window counts
all activity running in it, also activity that started in the window before. When the step names carry a
forward mode, the summary keeps only DECODE steps.

Per step: window (the GPU step period), GPU busy (union of all activity over every stream), idle (window -
busy) split into the gap before the next step's first kernel ("between steps") and the gaps inside the step,
busy time per category (sum of activity durations; overlapping streams can make the sum exceed the union),
and, when the trace has launch calls, the host side: the interval between the first launch calls of
consecutive steps (the CPU's step period, scheduler overhead included), how long the GPU sat drained before
the host launched the next step, the host `step[...]` span, and the time in each `scheduler.*` range of the
host loop iteration (from the `scheduler.run_batch` around one step's range to the next one's).
"""
from __future__ import annotations

import argparse
import bisect
import gzip
import json
import re
import statistics
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Sequence

CATEGORIES = ("ours", "flashmla", "deepgemm", "triton", "nccl", "cublas", "sampling", "aten", "memcpy", "other")
CATEGORY_HELP = {
    "ours": "glm5_fastpath kernels (names glm5_*)",
    "flashmla": "FlashMLA (flash_mla / sparse / splitkv_mla / mla_combine)",
    "deepgemm": "DeepGEMM (deep_gemm / fp8_gemm / sm90_fp8 / mqa_logits / mega_moe)",
    "triton": "Triton (triton_* / fused_moe / plain identifier names that no other rule took)",
    "nccl": "NCCL",
    "cublas": "cuBLAS / CUTLASS GEMMs (gemm / cutlass / cublas / nvjet / xmma)",
    "sampling": "sampling / logits (sampling / argmax / softmax / penalt / logit)",
    "aten": "torch elementwise / reduce / copy kernels (at::native / at::cuda)",
    "memcpy": "memcpy / memset activity",
    "other": "everything else (flashinfer, sgl-kernel, ...)",
}
SPLIT_METHODS = ("auto", "host-step", "gpu-step", "graph", "gap")
GPU_CATS = {"kernel", "gpu_memcpy", "gpu_memset", "memcpy", "memset", "concurrent kernel"}
LAUNCH_CATS = {"cuda_runtime", "cuda_driver", "runtime", "driver"}
HOST_ANNOT_CATS = {"user_annotation"}
GPU_ANNOT_CATS = {"gpu_user_annotation"}
STEP_RE = re.compile(r"^step\[\s*([A-Za-z_]+)(?:\s+bs=(\d+))?")
SCHED_PREFIX = "scheduler."
TOP_K = 25
GAPS_KEPT = 8

_PLAIN_ID = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


def category(name: str, cat: str = "kernel") -> str:
    """Category of one GPU activity (first rule that matches, in CATEGORIES order with memcpy first)."""
    c = (cat or "").lower()
    if "memcpy" in c or "memset" in c:
        return "memcpy"
    n = name or ""
    lo = n.lower()
    if lo.startswith("glm5_") or "glm5_fastpath" in lo or re.search(r"\bglm5_", lo):
        return "ours"
    if "nccl" in lo:
        return "nccl"
    if any(k in lo for k in ("flash_mla", "flashmla", "splitkv_mla", "mla_combine", "sparse")):
        return "flashmla"
    if any(k in lo for k in ("deep_gemm", "deepgemm", "fp8_gemm", "sm90_fp8", "mqa_logits", "mega_moe",
                             "m_grouped")):
        return "deepgemm"
    if any(k in lo for k in ("sampling", "argmax", "softmax", "penalt", "logit")):
        return "sampling"
    if any(k in lo for k in ("gemm", "cutlass", "cublas", "nvjet", "xmma")):
        return "cublas"
    if "triton" in lo or "fused_moe" in lo:
        return "triton"
    if "at::native" in n or "at::cuda" in n or lo.startswith("void at::"):
        return "aten"
    if _PLAIN_ID.match(n):  # Triton kernels carry their Python function's plain name; CUDA C++ ones a signature
        return "triton"
    return "other"


# ---- parsing -----------------------------------------------------------------------------------------------

@dataclass
class GpuOp:
    name: str
    cat: str
    ts: float
    dur: float
    stream: Any = None
    corr: Any = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class HostEv:
    name: str
    cat: str
    ts: float
    dur: float
    corr: Any = None
    tid: Any = None

    @property
    def end(self) -> float:
        return self.ts + self.dur


@dataclass
class Trace:
    gpu: list[GpuOp] = field(default_factory=list)
    launches: list[HostEv] = field(default_factory=list)
    host_annotations: list[HostEv] = field(default_factory=list)
    gpu_annotations: list[HostEv] = field(default_factory=list)
    events_total: int = 0
    events_skipped: int = 0


def load_trace(path: str | Path) -> Any:
    """The parsed JSON of a Chrome trace (.json or .json.gz; gzip detected by magic bytes, not the name)."""
    p = Path(path)
    raw = p.read_bytes()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
    return json.loads(raw.decode("utf-8", errors="replace"))


def _num(x: Any) -> float | None:
    if isinstance(x, bool):
        return None
    if isinstance(x, (int, float)):
        return float(x)
    if isinstance(x, str):
        try:
            return float(x)
        except ValueError:
            return None
    return None


def parse_events(obj: Any) -> Trace:
    """Sort a trace's events into GPU activity, launch calls and annotations; events missing what their kind
    needs (ts; name for annotations) are counted as skipped, never raised on."""
    evs = obj.get("traceEvents", []) if isinstance(obj, dict) else obj if isinstance(obj, list) else []
    tr = Trace()
    for e in evs:
        tr.events_total += 1
        if not isinstance(e, dict):
            tr.events_skipped += 1
            continue
        ph = e.get("ph", "X")
        if ph not in ("X", None):  # metadata, flow (s/f), instant and counter events carry no span
            continue
        cat = str(e.get("cat") or "").lower()
        if not cat:
            continue
        ts, dur = _num(e.get("ts")), _num(e.get("dur"))
        if ts is None:
            tr.events_skipped += 1
            continue
        dur = max(dur or 0.0, 0.0)
        args = e.get("args") if isinstance(e.get("args"), dict) else {}
        name = str(e.get("name") or "")
        corr = args.get("correlation", args.get("correlation id"))
        if cat in GPU_CATS:
            if ts <= 0:  # Kineto writes ts=0 for activity it could not time
                tr.events_skipped += 1
                continue
            tr.gpu.append(GpuOp(name or "<unnamed>", cat, ts, dur, args.get("stream", e.get("tid")), corr))
        elif cat in LAUNCH_CATS:
            tr.launches.append(HostEv(name, cat, ts, dur, corr, e.get("tid")))
        elif cat in HOST_ANNOT_CATS and name:
            tr.host_annotations.append(HostEv(name, cat, ts, dur, None, e.get("tid")))
        elif cat in GPU_ANNOT_CATS and name:
            tr.gpu_annotations.append(HostEv(name, cat, ts, dur, None, e.get("tid")))
    for lst in (tr.gpu, tr.launches, tr.host_annotations, tr.gpu_annotations):
        lst.sort(key=lambda x: x.ts)
    return tr


# ---- step split --------------------------------------------------------------------------------------------

@dataclass
class StepMark:
    gpu_start: float
    mode: str | None = None
    bs: int | None = None
    launch_ts: float | None = None  # first launch call of the step (host clock)
    graph_launches: int = 0
    graph_launch_call_us: float | None = None  # host time inside the step's graph-launch calls (cudaGraphLaunch)
    host_step_us: float | None = None  # the host step[...] range's duration
    host_anchor: float | None = None  # start of the host loop iteration (enclosing scheduler.run_batch, else launch)


def _step_name(name: str) -> tuple[str | None, int | None] | None:
    m = STEP_RE.match(name)
    if not m:
        return None
    return m.group(1).upper(), (int(m.group(2)) if m.group(2) else None)


def _first_gpu_by_corr(tr: Trace) -> dict[Any, float]:
    first: dict[Any, float] = {}
    for g in tr.gpu:
        if g.corr is None:
            continue
        if g.corr not in first or g.ts < first[g.corr]:
            first[g.corr] = g.ts
    return first


def _is_graph_launch(name: str) -> bool:
    return "graphlaunch" in name.lower()


def marks_host_step(tr: Trace) -> list[StepMark]:
    steps = [(a, _step_name(a.name)) for a in tr.host_annotations]
    steps = [(a, s) for a, s in steps if s is not None]
    if not steps or not tr.launches:
        return []
    first = _first_gpu_by_corr(tr)
    lts = [x.ts for x in tr.launches]
    run_batch = [r for r in tr.host_annotations if r.name == SCHED_PREFIX + "run_batch"]
    out = []
    for a, (mode, bs) in steps:
        lo, hi = bisect.bisect_left(lts, a.ts), bisect.bisect_right(lts, a.end)
        own = [x for x in tr.launches[lo:hi] if x.corr is not None and x.corr in first]
        if not own:
            continue
        encl = [r.ts for r in run_batch if r.ts <= a.ts and r.end >= a.end and r.tid == a.tid]
        out.append(StepMark(gpu_start=min(first[x.corr] for x in own), mode=mode, bs=bs,
                            launch_ts=min(x.ts for x in own),
                            graph_launches=sum(1 for x in own if _is_graph_launch(x.name)),
                            graph_launch_call_us=sum(x.dur for x in own if _is_graph_launch(x.name)) or None,
                            host_step_us=a.dur,
                            host_anchor=max(encl) if encl else a.ts))
    return out


def marks_gpu_step(tr: Trace) -> list[StepMark]:
    out = []
    for a in tr.gpu_annotations:
        s = _step_name(a.name)
        if s is not None:
            out.append(StepMark(gpu_start=a.ts, mode=s[0], bs=s[1]))
    return out


def marks_graph(tr: Trace) -> list[StepMark]:
    first = _first_gpu_by_corr(tr)
    return [StepMark(gpu_start=first[x.corr], launch_ts=x.ts, graph_launches=1)
            for x in tr.launches if _is_graph_launch(x.name) and x.corr is not None and x.corr in first]


def busy_intervals(ops: Iterable[GpuOp], lo: float = float("-inf"), hi: float = float("inf")) -> list[list[float]]:
    """Union of [ts, end) over ops, clipped to [lo, hi), as sorted disjoint intervals."""
    iv = sorted((max(o.ts, lo), min(o.end, hi)) for o in ops if o.end > lo and o.ts < hi)
    out: list[list[float]] = []
    for a, b in iv:
        if b < a:
            continue
        if out and a <= out[-1][1]:
            out[-1][1] = max(out[-1][1], b)
        else:
            out.append([a, b])
    return out


def _exposed_charges(ops: Sequence[GpuOp], lo: float, hi: float) -> list[float]:
    """Per activity (index into ops): its share of the busy time of [lo, hi), charged as exposed_time says."""
    import heapq

    evs = sorted((max(o.ts, lo), min(o.end, hi), k) for k, o in enumerate(ops) if min(o.end, hi) > max(o.ts, lo))
    out = [0.0] * len(ops)
    running: list[tuple[float, int, int]] = []  # (end, start order: a tie goes to the earlier start, index)
    i, t, n = 0, None, len(evs)
    while i < n or running:
        if not running:
            t = evs[i][0]
        while i < n and evs[i][0] <= t:
            heapq.heappush(running, (evs[i][1], i, evs[i][2]))
            i += 1
        end, _, k = running[0]
        nxt = min(end, evs[i][0]) if i < n else end
        out[k] += nxt - t
        t = nxt
        while running and running[0][0] <= t:
            heapq.heappop(running)
    return out


def exposed_time(ops: Sequence[GpuOp], lo: float = float("-inf"), hi: float = float("inf")) -> dict[str, float]:
    """Busy time of [lo, hi) charged to activities: every instant some activity runs goes to the running one
    that ENDS FIRST. The charges sum to the busy union. Why the first to end: with PDL a consumer is
    resident (and in the trace) from its early launch while it waits in griddepcontrol.wait, so its
    duration includes its producer's; charged this way the producer keeps its own time and the consumer
    gets only what it adds after its producer ends. Two streams running at once split the overlap the same
    way; an activity fully hidden behind a longer one costs nothing. Keyed by activity name."""
    out: dict[str, float] = {}
    for o, us in zip(ops, _exposed_charges(ops, lo, hi)):
        if us > 0 or o.name in out:
            out[o.name] = out.get(o.name, 0.0) + us
    return out


def _occurrence_keys(names: Iterable[str]) -> list[tuple[str, int]]:
    """(name, k) for the k-th occurrence of each name, in order: the key that lines activities up across steps or
    layers whose concurrent kernels start in another order."""
    seen: dict[str, int] = {}
    keys = []
    for n in names:
        keys.append((n, seen.get(n, 0)))
        seen[n] = seen.get(n, 0) + 1
    return keys


def _segment(rows: Sequence[dict], marker: str) -> tuple[list[int], dict[tuple, list[tuple[int, int]]]]:
    """Marker positions and the segments by kind: the multiset of activity names (concurrent kernels may start in
    another order from layer to layer)."""
    starts = [i for i, r in enumerate(rows) if r["name"] == marker]
    kinds: dict[tuple, list[tuple[int, int]]] = {}
    for a, b in zip(starts, starts[1:] + [len(rows)]):
        kinds.setdefault(tuple(sorted(r["name"] for r in rows[a:b])), []).append((a, b))
    return starts, kinds


def timeline_segments(rows: Sequence[dict], marker: str | None = None) -> dict | None:
    """The step timeline cut into repeating segments (decoder layers) at a marker activity: every occurrence of the
    marker starts a segment, rows before the first one are the step's head. Segments with the same activities (as a
    multiset: concurrent kernels may start in another order from layer to layer) form a kind (e.g. the MoE layers, the
    dense layer, the last layer with lm_head and sampling); per kind and activity (name, k-th occurrence in the
    segment), in median offset order: medians over its segments of offset from the segment's start, duration, exposed
    time and the idle gap before, and the kind's span (from its first activity to the next segment's first, or to its
    last activity's end). Auto marker (None): the activity (at least two per step) whose cut puts the most rows into
    one kind of two or more segments (segments x activities: long segments that repeat, i.e. layers rather than
    pieces of one), then the fewest kinds, then the most occurrences. None when nothing repeats or the marker is
    absent."""
    if not rows:
        return None
    counts: dict[str, int] = {}
    for r in rows:
        counts[r["name"]] = counts.get(r["name"], 0) + 1
    if marker is None:
        best = None
        for name, c in counts.items():
            if c < 2:
                continue
            _, kinds = _segment(rows, name)
            score = (max((len(v) * len(k) for k, v in kinds.items() if len(v) >= 2), default=0), -len(kinds), c)
            if best is None or score > best[0]:
                best = (score, name)
        if best is None:
            return None
        marker = best[1]
    starts, kinds = _segment(rows, marker)
    if not starts:
        return None
    out = []
    for segs in kinds.values():
        idx = [dict(zip(_occurrence_keys(r["name"] for r in rows[a:b]), range(a, b))) for a, b in segs]
        med: dict[tuple, dict[str, float]] = {}
        for key in idx[0]:
            got = [rows[m[key]] for m in idx]
            med[key] = {"offset_us": statistics.median(g["start_us"] - rows[a]["start_us"]
                                                        for g, (a, _) in zip(got, segs)),
                        **{c: statistics.median(g[c] for g in got) for c in ("dur_us", "exposed_us", "idle_us")},
                        "category": got[0]["category"]}
        order = sorted(med, key=lambda k: (med[k]["offset_us"], k))
        per = [{"pos": j, "name": k[0], **med[k]} for j, k in enumerate(order)]
        spans = [(rows[b]["start_us"] if b < len(rows) else max(r["end_us"] for r in rows[a:b])) - rows[a]["start_us"]
                 for a, b in segs]
        out.append({"segments": len(segs), "first": segs[0][0], "activities": len(per),
                    "span_us": statistics.median(spans), "exposed_us": sum(x["exposed_us"] for x in per),
                    "idle_us": sum(x["idle_us"] for x in per), "rows": per})
    out.sort(key=lambda k: k["first"])
    head = rows[:starts[0]]
    return {"marker": marker, "head_activities": len(head),
            "head_exposed_us": sum(r["exposed_us"] for r in head), "kinds": out}


def step_timeline(steps: Sequence[tuple[float, float, Sequence[GpuOp]]], layer_marker: str | None = None) -> dict | None:
    """One decode step's activities in median start order, each a median over the steps given ((gpu_start, end, ops) of
    complete steps): start and end offsets from the step's first activity, duration, exposed time (as exposed_time
    charges it) and the GPU idle time right before it (nothing running since the previous activities ended: a
    launch or dependency gap). Steps are aligned by (name, k-th occurrence in the step), so concurrent kernels that
    start in another order from step to step still line up; only steps with the most common set of those keys are
    used, and rows are in median start order; `segments` cuts the result into repeating segments (timeline_segments,
    at layer_marker). None without steps."""
    if not steps:
        return None
    # align the steps by (name, k-th occurrence in the step): concurrent kernels on several streams may start in
    # another order from step to step, so the key sets, not the start orders, must match
    keyed = []
    for lo, hi, ops in steps:
        ordered = sorted(ops, key=lambda o: (o.ts, o.end))
        keyed.append((lo, hi, ordered, {k: j for j, k in enumerate(_occurrence_keys(o.name for o in ordered))}))
    common: dict[frozenset, int] = {}
    for *_, idx in keyed:
        common[frozenset(idx)] = common.get(frozenset(idx), 0) + 1
    keyset = max(common, key=lambda k: (common[k], len(k)))
    used = [(lo, hi, ordered, idx) for lo, hi, ordered, idx in keyed if frozenset(idx) == keyset]
    keys = list(keyset)
    cols: dict[str, dict] = {c: {k: [] for k in keys} for c in ("start", "end", "dur", "exposed", "idle")}
    for lo, hi, ordered, idx in used:
        charges = _exposed_charges(ordered, lo, hi)
        idle, reach = [0.0] * len(ordered), lo
        for j, o in enumerate(ordered):
            idle[j] = max(o.ts - reach, 0.0)
            reach = max(reach, o.end)
        for k in keys:
            j = idx[k]
            o = ordered[j]
            cols["start"][k].append(o.ts - lo)
            cols["end"][k].append(o.end - lo)
            cols["dur"][k].append(o.dur)
            cols["exposed"][k].append(charges[j])
            cols["idle"][k].append(idle[j])
    med = {c: {k: statistics.median(v) for k, v in cols[c].items()} for c in cols}
    keys.sort(key=lambda k: (med["start"][k], med["end"][k], k))
    first = used[0][2]
    streams = sorted({str(o.stream) for o in first})
    rows = []
    for pos, k in enumerate(keys):
        o = first[used[0][3][k]]
        rows.append({"pos": pos, "name": k[0], "category": category(o.name, o.cat),
                     "stream": streams.index(str(o.stream)), **{f"{c}_us": med[c][k] for c in med}})
    return {"steps_used": len(used), "steps_given": len(steps), "activities": len(keys),
            "streams": len(streams), "rows": rows, "layer_marker": layer_marker,
            "segments": timeline_segments(rows, layer_marker)}


def _clip(iv: list[list[float]], starts: list[float], lo: float, hi: float) -> list[list[float]]:
    """The part of sorted disjoint intervals iv (starts = their starts) inside [lo, hi)."""
    out = []
    j = max(bisect.bisect_right(starts, lo) - 1, 0)
    while j < len(iv) and iv[j][0] < hi:
        a, b = max(iv[j][0], lo), min(iv[j][1], hi)
        if b > a:
            out.append([a, b])
        j += 1
    return out


def marks_gap(tr: Trace, gap_us: float | None = None) -> list[StepMark]:
    iv = busy_intervals(tr.gpu)
    gaps = [iv[i + 1][0] - iv[i][1] for i in range(len(iv) - 1)]
    if not gaps:
        return []
    thr = gap_us if gap_us is not None else max(5.0, 0.5 * max(gaps))
    # the first busy interval may be the tail of a step launched before the profiler started: not a start
    return [StepMark(gpu_start=iv[i + 1][0]) for i, g in enumerate(gaps) if g >= thr]


def _attach_launches(tr: Trace, marks: list[StepMark]) -> None:
    """For marks found without host ranges: the launch call of each step's first GPU activity, if recorded."""
    if not tr.launches:
        return
    by_corr = {x.corr: x for x in tr.launches if x.corr is not None}
    starts = {m.gpu_start: m for m in marks if m.launch_ts is None}
    for g in tr.gpu:
        m = starts.get(g.ts)
        if m is not None and g.corr in by_corr:
            m.launch_ts = by_corr[g.corr].ts
            m.graph_launches = max(m.graph_launches, int(_is_graph_launch(by_corr[g.corr].name)))


def split_steps(tr: Trace, method: str = "auto", gap_us: float | None = None) -> tuple[str, list[StepMark]]:
    if method not in SPLIT_METHODS:
        raise ValueError(f"split method must be one of {SPLIT_METHODS}, got {method!r}")
    order = ("host-step", "gpu-step", "graph", "gap") if method == "auto" else (method,)
    for m in order:
        if m == "host-step":
            marks = marks_host_step(tr)
        elif m == "gpu-step":
            marks = marks_gpu_step(tr)
        elif m == "graph":
            marks = marks_graph(tr)
        else:
            marks = marks_gap(tr, gap_us)
        if marks:
            marks.sort(key=lambda s: s.gpu_start)
            dedup: list[StepMark] = []
            for s in marks:
                if dedup and s.gpu_start <= dedup[-1].gpu_start:
                    continue
                dedup.append(s)
            if m in ("gpu-step", "gap"):
                _attach_launches(tr, dedup)
            return m, dedup
    return "none", []


# ---- analysis ----------------------------------------------------------------------------------------------

def _stats(xs: Sequence[float]) -> dict[str, float] | None:
    if not xs:
        return None
    return {"p50": statistics.median(xs), "mean": sum(xs) / len(xs), "min": min(xs), "max": max(xs)}


def _drop_private(res: dict) -> None:
    for s in res["steps"]:
        for k in [k for k in s if k.startswith("_")]:
            del s[k]


def analyze(obj: Any, *, method: str = "auto", gap_us: float | None = None, top_k: int = TOP_K,
            source: str | None = None, layer_marker: str | None = None) -> dict:
    """The breakdown of one parsed trace (see the module docstring). Times in microseconds."""
    tr = parse_events(obj)
    used, marks = split_steps(tr, method, gap_us)
    res: dict[str, Any] = {
        "source": source, "split": used, "events_total": tr.events_total, "events_skipped": tr.events_skipped,
        "gpu_activities": len(tr.gpu), "launch_calls": len(tr.launches),
        "has_host_annotations": bool(tr.host_annotations), "categories": list(CATEGORIES),
        "category_rules": CATEGORY_HELP, "steps": [], "summary": None, "top_kernels": [], "largest_gaps": [],
        "warnings": [],
    }
    if not tr.gpu:
        res["warnings"].append("no GPU activity (kernel / gpu_memcpy / gpu_memset events) in the trace: "
                               "was the profile taken with the GPU activity?")
        return res
    if not marks:
        res["warnings"].append("could not delimit any step (no step annotations, graph launches or gaps)")
        return res
    gpu_ts = [g.ts for g in tr.gpu]
    sched = [a for a in tr.host_annotations if a.name.startswith(SCHED_PREFIX) or _step_name(a.name)]
    sched_ts = [a.ts for a in sched]
    per_step_ops: list[list[GpuOp]] = []
    all_iv = busy_intervals(tr.gpu)  # activity that started in an earlier window but runs on counts as busy here
    iv_starts = [a for a, _ in all_iv]
    for i, mk in enumerate(marks):
        nxt = marks[i + 1] if i + 1 < len(marks) else None
        lo = bisect.bisect_left(gpu_ts, mk.gpu_start)
        hi = bisect.bisect_left(gpu_ts, nxt.gpu_start) if nxt else len(tr.gpu)
        ops = tr.gpu[lo:hi]
        end = nxt.gpu_start if nxt else max((o.end for o in ops), default=mk.gpu_start)
        iv = _clip(all_iv, iv_starts, mk.gpu_start, max(end, mk.gpu_start))
        busy = sum(b - a for a, b in iv)
        window = end - mk.gpu_start
        last_end = iv[-1][1] if iv else mk.gpu_start
        cats = {c: 0.0 for c in CATEGORIES}
        for o in ops:
            cats[category(o.name, o.cat)] += o.dur
        gaps = [(iv[j + 1][0] - iv[j][1], iv[j][1], iv[j + 1][0]) for j in range(len(iv) - 1)]
        st: dict[str, Any] = {
            "index": i, "mode": mk.mode, "bs": mk.bs, "complete": nxt is not None,
            "gpu_start_us": mk.gpu_start - marks[0].gpu_start, "window_us": window, "busy_us": busy,
            "idle_us": max(window - busy, 0.0), "idle_between_steps_us": max(end - last_end, 0.0) if nxt else None,
            "idle_inside_step_us": sum(g for g, _, _ in gaps), "activities": len(ops),
            "kernels": sum(1 for o in ops if category(o.name, o.cat) != "memcpy"),
            "streams": len({o.stream for o in ops}), "graph_launches": mk.graph_launches, "category_us": cats,
        }
        host: dict[str, Any] = {}
        if mk.launch_ts is not None:
            host["launch_to_gpu_start_us"] = mk.gpu_start - mk.launch_ts
            if nxt is not None and nxt.launch_ts is not None:
                host["launch_interval_us"] = nxt.launch_ts - mk.launch_ts
                host["gpu_drained_before_next_launch_us"] = max(nxt.launch_ts - last_end, 0.0)
                a0 = mk.host_anchor if mk.host_anchor is not None else mk.launch_ts
                a1 = nxt.host_anchor if nxt.host_anchor is not None else nxt.launch_ts
                a, b = bisect.bisect_left(sched_ts, a0), bisect.bisect_left(sched_ts, a1)
                per: dict[str, float] = {}
                for ev in sched[a:b]:
                    key = "step[...]" if _step_name(ev.name) else ev.name
                    per[key] = per.get(key, 0.0) + ev.dur
                if per:
                    host["annotated_us"] = per
        if mk.host_step_us is not None:
            host["host_step_us"] = mk.host_step_us
        if mk.graph_launch_call_us is not None:
            host["graph_launch_call_us"] = mk.graph_launch_call_us
        if host:
            st["host"] = host
        st["_gaps"], st["_last_end"] = gaps, last_end
        st["_exposed"] = exposed_time(ops, mk.gpu_start, end)
        res["steps"].append(st)
        per_step_ops.append(ops)
    # summary over complete steps (DECODE only when the split knows the mode)
    done = [s for s in res["steps"] if s["complete"]]
    if any(s["mode"] for s in done):
        other = [s for s in done if s["mode"] != "DECODE"]
        if other:
            res["warnings"].append(f"{len(other)} complete step(s) not DECODE left out of the summary: "
                                   + ", ".join(sorted({str(s['mode']) for s in other})))
        done = [s for s in done if s["mode"] == "DECODE"]
    if not done:
        res["warnings"].append("no complete step to summarize (a step needs the next step's start to close it: "
                               "profile at least 2 steps)")
        _drop_private(res)
        return res
    if res["split"] == "gap":
        res["warnings"].append("steps split by GPU idle gaps (no step annotations or graph launches): check "
                               "the kernels per step against the model before trusting the split")
    ks = {s["kernels"] for s in done}
    if len(ks) > 1:
        res["warnings"].append(f"kernels per step differ between steps ({sorted(ks)}): the split or the "
                               "profile window may be uneven")
    n = len(done)
    win = [s["window_us"] for s in done]
    summ: dict[str, Any] = {
        "steps": n, "steps_total": len(res["steps"]), "bs": sorted({s["bs"] for s in done if s["bs"]}) or None,
        "window_us": _stats(win), "busy_us": _stats([s["busy_us"] for s in done]),
        "idle_us": _stats([s["idle_us"] for s in done]),
        "idle_between_steps_us": _stats([s["idle_between_steps_us"] for s in done]),
        "idle_inside_step_us": _stats([s["idle_inside_step_us"] for s in done]),
        "kernels_per_step": _stats([float(s["kernels"]) for s in done]),
        "category_us": {c: _stats([s["category_us"][c] for s in done]) for c in CATEGORIES},
    }
    summ["busy_fraction"] = summ["busy_us"]["p50"] / summ["window_us"]["p50"] if summ["window_us"]["p50"] else None
    hosts = [s.get("host", {}) for s in done]
    for k in ("launch_interval_us", "gpu_drained_before_next_launch_us", "launch_to_gpu_start_us", "host_step_us",
              "graph_launch_call_us"):
        v = [h[k] for h in hosts if k in h]
        if v:
            summ.setdefault("host", {})[k] = _stats(v)
    ann_keys = sorted({k for h in hosts for k in h.get("annotated_us", {})})
    if ann_keys:
        summ.setdefault("host", {})["annotated_us"] = {
            k: _stats([h.get("annotated_us", {}).get(k, 0.0) for h in hosts if "annotated_us" in h]) for k in ann_keys}
    res["summary"] = summ
    # top kernels over the complete steps summarized
    agg: dict[str, dict[str, Any]] = {}
    busy_total = sum(s["busy_us"] for s in done)
    done_idx = {s["index"] for s in done}
    for s, ops in zip(res["steps"], per_step_ops):
        if s["index"] not in done_idx:
            continue
        for o in ops:
            a = agg.setdefault(o.name, {"name": o.name, "category": category(o.name, o.cat), "calls": 0, "total_us": 0.0})
            a["calls"] += 1
            a["total_us"] += o.dur
    for s in done:
        for name, us in s["_exposed"].items():
            if name in agg:
                agg[name]["exposed_total_us"] = agg[name].get("exposed_total_us", 0.0) + us
    for a in agg.values():
        a["calls_per_step"] = a["calls"] / n
        a["us_per_step"] = a["total_us"] / n
        a["mean_us"] = a["total_us"] / a["calls"]
        a["pct_of_busy"] = 100 * a["total_us"] / busy_total if busy_total else None
        a["exposed_us_per_step"] = a.pop("exposed_total_us", 0.0) / n
    res["top_kernels"] = sorted(agg.values(), key=lambda a: -a["total_us"])[:max(top_k, 0)]
    res["top_exposed"] = [dict(a) for a in sorted(agg.values(), key=lambda a: -a["exposed_us_per_step"])[:max(top_k, 0)]]
    # largest idle gaps inside / between the summarized steps, with the activity on either side
    ends = {}
    for ops in per_step_ops:
        for o in ops:
            ends.setdefault(round(o.end, 3), o.name)
    starts = {round(o.ts, 3): o.name for ops in per_step_ops for o in ops}
    gl = []
    for s in done:
        for g, a, b in s["_gaps"]:
            gl.append({"step": s["index"], "gap_us": g, "where": "inside", "after": ends.get(round(a, 3)),
                       "before": starts.get(round(b, 3))})
        if s["idle_between_steps_us"]:
            gl.append({"step": s["index"], "gap_us": s["idle_between_steps_us"], "where": "between steps",
                       "after": ends.get(round(s["_last_end"], 3)),
                       "before": starts.get(round(marks[s["index"] + 1].gpu_start, 3))})
    res["largest_gaps"] = sorted(gl, key=lambda g: -g["gap_us"])[:GAPS_KEPT]
    windows = []
    for s, ops in zip(res["steps"], per_step_ops):
        if s["index"] in done_idx:
            windows.append((marks[s["index"]].gpu_start, marks[s["index"] + 1].gpu_start, ops))
    res["timeline"] = step_timeline(windows, layer_marker)
    _drop_private(res)
    return res


def find_traces(path: str | Path) -> list[Path]:
    """A trace file, or the trace files in a directory (SGLang's `*.trace.json.gz`, else any *.json[.gz])."""
    p = Path(path)
    if p.is_file():
        return [p]
    if not p.is_dir():
        raise FileNotFoundError(f"{p}: no such trace file or directory")
    got = sorted(p.glob("*.trace.json.gz")) + sorted(p.glob("*.trace.json"))
    if not got:
        got = sorted(x for x in p.glob("*.json*") if x.name.endswith((".json", ".json.gz"))
                     and not x.name.startswith("breakdown"))
    return got


def analyze_file(path: str | Path, **kw: Any) -> dict:
    return analyze(load_trace(path), source=str(path), **kw)


# ---- rendering ---------------------------------------------------------------------------------------------

def _ms(x: float | None, nd: int = 3) -> str:
    return "-" if x is None else f"{x / 1e3:.{nd}f}"


def _p50(d: dict | None) -> float | None:
    return None if not d else d.get("p50")


def _short(name: str, n: int = 90) -> str:
    name = name.replace("|", "\\|")
    return name if len(name) <= n else name[: n - 3] + "..."


def summary_lines(res: dict) -> list[str]:
    """A few lines that say where a step's time goes (used by the offline report too)."""
    s = res.get("summary")
    if not s:
        return ["no summary: " + "; ".join(res.get("warnings") or ["no steps"])]
    w, b, i = _p50(s["window_us"]), _p50(s["busy_us"]), _p50(s["idle_us"])
    lines = [f"{s['steps']} complete step(s) of {s['steps_total']} (split: {res['split']}), batch {s.get('bs') or '?'}: "
             f"step {_ms(w)} ms p50, GPU busy {_ms(b)} ms ({100 * (s.get('busy_fraction') or 0):.0f} %), "
             f"idle {_ms(i)} ms = {_ms(_p50(s['idle_between_steps_us']))} between steps + "
             f"{_ms(_p50(s['idle_inside_step_us']))} inside the step"]
    h = s.get("host") or {}
    if h:
        parts = []
        if "launch_interval_us" in h:
            parts.append(f"host launch interval {_ms(_p50(h['launch_interval_us']))} ms")
        if "gpu_drained_before_next_launch_us" in h:
            parts.append(f"GPU drained before the next launch {_ms(_p50(h['gpu_drained_before_next_launch_us']))} ms")
        if "host_step_us" in h:
            parts.append(f"host forward span {_ms(_p50(h['host_step_us']))} ms")
        if "graph_launch_call_us" in h:  # the profiler lengthens it too (CUPTI records every node of the graph)
            parts.append(f"in graph-launch calls {_ms(_p50(h['graph_launch_call_us']))} ms")
        if parts:
            lines.append("host (p50): " + ", ".join(parts))
    return lines


def render_markdown(res: dict, title: str | None = None) -> str:
    lines = [f"# {title or 'Decode-step breakdown'}", ""]
    if res.get("source"):
        lines.append(f"- trace: `{res['source']}`")
    lines.append(f"- events: {res['events_total']} ({res['gpu_activities']} GPU activities, {res['launch_calls']} "
                 f"launch calls, {res['events_skipped']} skipped)")
    lines += ["- " + x for x in summary_lines(res)]
    for w in res.get("warnings") or []:
        lines.append(f"- warning: {w}")
    s = res.get("summary")
    if s:
        lines += ["", "| category | busy ms/step p50 | mean | % of step (p50) |", "|---|---:|---:|---:|"]
        w = _p50(s["window_us"]) or 0
        def pct(x: float | None) -> str:
            return f"{100 * x / w:.1f}" if (w and x is not None) else "-"

        for c in CATEGORIES:
            d = s["category_us"][c]
            if d and d["max"] > 0:
                lines.append(f"| {c} | {_ms(d['p50'])} | {_ms(d['mean'])} | {pct(d['p50'])} |")
        lines.append(f"| GPU idle | {_ms(_p50(s['idle_us']))} | {_ms(s['idle_us']['mean'])} | "
                     f"{pct(_p50(s['idle_us']))} |")
        h = (s.get("host") or {}).get("annotated_us")
        if h:
            lines += ["", "Host time per step interval (annotated ranges, p50 ms; `step[...]` is nested in "
                      "`scheduler.run_batch`):", "",
                      "| range | ms p50 | mean |", "|---|---:|---:|"]
            for k, d in h.items():
                lines.append(f"| {k} | {_ms(d['p50'])} | {_ms(d['mean'])} |")
    if res.get("steps"):
        cats = [c for c in CATEGORIES if any(st["category_us"][c] > 0 for st in res["steps"])]
        head = ["step", "mode", "bs", "complete", "window ms", "busy ms", "idle ms", "idle between ms",
                "host launch interval ms", "kernels"] + [f"{c} ms" for c in cats]
        lines += ["", "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for st in res["steps"]:
            hst = st.get("host") or {}
            cells = [str(st["index"]), str(st["mode"] or "-"), str(st["bs"] or "-"), "yes" if st["complete"] else "no",
                     _ms(st["window_us"]), _ms(st["busy_us"]), _ms(st["idle_us"]), _ms(st["idle_between_steps_us"]),
                     _ms(hst.get("launch_interval_us")), str(st["kernels"])]
            cells += [_ms(st["category_us"][c]) for c in cats]
            lines.append("| " + " | ".join(cells) + " |")
    if res.get("top_kernels"):
        lines += ["", f"Top {len(res['top_kernels'])} kernels (over the summarized steps):", "",
                  "| # | kernel | category | calls/step | us/step | mean us | % of busy |",
                  "|---:|---|---|---:|---:|---:|---:|"]
        for j, a in enumerate(res["top_kernels"], 1):
            pct = "-" if a["pct_of_busy"] is None else f"{a['pct_of_busy']:.1f}"
            lines.append(f"| {j} | `{_short(a['name'])}` | {a['category']} | {a['calls_per_step']:.1f} | "
                         f"{a['us_per_step']:.1f} | {a['mean_us']:.1f} | {pct} |")
    if res.get("top_exposed"):
        lines += ["", f"Top {len(res['top_exposed'])} kernels by exposed time (busy time charged to the running activity "
                  "that ends first, so a PDL consumer's wait stays with its producer and hidden overlap costs "
                  "nothing; the column sums to busy):", "",
                  "| # | kernel | category | calls/step | exposed us/step | duration us/step |",
                  "|---:|---|---|---:|---:|---:|"]
        for j, a in enumerate(res["top_exposed"], 1):
            lines.append(f"| {j} | `{_short(a['name'])}` | {a['category']} | {a['calls_per_step']:.1f} | "
                         f"{a['exposed_us_per_step']:.1f} | {a['us_per_step']:.1f} |")
    if res.get("largest_gaps"):
        lines += ["", "Largest GPU idle gaps:", "", "| step | gap us | where | after | before |",
                  "|---:|---:|---|---|---|"]
        for g in res["largest_gaps"]:
            lines.append(f"| {g['step']} | {g['gap_us']:.1f} | {g['where']} | `{_short(g['after'] or '?', 50)}` | "
                         f"`{_short(g['before'] or '?', 50)}` |")
    lines += ["", "Categories: " + "; ".join(f"{k}: {v}" for k, v in CATEGORY_HELP.items()) + ".",
              "Busy = union of GPU activity over all streams; category times are sums of durations."]
    return "\n".join(lines) + "\n"


def render_timeline(res: dict, title: str | None = None) -> str | None:
    """One decode step, activity by activity (step_timeline), as markdown; None without a timeline."""
    tl = res.get("timeline")
    if not tl:
        return None
    lines = [f"# {title or 'Decode-step timeline'}", "",
             f"Medians over {tl['steps_used']} of {tl['steps_given']} complete decode steps with the same "
             f"activities ({tl['activities']}, by name and occurrence, on {tl['streams']} stream(s)), in median start "
             "order. start / end: us from the "
             "step's first activity; exposed: the busy time this activity is charged (the running activity that "
             "ends first takes it; the column sums to the step's busy time); idle before: GPU idle right before it "
             "starts (nothing running), i.e. a launch or dependency gap.", "",
             "| # | stream | activity | category | start us | dur us | end us | exposed us | idle before us |",
             "|---:|---:|---|---|---:|---:|---:|---:|---:|"]
    for r in tl["rows"]:
        lines.append(f"| {r['pos']} | {r['stream']} | `{_short(r['name'], 70)}` | {r['category']} | "
                     f"{r['start_us']:.1f} | {r['dur_us']:.1f} | {r['end_us']:.1f} | {r['exposed_us']:.1f} | "
                     f"{r['idle_us']:.1f} |")
    tot_exp = sum(r["exposed_us"] for r in tl["rows"])
    tot_idle = sum(r["idle_us"] for r in tl["rows"])
    lines += ["", f"Sum of exposed: {tot_exp:.1f} us; sum of idle before: {tot_idle:.1f} us."]
    sg = tl.get("segments")
    if not sg:
        lines += ["", f"No repeating segments: the layer marker `{tl['layer_marker']}` is not in the step."
                  if tl.get("layer_marker") else "No repeating segments: no activity occurs twice per step."]
    if sg:
        lines += ["", f"## Repeating segments (layers), cut at `{_short(sg['marker'], 70)}`", "",
                  f"Step head before the first marker: {sg['head_activities']} activities, {sg['head_exposed_us']:.1f} us "
                  "exposed. Per segment kind (the same activities): medians over its segments; offset = from the "
                  "segment's first activity; span = from its first activity to the next segment's first.", "",
                  "| kind | segments | activities | span us | exposed us | idle before us |", "|---:|---:|---:|---:|---:|---:|"]
        for j, k in enumerate(sg["kinds"]):
            lines.append(f"| {j} | {k['segments']} | {k['activities']} | {k['span_us']:.1f} | {k['exposed_us']:.1f} | "
                         f"{k['idle_us']:.1f} |")
        for j, k in enumerate(sg["kinds"]):
            lines += ["", f"### Kind {j} ({k['segments']} segment(s))", "",
                      "| # | activity | category | offset us | dur us | exposed us | idle before us |",
                      "|---:|---|---|---:|---:|---:|---:|"]
            for r in k["rows"]:
                lines.append(f"| {r['pos']} | `{_short(r['name'], 70)}` | {r['category']} | {r['offset_us']:.1f} | "
                             f"{r['dur_us']:.1f} | {r['exposed_us']:.1f} | {r['idle_us']:.1f} |")
    return "\n".join(lines) + "\n"


def write_outputs(results: list[dict], out: str | Path, stem: str = "breakdown") -> list[Path]:
    """`<stem>.json` (a list, one entry per trace), `<stem>.md` and, when a step timeline exists,
    `<stem>_timeline.md` in out."""
    o = Path(out)
    o.mkdir(parents=True, exist_ok=True)
    pj, pm = o / f"{stem}.json", o / f"{stem}.md"
    pj.write_text(json.dumps(results, indent=2, default=str) + "\n")
    pm.write_text("\n".join(render_markdown(r, title=f"Decode-step breakdown: {Path(r.get('source') or '?').name}")
                            for r in results))
    written = [pj, pm]
    tls = [render_timeline(r, title=f"Decode-step timeline: {Path(r.get('source') or '?').name}") for r in results]
    tls = [t for t in tls if t]
    if tls:
        pt = o / f"{stem}_timeline.md"
        pt.write_text("\n".join(tls))
        written.append(pt)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m glm5_fastpath.bench.trace_breakdown",
                                description="per-decode-step GPU / host breakdown of a torch-profiler Chrome trace")
    p.add_argument("trace", help="trace file (.json / .json.gz) or a directory of them (SGLang's profile dir)")
    p.add_argument("--out", default=None, help="write breakdown.json + breakdown.md here")
    p.add_argument("--split", choices=SPLIT_METHODS, default="auto", help="how to delimit steps (default auto)")
    p.add_argument("--gap-us", type=float, default=None, help="gap split threshold (us); default half the largest gap")
    p.add_argument("--top", type=int, default=TOP_K, help=f"kernels in the top list (default {TOP_K})")
    p.add_argument("--layer-marker", default=None, metavar="NAME",
                   help="activity that starts each repeating segment of the step timeline (default: auto)")
    a = p.parse_args(argv)
    try:
        paths = find_traces(a.trace)
        if not paths:
            raise FileNotFoundError(f"{a.trace}: no trace files there")
        results = [analyze_file(x, method=a.split, gap_us=a.gap_us, top_k=a.top, layer_marker=a.layer_marker)
                   for x in paths]
    except (OSError, ValueError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    for r in results:
        print(render_markdown(r, title=f"Decode-step breakdown: {Path(r['source']).name}"))
    if a.out:
        for x in write_outputs(results, a.out):
            print(f"wrote {x}")
    return 0 if all(r.get("summary") for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
