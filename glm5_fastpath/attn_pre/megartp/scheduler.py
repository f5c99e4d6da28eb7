"""Assign tasks to per-SM queues: a critical-path list scheduler and the round-robin baseline.

Cost model (one for both, so their estimates compare): a task of op X costs
    overhead_us + (HBM bytes of fused op X / X's tile count) / (bandwidth / num_sms)
with the fused-op bytes of glm5_fastpath.cost (a tile streams its share of the op's bytes at an
SM's share of the bandwidth). `estimate_makespan` replays queues the way the device runs them:
each queue in order, a task starting when its queue is free and its producers are done.

Both schedulers append tasks in a topological order, so no queue ever waits on a task placed
later in the same queue (deadlock-free by construction; validator.py checks it anyway).
"""
from __future__ import annotations

import heapq
from typing import Sequence

from ...config import Glm5Config
from ...cost import H200_COPY_BW, fused_prefix_costs
from .taskgraph import TaskGraph

DEFAULT_OVERHEAD_US = 0.3  # per instruction: fetch, page hand-off, event publish (a guess until measured)


def task_costs_us(tg: TaskGraph, cfg: Glm5Config, num_sms: int, *, bw: float = H200_COPY_BW,
                  overhead_us: float = DEFAULT_OVERHEAD_US) -> list[float]:
    ctx = tg.ctx
    shared = len(ctx.requests()) == 1 and ctx.M > 1
    indexer = "E1" in tg.graph.ops
    ops = {c.name: c for c in fused_prefix_costs(cfg, ctx.M, list(ctx.seq_lens), shared_kv=shared, indexer=indexer)}
    counts: dict[str, int] = {}
    for t in tg.tasks:
        if t.final_of is None:  # a finaliser streams no weights: one row of activations
            counts[t.op] = counts.get(t.op, 0) + 1
    per_sm = bw / num_sms
    per_op = {op: overhead_us + (ops[op].bytes / n / per_sm * 1e6 if op in ops else 0.0) for op, n in counts.items()}
    return [per_op[t.op] if t.final_of is None else overhead_us for t in tg.tasks]


def _preds(tg: TaskGraph) -> list[list[int]]:
    return [sorted(tg.preds(t.id)) for t in tg.tasks]


def critical_path_priority(tg: TaskGraph, costs: Sequence[float]) -> list[float]:
    """Longest path (sum of costs) from each task to a sink, the task included."""
    succ: list[list[int]] = [[] for _ in tg.tasks]
    for t, ps in enumerate(_preds(tg)):
        for p in ps:
            succ[p].append(t)
    prio = [0.0] * len(tg.tasks)
    for t in reversed(range(len(tg.tasks))):  # task ids are topological
        prio[t] = costs[t] + max((prio[s] for s in succ[t]), default=0.0)
    return prio


def list_schedule(tg: TaskGraph, costs: Sequence[float], num_sms: int) -> list[list[int]]:
    """Highest critical-path priority first among ready tasks, placed on the earliest-free queue."""
    preds = _preds(tg)
    succ: list[list[int]] = [[] for _ in tg.tasks]
    for t, ps in enumerate(preds):
        for p in ps:
            succ[p].append(t)
    prio = critical_path_priority(tg, costs)
    missing = [len(ps) for ps in preds]
    ready_at = [0.0] * len(tg.tasks)
    finish = [0.0] * len(tg.tasks)
    heap = [(-prio[t], t) for t in range(len(tg.tasks)) if missing[t] == 0]
    heapq.heapify(heap)
    free = [(0.0, q) for q in range(num_sms)]
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    while heap:
        _, t = heapq.heappop(heap)
        at, q = heapq.heappop(free)
        finish[t] = max(at, ready_at[t]) + costs[t]
        queues[q].append(t)
        heapq.heappush(free, (finish[t], q))
        for s in succ[t]:
            missing[s] -= 1
            ready_at[s] = max(ready_at[s], finish[t])
            if missing[s] == 0:
                heapq.heappush(heap, (-prio[s], s))
    return queues


def round_robin(tg: TaskGraph, num_sms: int) -> list[list[int]]:
    """Task i (topological order) to queue i % num_sms: the article's first MegaRTP plan."""
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    for t in tg.tasks:
        queues[t.id % num_sms].append(t.id)
    return queues


def estimate_makespan(tg: TaskGraph, queues: Sequence[Sequence[int]], costs: Sequence[float]) -> float:
    """Device-order replay of the queues under the cost model (raises on a deadlocked placement)."""
    preds = _preds(tg)
    finish: dict[int, float] = {}
    pos = [0] * len(queues)
    free = [0.0] * len(queues)
    left = sum(len(q) for q in queues)
    while left:
        progressed = False
        for q, queue in enumerate(queues):
            while pos[q] < len(queue):
                t = queue[pos[q]]
                if any(p not in finish for p in preds[t]):
                    break
                start = max([free[q]] + [finish[p] for p in preds[t]])
                finish[t] = free[q] = start + costs[t]
                pos[q] += 1
                left -= 1
                progressed = True
        if not progressed:
            stuck = [(q, queue[pos[q]]) for q, queue in enumerate(queues) if pos[q] < len(queue)]
            raise RuntimeError(f"estimate_makespan: placement deadlocks; stuck (queue, task): {stuck[:6]}")
    return max(finish.values(), default=0.0)
