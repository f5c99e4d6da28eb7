"""MegaRTP trace: the per-instruction timestamps of a trace build of the megakernel, as records, a
Chrome / Perfetto trace (chrome://tracing, ui.perfetto.dev) and a summary of the critical path.

The kernel (GLM5_MRTP_TRACE=1, PlanRunner(trace=True)) writes per instruction (queue q, position i)
twelve uint64 words: %globaltimer (ns) when it was fetched (the controller published it into a slot),
ready (its event waits were satisfied) and done (its signals were issued); smid << 32 | opcode << 8 | 1;
then eight phase marks of the family (0 = not reached; PHASES below). B1 / D1: the partial stored and
counted; in the reduce group's last arriver, the epilogue inputs staged, the splits summed (first token
block), four points inside the first block's epilogue, and every block's epilogue done. B0: the partial
counted on its weight tile; in the tile's last split, the tile summed. B0's row finalisers are recorded as
op "B0.final".

A dynamic-dispatch plan (one list, claimed at run time) is decoded per SM instead: a record's queue is the SM
that ran it and its pos the list index.

Derived per record: start = max(fetched, done of the previous instruction of the queue) (the workers
take an instruction once the previous one is done), clipped to ready; wait = ready - start (blocked on
events), run = done - ready (the tile and its signals). Times are relative to the earliest fetch.
Resolution is %globaltimer's (its update interval is GPU-dependent; sub-microsecond instructions may
show equal stamps).

critical_path(): from the last instruction to finish, step back to whatever released it last: the last
producer of the event it waited on longest (via "event e"), or the previous instruction of its queue
(via "queue"), until the first instruction. summarize() adds per-op spans and which ops' work was
overlapped entirely off that path (the design article's section 6 question: which overlaps shortened
the step).
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Iterable, Sequence

import torch

from .families import FINAL_K_SPLIT
from .isa import FAMILY_BY_OPCODE, Opcode, decode

TRACE_WORDS = 12
TRACE_MARKS = 8  # words 4..11 (runtime.cuh kTraceMark0 / kTraceMarks)
# What each mark ends (runtime.cuh comment). "epi.*": inside the first token block's epilogue (SkinnyFinish's
# mark hook): the staged inputs visible, the LayerNorm statistics (B1; D1 has none), the normalised / RoPE'd tile,
# the rotated rows stored; "epilogue": every block done.
SPLIT_K_PHASES = ("partial", "staged", "summed", "epi.entry", "epi.stats", "epi.affine", "epi.rows", "epilogue")
B0_PHASES = ("partial", "tile_sum")  # B0's partials (families.cuh B0Family); its row finalisers are "B0.final"
PHASES = {"B0": B0_PHASES, "B1": SPLIT_K_PHASES, "D1": SPLIT_K_PHASES}
FINAL_SUFFIX = ".final"  # record op name of a row finaliser (families.FINAL_K_SPLIT), e.g. "B0.final"


@dataclass(frozen=True)
class TraceRecord:
    queue: int
    pos: int
    smid: int
    opcode: int
    op: str
    tile: int
    fetched: float  # ns from the earliest fetch
    start: float
    ready: float
    done: float
    waits: tuple[tuple[int, int], ...]  # (event, threshold)
    signals: tuple[int, ...]  # events
    marks: tuple[float | None, ...] = ()  # the family's phase marks (ns from the earliest fetch; None: not reached)

    @property
    def wait(self) -> float:
        return self.ready - self.start

    @property
    def run(self) -> float:
        return self.done - self.ready

    @property
    def label(self) -> str:
        return f"{self.op}[{self.tile}]" if self.op != "NOOP" else f"NOOP@{self.queue}.{self.pos}"


def _op_name(ins, ops: Sequence[str]) -> str:
    if ins.opcode == Opcode.NOOP:
        return "NOOP"
    if 0 <= ins.operand_row < len(ops):
        fam = FAMILY_BY_OPCODE.get(ins.opcode)
        final = fam is not None and fam.finalizer and ins.named_payload().get("k_split") == FINAL_K_SPLIT
        return ops[ins.operand_row] + (FINAL_SUFFIX if final else "")
    f = FAMILY_BY_OPCODE.get(ins.opcode)
    return f.name if f is not None else f"opcode{ins.opcode}"


def decode_trace(plan: Any, raw: torch.Tensor) -> list[TraceRecord]:
    """raw: [queues, max_queue_len, 4] int64 (the runner's trace buffer) -> records of the instructions that
    ran, sorted by (queue, position). A dynamic-dispatch plan's trace ([1, n]) is read per SM: a record's queue is
    the SM that ran it (a CTA runs its claims in list order, so pos, the list index, orders each SM's records)."""
    raw = raw.to(torch.int64).cpu()
    q_n, l_n = plan.instructions.shape[:2]
    if tuple(raw.shape) != (q_n, l_n, TRACE_WORDS):
        raise ValueError(f"trace buffer has shape {list(raw.shape)}, the plan needs [{q_n}, {l_n}, {TRACE_WORDS}]")
    valid = (raw[..., 3] & 1) == 1
    if not bool(valid.any()):
        return []
    t0 = int(raw[..., 0][valid].min())
    ops = list(getattr(plan, "ops", []))
    # runs: (queue of the records, [(row, position) in the instruction tensor, in run order])
    if plan.dispatch == "dynamic":
        by_sm: dict[int, list[tuple[int, int]]] = {}
        for i in range(l_n):
            if bool(valid[0, i]):
                by_sm.setdefault(int((int(raw[0, i, 3]) >> 32) & 0xFFFFFFFF), []).append((0, i))
        runs = sorted(by_sm.items())
    else:
        runs = [(q, [(q, i) for i in range(l_n) if bool(valid[q, i])]) for q in range(q_n)]
    out: list[TraceRecord] = []
    for queue, slots in runs:
        prev_done = None
        for q, i in slots:
            f, r, d, meta, *mk = (int(x) for x in raw[q, i])
            ins = decode(plan.instructions[q, i])
            marks = tuple(float(x - t0) if x else None for x in mk)
            fetched, ready, done = float(f - t0), float(r - t0), float(d - t0)
            # the controller stamps `fetched` just after publishing, so a fast instruction may be ready a
            # few ns earlier: start is clipped to ready (ready and done are one thread's, in order)
            start = min(fetched if prev_done is None else max(fetched, prev_done), ready)
            out.append(TraceRecord(queue, i, (meta >> 32) & 0xFFFFFFFF, ins.opcode, _op_name(ins, ops),
                                   ins.tile_index, fetched, start, ready, done, tuple(ins.waits),
                                   tuple(e for e, _, _ in ins.signals), marks))
            prev_done = done
    return out


# ---- Chrome / Perfetto ----------------------------------------------------------------------------------

def chrome_trace(records: Sequence[TraceRecord], *, name: str = "megartp") -> dict[str, Any]:
    """Chrome trace-event JSON (ts / dur in microseconds): one thread per queue, a "wait" slice (blocked on
    events) and an op slice (the tile) per instruction, and a "fetch" instant where the controller published it."""
    ev: list[dict[str, Any]] = [{"ph": "M", "pid": 0, "name": "process_name", "args": {"name": name}}]
    smids = {}
    for r in records:
        smids.setdefault(r.queue, r.smid)
    for q, sm in sorted(smids.items()):
        ev.append({"ph": "M", "pid": 0, "tid": q, "name": "thread_name", "args": {"name": f"queue {q} (SM {sm})"}})
        ev.append({"ph": "M", "pid": 0, "tid": q, "name": "thread_sort_index", "args": {"sort_index": q}})
    for r in records:
        args = {"pos": r.pos, "tile": r.tile, "waits": [f"e{e}>={t}" for e, t in r.waits],
                "signals": [f"e{e}" for e in r.signals]}
        ev.append({"ph": "i", "s": "t", "pid": 0, "tid": r.queue, "name": "fetch", "ts": r.fetched / 1e3,
                   "args": {"instruction": r.label}})
        if r.wait > 0:
            ev.append({"ph": "X", "pid": 0, "tid": r.queue, "name": f"wait {r.label}", "cat": "wait",
                       "ts": r.start / 1e3, "dur": r.wait / 1e3, "args": args})
        ev.append({"ph": "X", "pid": 0, "tid": r.queue, "name": r.label, "cat": r.op, "ts": r.ready / 1e3,
                   "dur": max(r.run, 0.0) / 1e3, "args": args})
        for name, a, b in phase_spans(r):  # nested in the op slice
            ev.append({"ph": "X", "pid": 0, "tid": r.queue, "name": f"{r.op} {name}", "cat": "phase", "ts": a / 1e3,
                       "dur": max(b - a, 0.0) / 1e3, "args": {"instruction": r.label}})
    return {"traceEvents": ev, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str | Path, records: Sequence[TraceRecord], **kw: Any) -> Path:
    p = Path(path)
    p.write_text(json.dumps(chrome_trace(records, **kw)))
    return p


def phase_spans(r: TraceRecord) -> list[tuple[str, float, float]]:
    """(phase, begin ns, end ns) of the marks the instruction reached: each phase runs from the previous mark
    (the first from `ready`) to its own."""
    names = PHASES.get(r.op, ())
    out, prev = [], r.ready
    for name, m in zip(names, r.marks):
        if m is None:
            continue
        out.append((name, prev, m))
        prev = m
    return out


def phase_table(records: Sequence[TraceRecord]) -> dict[str, dict[str, dict[str, float]]]:
    """Per op with phases: per phase, how many instructions reached it and the median / max duration (us)."""
    acc: dict[str, dict[str, list[float]]] = {}
    for r in records:
        for name, a, b in phase_spans(r):
            acc.setdefault(r.op, {}).setdefault(name, []).append((b - a) / 1e3)
    out: dict[str, dict[str, dict[str, float]]] = {}
    for op, ph in acc.items():
        out[op] = {}
        for name in PHASES[op]:
            v = sorted(ph.get(name, []))
            if v:
                out[op][name] = {"count": len(v), "median_us": round(v[len(v) // 2], 3), "max_us": round(v[-1], 3)}
    return out


# ---- critical path and summary ----------------------------------------------------------------------------

def critical_path(records: Sequence[TraceRecord]) -> list[dict[str, Any]]:
    """The chain of instructions that determined the finish time, first to last (see the module doc)."""
    if not records:
        return []
    by_pos = {(r.queue, r.pos): r for r in records}
    queue_prev: dict[tuple[int, int], TraceRecord] = {}
    for q in {r.queue for r in records}:
        rs = sorted((r for r in records if r.queue == q), key=lambda r: r.pos)
        for a, b in zip(rs, rs[1:]):
            queue_prev[(b.queue, b.pos)] = a
    producers: dict[int, list[TraceRecord]] = {}
    for r in records:
        for e in r.signals:
            producers.setdefault(e, []).append(r)
    cur: TraceRecord | None = max(records, key=lambda r: (r.done, -r.queue))
    chain: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    while cur is not None and (cur.queue, cur.pos) not in seen:
        seen.add((cur.queue, cur.pos))
        prev = queue_prev.get((cur.queue, cur.pos))
        prev_done = prev.done if prev is not None else float("-inf")
        gate: tuple[float, int, TraceRecord] | None = None
        for e, _ in cur.waits:
            ps = producers.get(e)
            if ps:
                last = max(ps, key=lambda r: r.done)
                if gate is None or last.done > gate[0]:
                    gate = (last.done, e, last)
        if gate is not None and gate[0] > prev_done and (gate[2].queue, gate[2].pos) in by_pos:
            via, nxt = f"event e{gate[1]} (last producer {gate[2].label} on queue {gate[2].queue})", gate[2]
        elif prev is not None:
            via, nxt = "queue order", prev
        else:
            via, nxt = "kernel start", None
        chain.append({"queue": cur.queue, "pos": cur.pos, "op": cur.op, "tile": cur.tile, "start": cur.start,
                      "ready": cur.ready, "done": cur.done, "wait": cur.wait, "run": cur.run, "released_by": via})
        cur = nxt
    chain.reverse()
    return chain


def summarize(records: Sequence[TraceRecord]) -> dict[str, Any]:
    """Makespan, per-op spans / busy time / waits, the critical path, and the ops whose work was overlapped
    entirely off it."""
    if not records:
        return {"instructions": 0, "makespan_us": 0.0, "ops": {}, "critical_path": [], "hidden_ops": []}
    makespan = max(r.done for r in records) - min(r.fetched for r in records)
    ops: dict[str, dict[str, Any]] = {}
    for r in records:
        o = ops.setdefault(r.op, {"count": 0, "first_start": r.start, "first_ready": r.ready, "last_done": r.done,
                                  "busy": 0.0, "wait": 0.0, "max_wait": 0.0})
        o["count"] += 1
        o["first_start"] = min(o["first_start"], r.start)
        o["first_ready"] = min(o["first_ready"], r.ready)
        o["last_done"] = max(o["last_done"], r.done)
        o["busy"] += r.run
        o["wait"] += r.wait
        o["max_wait"] = max(o["max_wait"], r.wait)
    us = lambda x: round(x / 1e3, 3)  # noqa: E731
    table = {op: {"count": o["count"], "first_start_us": us(o["first_start"]), "first_ready_us": us(o["first_ready"]),
                  "last_done_us": us(o["last_done"]), "span_us": us(o["last_done"] - o["first_start"]),
                  "busy_us": us(o["busy"]), "mean_wait_us": us(o["wait"] / o["count"]),
                  "max_wait_us": us(o["max_wait"]), "mean_run_us": us(o["busy"] / o["count"])}
             for op, o in ops.items()}
    chain = critical_path(records)
    on_path = {c["op"] for c in chain}
    spans = sum(t["span_us"] for op, t in table.items() if op != "NOOP")
    return {
        "instructions": len(records),
        "makespan_us": us(makespan),
        "sum_of_op_spans_us": round(spans, 3),  # > makespan: ops ran concurrently
        "ops": table,
        "critical_path": [{**c, **{k: us(c[k]) for k in ("start", "ready", "done", "wait", "run")}} for c in chain],
        "critical_path_ops": [c["op"] for c in chain],
        "hidden_ops": sorted(op for op in table if op not in on_path and op != "NOOP"),
        "phases": phase_table(records),
    }


def format_summary(s: dict[str, Any]) -> str:
    lines = [f"MegaRTP trace: {s['instructions']} instructions, makespan {s['makespan_us']:.3f} us, "
             f"sum of op spans {s.get('sum_of_op_spans_us', 0.0):.3f} us"]
    lines.append(f"{'op':<6}{'count':>6}{'first start':>13}{'last done':>11}{'span':>9}{'busy':>9}{'wait avg':>10}"
                 f"{'wait max':>10}")
    for op, t in sorted(s["ops"].items(), key=lambda kv: kv[1]["first_start_us"]):
        lines.append(f"{op:<6}{t['count']:>6}{t['first_start_us']:>13.3f}{t['last_done_us']:>11.3f}{t['span_us']:>9.3f}"
                     f"{t['busy_us']:>9.3f}{t['mean_wait_us']:>10.3f}{t['max_wait_us']:>10.3f}")
    lines.append("critical path (first -> last):")
    for c in s["critical_path"]:
        lines.append(f"  {c['op']}[{c['tile']}] q{c['queue']}.{c['pos']}: start {c['start']:.3f} ready {c['ready']:.3f} "
                     f"done {c['done']:.3f} (waited {c['wait']:.3f}, ran {c['run']:.3f}) <- {c['released_by']}")
    if s["hidden_ops"]:
        lines.append("ops entirely overlapped off the critical path: " + ", ".join(s["hidden_ops"]))
    if s.get("phases"):
        lines.append("phases (median / max us; the reduce-group phases only in the last arriver):")
        for op, ph in s["phases"].items():
            lines.append(f"  {op}: " + ", ".join(f"{n} {v['median_us']:.3f} / {v['max_us']:.3f} (x{v['count']})"
                                                 for n, v in ph.items()))
    return "\n".join(lines)


def records_to_json(records: Iterable[TraceRecord]) -> list[dict[str, Any]]:
    return [asdict(r) for r in records]
