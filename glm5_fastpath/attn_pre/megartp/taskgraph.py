"""OpGraph + ShapeContext -> TaskGraph: one task per Tile, event counters from pairing policies.

Events: for every graph edge P -> C and every C task, the P tasks it must wait for are found from
the tiles' regions (pairing.needed_producers) and checked against the policy registered for
(P, C) (pairing.check_policy; `whole` for unregistered pairs). An event is keyed by
(P, the producer task set, the tensors of the edge): consumers that need the same producers for
the same published tensors share one counter (e.g. B0 and B1 both wait on A0's x_fp8/x_scale).
Every producer increments the event by 1 once the published tensors are written; threshold =
number of producers. Counters are monotone across steps (target = epoch x threshold, isa.py).

Split-K ops: tasks form reduce groups (families.OpFamily.reduce_scope); each group has a reduce
counter whose last arriver runs the epilogue. A consumer of a split-K op waits for whole groups.
Families with a `finalizer` (B0) add one finaliser task per token row of each group after the op's
tiles: the partials then write only the op's raw pseudo tensor (families.raw_tensor), each finaliser
waits for its group's partials through an intra-op event and writes the op's outputs for its row, so
consumers pair with finalisers (final values, tile_cover) instead of partials.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

from ...graph.op_graph import GraphError, OpGraph, ShapeContext, Tile
from .families import OpFamily, final_payload, raw_tensor
from .isa import FAMILY_BY_NAME
from .pairing import POLICIES, PairingError, ProducerTask, check_policy, needed_producers

Pair = tuple[str, str]

# The GLM-5 prefix's registered pairs (design article section 4). Unlisted pairs fall back to whole.
PREFIX_POLICIES: dict[Pair, str] = {
    ("A0", "B0"): "tile_cover",   # A0 row tiles cover B0's M block of x_fp8/x_scale (event0 >= 16 at M=16)
    ("A0", "B1"): "tile_cover",   # same rows, same event as B0
    ("A0", "C0"): "tile_cover",   # x_bf16 rows (event1 >= 16)
    ("B0", "D0"): "tile_cover",   # q_lora_fp8/scale: B0's row finalisers of the M block (event2 >= 16)
    ("B0", "D1"): "tile_cover",   # same data, same event as D0
    ("B0", "D2"): "tile_cover",   # c_kv / k_pe for the head-0 KV store tiles
    ("C0", "D1"): "tile_reduce",  # w_raw: the 48 K-split gate partials (event3 >= 48)
    ("D0", "D2"): "tile_cover",   # per head: the head's 2 N tiles of q_nope (threshold 2)
    ("D1", "E1"): "tile_reduce",  # index_q/head_w of the Q block: all heads' partials
    ("B1", "E1"): "whole",        # the index-K cache write (E1 reads arbitrary cache pages)
    ("E1", "E2"): "tile_cover",   # a token row of logits: its Q block's KV splits
}


@dataclass(frozen=True)
class Task:
    id: int  # global id; ids follow the graph's topological op order, then the tile index
    op: str
    tile: Tile
    payload: tuple[int, ...]
    reduce_group: int | None = None
    final_of: int | None = None  # a finaliser task: the reduce group whose rows it finishes


@dataclass
class Event:
    id: int
    producer_op: str
    producers: tuple[int, ...]  # task ids, each increments by 1
    tensors: tuple[str, ...]  # what the producers publish before incrementing
    publication: int  # bitmask over the producer op's outputs (bit i = outputs[i])
    policy: str
    consumers: list[int] = field(default_factory=list)

    @property
    def threshold(self) -> int:
        return len(self.producers)


@dataclass(frozen=True)
class ReduceGroup:
    id: int
    op: str
    tasks: tuple[int, ...]
    key: tuple[int, ...]  # (m0, m1, g0, g1): the rows x weight rows its epilogue finishes


@dataclass
class TaskGraph:
    graph: OpGraph
    ctx: ShapeContext
    tasks: list[Task]
    events: list[Event]
    reduce_groups: list[ReduceGroup]
    waits: dict[int, list[int]]  # task -> event ids
    signals: dict[int, list[int]]  # task -> event ids
    policies: dict[Pair, str]

    def tasks_of(self, op: str) -> list[Task]:
        return [t for t in self.tasks if t.op == op]

    def preds(self, task: int) -> set[int]:
        return {p for e in self.waits[task] for p in self.events[e].producers}

    def tile_counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for t in self.tasks:
            out[t.op] = out.get(t.op, 0) + 1
        return out


def family_of(op: str) -> OpFamily:
    try:
        return FAMILY_BY_NAME[op]
    except KeyError:
        raise GraphError(f"op {op} has no MegaRTP op family (families: {sorted(FAMILY_BY_NAME)})") from None


def _make_tasks(graph: OpGraph, ctx: ShapeContext) -> tuple[list[Task], list[ReduceGroup]]:
    tasks: list[Task] = []
    groups: list[ReduceGroup] = []
    for op, tiles in graph.tiles(ctx).items():
        fam = family_of(op)
        k_starts = sorted({t.k_range[0] for t in tiles if t.k_range is not None})
        by_key: dict[tuple[int, ...], list[int]] = {}
        first = len(tasks)
        for tile in tiles:
            k_index = k_starts.index(tile.k_range[0]) if tile.k_range is not None else 0
            payload = fam.payload_of(tile, graph, k_index)
            if fam.split_k:
                p = dict(zip(fam.payload, payload))
                by_key.setdefault((p["m0"], p["m1"], p["g0"], p["g1"]), []).append(len(tasks))
            tasks.append(Task(len(tasks), op, tile, payload))
        if fam.split_k:
            for key, ids in by_key.items():
                gid = len(groups)
                groups.append(ReduceGroup(gid, op, tuple(ids), key))
                for i in ids:
                    tasks[i] = Task(i, op, tasks[i].tile, tasks[i].payload, gid)
        if len(tasks) - first != len(tiles):
            raise GraphError(f"{op}: {len(tiles)} tiles but {len(tasks) - first} tasks")
        if fam.finalizer:
            _add_finalizers(graph, ctx, op, tasks, groups[len(groups) - len(by_key):], len(tiles))
    return tasks, groups


def _add_finalizers(graph: OpGraph, ctx: ShapeContext, op: str, tasks: list[Task], groups: list[ReduceGroup],
                    n_tiles: int) -> None:
    """families.OpFamily.finalizer: the partials of `groups` write only the raw pseudo tensor (their weight-row
    columns of their rows); one finaliser per token row of each group reads the group's raw rows and writes
    every output of the op for that row (the row of each output tensor, whole)."""
    raw = raw_tensor(op)
    dims = ctx.dims()
    outputs = graph.ops[op].outputs
    for g in groups:
        m0, m1, g0, g1 = g.key
        for i in g.tasks:
            t = tasks[i]
            n0, n1 = t.tile.reads[family_of(op).weight][0]
            tasks[i] = Task(i, op, Tile(op, t.tile.index, t.tile.coords, {raw: ((m0, m1), (n0, n1))}, t.tile.reads,
                                        t.tile.k_range), t.payload, t.reduce_group)
        for m in range(m0, m1):
            writes = {name: ((m, m + 1),) + tuple((0, n) for n in graph.tensors[name].resolve(dims, region=True)[1:])
                      for name in outputs}
            tile = Tile(op, n_tiles, ("final", m), writes, {raw: ((m, m + 1), (g0, g1))}, None)
            n_tiles += 1
            tasks.append(Task(len(tasks), op, tile, final_payload(g0, g1, m), None, g.id))


def build_taskgraph(graph: OpGraph, ctx: ShapeContext, policies: Mapping[Pair, str] | None = None) -> TaskGraph:
    """Expand `graph` for `ctx`; policies default to PREFIX_POLICIES (unregistered pairs: whole)."""
    policies = dict(PREFIX_POLICIES if policies is None else policies)
    for pair, pol in policies.items():
        if pol not in POLICIES:
            raise PairingError(f"pairing {pair[0]}->{pair[1]}: unknown policy {pol!r} (known: {POLICIES})")
    tasks, groups = _make_tasks(graph, ctx)
    by_op: dict[str, list[ProducerTask]] = {}
    for t in tasks:
        group = groups[t.reduce_group].tasks if t.reduce_group is not None else (t.id,)
        by_op.setdefault(t.op, []).append(ProducerTask(t.id, t.tile.index, t.tile.writes, t.tile.k_range, group))
    events: list[Event] = []
    index: dict[tuple, int] = {}
    waits: dict[int, list[int]] = {t.id: [] for t in tasks}
    signals: dict[int, list[int]] = {t.id: [] for t in tasks}
    for edge in graph.edges():
        policy = policies.get((edge.src, edge.dst), "whole")
        producers = by_op[edge.src]
        outputs = graph.ops[edge.src].outputs
        pub = sum(1 << outputs.index(t) for t in edge.tensors)
        for c in (t for t in tasks if t.op == edge.dst and t.final_of is None):  # finalisers read only their op
            if policy == "whole":
                need = [p.task for p in producers]
            else:
                need = needed_producers(edge.tensors, c.tile.reads, producers)
            chosen = [p for p in producers if p.task in set(need)]
            check_policy(policy, graph=graph, ctx=ctx, src=edge.src, dst=edge.dst, dst_tile=c.tile.index,
                         edge_tensors=edge.tensors, reads=c.tile.reads, chosen=chosen)
            key = (edge.src, tuple(need), edge.tensors)
            if key not in index:
                index[key] = len(events)
                events.append(Event(len(events), edge.src, tuple(need), edge.tensors, pub, policy))
                for p in need:
                    signals[p].append(index[key])
            ev = events[index[key]]
            if ev.policy != policy:  # one counter serves two pairs; keep the stricter label for the dump
                ev.policy = ev.policy if ev.policy != "whole" else policy
            if index[key] not in waits[c.id]:
                waits[c.id].append(index[key])
                ev.consumers.append(c.id)
    # Intra-op: a finaliser waits for its group's partials (one event per group; publication 0: the raw
    # pseudo tensor is none of the op's outputs).
    for c in (t for t in tasks if t.final_of is not None):
        need = groups[c.final_of].tasks
        key = (c.op, tuple(need), (raw_tensor(c.op),))
        if key not in index:
            index[key] = len(events)
            events.append(Event(len(events), c.op, tuple(need), (raw_tensor(c.op),), 0, "tile_reduce"))
            for p in need:
                signals[p].append(index[key])
        waits[c.id].append(index[key])
        events[index[key]].consumers.append(c.id)
    return TaskGraph(graph, ctx, tasks, events, groups, waits, signals, policies)
