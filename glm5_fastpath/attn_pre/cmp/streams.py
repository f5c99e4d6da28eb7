"""Stream assignment and the explicit launch schedule of the CMP executor (pure Python).

Stream assignment (`assign_streams`), over the op graph's topological order:
1. the first op goes on stream 0, the main (capturing) stream;
2. an op continues the stream of one of its predecessors whose stream it would extend (the
   predecessor is that stream's last op so far); among several, the predecessor LATEST in the
   topological order wins: it is the likeliest to finish last, so the same-stream edge (the one
   PDL serializes programmatically) is the edge that gates the op, and the cross-stream waits go
   to producers that are likely done already;
3. otherwise the op reuses the lowest stream whose last op is an ancestor (no false dependency);
4. otherwise it opens a new stream.
`pins` overrides the rule for named ops. For GLM-5 this gives the article's CMP layout:

    stream 0 (main): A0 -> B0 -> D0 -> D2          (QKV-A, then the q_b / W_UK path)
    stream 1       : C0 -> D1 -> E1 -> E2          (head gate, then the indexer Q / logits / top-k path)
    stream 2       : B1                            (indexer K + index-K cache store)
    cross-stream edges: A0->C0, A0->B1, B0->D1, B1->E1; join: E2, B1 -> main at the end.

A GLM-5.2 shared layer (A0 -> B0 -> D0 -> D2) is one stream with no cross-stream edge.

The schedule (`build_schedule`) is the host enqueue order (topological, so the main stream's
first op is enqueued first in every capture) with, per launch: its stream, the producers on other
streams whose completion events it waits on, its same-stream predecessor (the edge the PDL launch
attribute applies to), whether it is launched with PDL, and the wait point its kernel uses
(modes.py). A mode without multistream puts every op on stream 0.

Cross-stream edges are plain event waits (full completion), and so are a mode's ordering edges
(modes.py `after:X>Y`) between streams; its pins (`pin:OP=S`) override `assign_streams` like `pins`.
Modifiers naming a prefix op the graph lacks (D1 in a GLM-5.2 shared layer) are dropped for that graph
(Mode.for_ops). When captured into a CUDA graph, a PDL-attributed launch may turn its event dependency into a programmatic edge as well; that is
still correct because every kernel executes griddepcontrol.wait before reading any upstream
output (the wait covers all prerequisite grids).

Split-K / C0 workspaces are per (device, op, shape): ops sharing one must never run concurrently
on two streams; `check_exclusive` enforces that for the groups the caller names.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Iterable, Mapping

from ...graph.op_graph import GraphError, OpGraph
from .modes import Mode, WaitPlan, get_mode

MAIN = 0


class ScheduleError(GraphError):
    """An invalid stream assignment or schedule."""


def assign_streams(graph: OpGraph, pins: Mapping[str, int] | None = None) -> dict[str, int]:
    """op -> stream index (0 = main), by the rule in the module docstring."""
    order = graph.topo_order()
    pos = {o: i for i, o in enumerate(order)}
    pins = dict(pins or {})
    unknown = set(pins) - set(order)
    if unknown:
        raise ScheduleError(f"pins name unknown ops {sorted(unknown)}")
    if order and pins.get(order[0], MAIN) != MAIN:
        raise ScheduleError(f"the first op {order[0]} must be on the main stream")
    tail: dict[int, str] = {}  # stream -> its last op so far
    out: dict[str, int] = {}
    for op in order:
        if op in pins:
            s = pins[op]
        elif not tail:
            s = MAIN
        else:
            preds = graph.predecessors(op)
            cont = [p for p in preds if tail.get(out[p]) == p]
            anc = graph.ancestors(op)
            if cont:
                s = out[max(cont, key=pos.get)]
            else:
                free = sorted(st for st, t in tail.items() if t in anc)
                s = free[0] if free else max(tail) + 1
        out[op] = s
        tail[s] = op
    return out


@dataclass(frozen=True)
class Launch:
    op: str
    stream: int
    waits: tuple[str, ...]  # producers on other streams: wait on their completion events first
    after: str | None  # the previous op on the same stream (the PDL-serialized edge), None for a stream's first op
    pdl: bool  # launched with the programmatic-stream-serialization attribute
    wait_point: str | None  # where the kernel waits for its producers (None: PDL off)
    records: bool  # records a completion event (read by another stream or the final join)


@dataclass(frozen=True)
class Schedule:
    graph: str
    mode: str
    launches: tuple[Launch, ...]
    cross_edges: tuple[tuple[str, str], ...]  # (producer, consumer) on different streams
    joins: tuple[str, ...]  # last op of each side stream: main waits on them at the end

    @property
    def num_streams(self) -> int:
        return 1 + max((l.stream for l in self.launches), default=0)

    def streams(self) -> dict[int, list[str]]:
        out: dict[int, list[str]] = {}
        for l in self.launches:
            out.setdefault(l.stream, []).append(l.op)
        return out

    def launch(self, op: str) -> Launch:
        for l in self.launches:
            if l.op == op:
                return l
        raise KeyError(op)

    def wait_points(self) -> dict[str, str | None]:
        return {l.op: l.wait_point for l in self.launches}

    def to_dict(self) -> dict:
        return {"graph": self.graph, "mode": self.mode, "num_streams": self.num_streams,
                "launches": [asdict(l) for l in self.launches], "cross_edges": [list(e) for e in self.cross_edges],
                "joins": list(self.joins), "streams": {str(k): v for k, v in self.streams().items()}}

    def render(self) -> str:
        lines = [f"schedule {self.graph} mode={self.mode} streams={self.num_streams}"]
        for l in self.launches:
            w = f" waits[{','.join(l.waits)}]" if l.waits else ""
            pdl = f" pdl(after {l.after}, wait {l.wait_point})" if l.pdl and l.after else (
                f" pdl(wait {l.wait_point})" if l.pdl else "")
            lines.append(f"  s{l.stream}: {l.op}{w}{pdl}{' records' if l.records else ''}")
        if self.joins:
            lines.append(f"  s0: join[{','.join(self.joins)}]")
        return "\n".join(lines)


def build_schedule(graph: OpGraph, mode: str | Mode, *, wait_plans: Mapping[str, WaitPlan] | None = None,
                   pins: Mapping[str, int] | None = None) -> Schedule:
    """The launch schedule of `graph` under `mode` (wait_plans: modes.resolve_wait_points' result; when
    None the mode's requested wait point is recorded as is)."""
    m = get_mode(mode)
    order = graph.topo_order()
    pos = {o: i for i, o in enumerate(order)}
    try:
        m = m.for_ops(order)  # modifiers naming a prefix op this graph lacks do not apply here
    except ValueError as e:
        raise ScheduleError(str(e)) from None
    for a, b in m.order_edges:
        if pos[a] > pos[b]:
            raise ScheduleError(f"mode {m.name}: ordering edge {a}>{b} runs against the enqueue order "
                                f"({', '.join(order)})")
    extra = {b: [a for a, bb in m.order_edges if bb == b] for _, b in m.order_edges}
    pins = {**dict(m.pins), **dict(pins or {})}  # the caller's pins win over the mode's
    streams = assign_streams(graph, pins) if m.multistream else {o: MAIN for o in order}
    last: dict[int, str] = {}
    needed_events: set[str] = set()
    raw: list[tuple[str, int, tuple[str, ...], str | None]] = []
    cross: list[tuple[str, str]] = []
    for op in order:
        s = streams[op]
        waits = []
        for p in graph.predecessors(op):
            if streams[p] != s:
                cross.append((p, op))
                # a producer already ordered before this op's stream position needs no second wait
                waits.append(p)
        # ordering edges: a wait on the other stream's op (on the same stream the enqueue order holds it)
        waits += [p for p in extra.get(op, ()) if streams[p] != s and p not in waits]
        raw.append((op, s, tuple(_minimal_waits(graph, waits, streams, last.get(s))), last.get(s)))
        last[s] = op
    joins = tuple(last[s] for s in sorted(last) if s != MAIN)
    for _, _, waits, _ in raw:
        needed_events.update(waits)
    needed_events.update(joins)
    launches = []
    for op, s, waits, after in raw:
        wp = None
        if m.pdl:
            wp = wait_plans[op].realized if wait_plans is not None else m.wait_point
        launches.append(Launch(op, s, waits, after, m.pdl, wp, op in needed_events))
    sched = Schedule(graph.name, m.name, tuple(launches), tuple(cross), joins)
    validate_schedule(graph, sched, m.order_edges)
    return sched


def _minimal_waits(graph: OpGraph, waits: list[str], streams: Mapping[str, int], prev: str | None) -> list[str]:
    """Drop the wait on producer p when the same-stream predecessor already depends on p (its completion,
    which this op's stream order / griddepcontrol.wait covers, implies p's)."""
    if prev is None:
        return waits
    anc = graph.ancestors(prev) | {prev}
    return [p for p in waits if p not in anc]


def validate_schedule(graph: OpGraph, sched: Schedule, order_edges: Iterable[tuple[str, str]] = ()) -> None:
    """Every data edge and every ordering edge of the mode is honoured (same-stream order or an event
    wait), side streams are tied into the capture, the main stream is enqueued first, and each op
    appears exactly once."""
    ops = [l.op for l in sched.launches]
    if sorted(ops) != sorted(graph.ops):
        raise ScheduleError(f"schedule ops {ops} != graph ops {list(graph.ops)}")
    if not sched.launches or sched.launches[0].stream != MAIN:
        raise ScheduleError("the main stream must be enqueued first")
    pos = {o: i for i, o in enumerate(ops)}
    by_op = {l.op: l for l in sched.launches}
    # reachability through same-stream order + event waits
    happens_before: dict[str, set[str]] = {}
    for l in sched.launches:
        hb: set[str] = set()
        if l.after is not None:
            hb |= {l.after} | happens_before[l.after]
        for w in l.waits:
            if pos[w] > pos[l.op]:
                raise ScheduleError(f"{l.op} waits on {w}, enqueued later")
            if not by_op[w].records:
                raise ScheduleError(f"{l.op} waits on {w}, which records no event")
            hb |= {w} | happens_before[w]
        happens_before[l.op] = hb
        if l.stream != MAIN and l.after is None and not l.waits:
            raise ScheduleError(f"{l.op} opens stream {l.stream} without waiting on a captured stream")
    for e in graph.edges():
        if e.src not in happens_before[e.dst]:
            raise ScheduleError(f"edge {e.src}->{e.dst} ({', '.join(e.tensors)}) is not enforced by the schedule")
    for a, b in order_edges:
        if a not in happens_before[b]:
            raise ScheduleError(f"ordering edge {a}>{b} is not enforced by the schedule")
    for j in sched.joins:
        if not by_op[j].records:
            raise ScheduleError(f"join op {j} records no event")


def check_exclusive(graph: OpGraph, sched: Schedule, groups: Iterable[Iterable[str]]) -> None:
    """Ops of one group share a workspace: each pair must be ordered (a path in the graph) or on one stream."""
    streams = {l.op: l.stream for l in sched.launches}
    for g in groups:
        g = [o for o in g if o in streams]
        for i, a in enumerate(g):
            for b in g[i + 1:]:
                if streams[a] != streams[b] and graph.independent(a, b):
                    raise ScheduleError(f"{a} and {b} share a workspace but may run concurrently on streams "
                                        f"{streams[a]} and {streams[b]}")
