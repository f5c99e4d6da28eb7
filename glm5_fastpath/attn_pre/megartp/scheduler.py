"""Assign tasks to per-SM queues: a critical-path list scheduler (plain, or with insertion into idle gaps) and the
round-robin baseline.

Cost model (one for all, so their estimates compare), calibrated on the H200 megakernel's traces of the whole
prefix (benchmarks/results/2026-12-01_h200_session21, calls 1, 2 and 4, 1 / 16 / 64 tokens): a task of op X costs
    SETUP_US[X], overlapping any wait for its producers, then
    FIXED_US[X] x token blocks + (HBM bytes of fused op X / X's tile count) / (bandwidth / num_sms)
    + COLD_US[X] when its queue's previous task was another op
with the fused-op bytes of glm5_fastpath.cost. The fixed term is what the trace shows beyond the bytes (cold code
at ~50 ns per 128-byte line, serial memory round trips); the GEMM tiles of PER_BLOCK_OPS re-run per 16-token block.
COLD_US is the part a queue saves when it runs the same op again (the code is still in the SM's instruction
caches): measured only for the ops that repeat on a queue (E1, D2, E2); for the others it is inside FIXED_US. A
split-K reduce group without finaliser tasks (B1, C0, D1) is finished by its last arriving partial: FINISH_US per
token block more on that partial's queue, and the group's consumers wait for it. `estimate_makespan` replays
queues the way the device runs them (event-driven: a task starts when its queue is free and its producers are
done; a group's finish goes to the queue of the member that finishes last). The model still runs ~5-10 % short of
the device at 16-64 tokens, and it ranks placements imperfectly (round-robin measured faster than its estimate
says): `python -m glm5_fastpath.attn_pre.megartp.bench --scheduler ...` measures them.

list_schedule and round_robin append tasks in a topological order, and insertion_schedule puts a task only after
every producer on its queue, so no queue ever waits on a task placed later in the same queue (deadlock-free by
construction; validator.py checks it anyway).

Dynamic dispatch (scheduler "dynamic") places nothing on the host: the list schedulers' priority order is one list,
and each CTA claims its next task at run time once its current task has its inputs (priority_order;
dynamic_assignment models it for the estimate).
"""
from __future__ import annotations

import heapq
from typing import Callable, Mapping, Sequence

from ...config import Glm5Config
from ...cost import H200_COPY_BW, fused_prefix_costs
from .taskgraph import TaskGraph

DEFAULT_OVERHEAD_US = 0.3  # an empty instruction (NOOP): fetch, hand-off, event publish
# Per instruction (PER_BLOCK_OPS: per 16-token block), beyond the bytes term: medians of the "ran" time (inputs
# ready -> done) in session 21 call 4's trace at 1-64 tokens, minus the bytes term. Ops without an entry:
# DEFAULT_FIXED_US. The GEMM tiles take ~1 us per 128-column K group per block (B1's 4 K splits of 1536: 10.5).
FIXED_US = {"A0": 3.3, "B0": 8.8, "C0": 6.0, "B1": 10.5, "D1": 6.2, "D0": 9.5, "D2": 1.6, "E1": 5.5, "E2": 7.5}
PER_BLOCK_OPS = frozenset({"B0", "B1", "D1", "D0"})  # C0's partial takes its 64 rows at once (6.3 -> 8.5 us, 16 -> 64)
COLD_US = {"E2": 9.0, "D2": 3.6, "E1": 2.2}  # first of a run of the op on a queue (E2: 18 vs ~9 us, call 2)
# (Session 22 call 1 refitted E2 on session 21 call 5's trace, fixed 9.5 / cold 1: the E path then lost its
# priority over D0, three E1 windows queued behind D0 on one SM, and 1 token took 101 against 87 us in the same
# run, call 2. Reverted. The model is fitted on plain-load traces; the evict-first default build runs its GEMM
# tasks ~20 % under it at 1-16 tokens: next/c1_cost_refit.sh in the session-22 results.)
# Before its inputs are ready an instruction runs a prologue (controller hand-off, weight / step-input prefetch):
# the trace's wait when the producers were long done (10th percentile). It overlaps a real wait, so it only costs
# when the inputs are ready first.
SETUP_US = {"A0": 0.6, "B0": 3.3, "C0": 1.6, "B1": 5.0, "D1": 3.3, "D0": 4.6, "D2": 1.9, "E1": 2.0, "E2": 2.1,
            "NOOP": 0.5}
FINALISER_US = 4.4  # a B0 row finaliser: one row of activations, cold code
FINALISER_SETUP_US = 1.4
DEFAULT_FIXED_US = 4.0
FINISH_US = 9.0  # a reduce group's last-arriver finish per token block (B1 / D1: stage, sum, epilogue)
GROUP_FINISH_US = {"C0": 1.0}  # C0's finish is a bf16 round of the group's 32 columns
GEMM_TOKEN_BLOCK = 16  # families.cuh `Gemm` (GemmCfg<16, 6>)


def _blocks(rows: int) -> int:
    return max(1, -(-rows // GEMM_TOKEN_BLOCK))


def _partial_blocks(tg: TaskGraph, t) -> int:
    """16-token blocks a GEMM task of PER_BLOCK_OPS runs its tile for (a split-K partial: its reduce group's rows;
    D0: the step's tokens); 1 for other tasks."""
    if t.op not in PER_BLOCK_OPS or t.final_of is not None:
        return 1
    if t.reduce_group is None:
        return _blocks(tg.ctx.M)
    m0, m1 = tg.reduce_groups[t.reduce_group].key[:2]
    return _blocks(m1 - m0)


def task_setup_us(tg: TaskGraph) -> list[float]:
    """Per task: its prologue before the inputs are needed (SETUP_US), hidden by any wait for producers."""
    return [FINALISER_SETUP_US if t.final_of is not None else SETUP_US.get(t.op, 0.0) for t in tg.tasks]


def task_cold_us(tg: TaskGraph) -> list[float]:
    """Per task: what it costs more when its queue's previous task ran another op (COLD_US)."""
    return [0.0 if t.final_of is not None else COLD_US.get(t.op, 0.0) for t in tg.tasks]


def _kind(t) -> str:
    return t.op if t.final_of is None else t.op + ".final"


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
    stream = {op: (ops[op].bytes / n / per_sm * 1e6 if op in ops else 0.0) for op, n in counts.items()}
    out = []
    for t in tg.tasks:
        if t.op == "NOOP":
            out.append(overhead_us)
        elif t.final_of is not None:
            out.append(FINALISER_US)
        else:
            out.append(FIXED_US.get(t.op, DEFAULT_FIXED_US) * _partial_blocks(tg, t) + stream[t.op])
    return out


def group_finish_us(tg: TaskGraph) -> dict[int, float]:
    """Reduce group -> the finish its last arriver runs (groups whose rows have finaliser tasks have none)."""
    finalised = {t.final_of for t in tg.tasks if t.final_of is not None}
    return {g.id: GROUP_FINISH_US.get(g.op, FINISH_US) * _blocks(g.key[1] - g.key[0])
            for g in tg.reduce_groups if g.id not in finalised}


def _preds(tg: TaskGraph) -> list[list[int]]:
    return [sorted(tg.preds(t.id)) for t in tg.tasks]


def _succs(tg: TaskGraph, preds: Sequence[Sequence[int]]) -> list[list[int]]:
    succ: list[list[int]] = [[] for _ in tg.tasks]
    for t, ps in enumerate(preds):
        for p in ps:
            succ[p].append(t)
    return succ


def critical_path_priority(tg: TaskGraph, costs: Sequence[float],
                           finish: Mapping[int, float] | None = None) -> list[float]:
    """Longest path (sum of costs) from each task to a sink, the task (and its group's finish) included."""
    finish = finish or {}
    succ = _succs(tg, _preds(tg))
    prio = [0.0] * len(tg.tasks)
    for t in reversed(range(len(tg.tasks))):  # task ids are topological
        own = costs[t] + finish.get(tg.tasks[t].reduce_group, 0.0)
        prio[t] = own + max((prio[s] for s in succ[t]), default=0.0)
    return prio


def _per_task(tg: TaskGraph, xs: Sequence[float] | None) -> list[float]:
    return list(xs) if xs is not None else [0.0] * len(tg.tasks)


def _in_priority_order(tg: TaskGraph, costs: Sequence[float], finish: Mapping[int, float], cold: Sequence[float],
                       place: Callable[[int, float], float]) -> None:
    """The list-scheduling loop both list schedulers share: the ready task with the highest critical-path priority
    (every task charged its cold cost: a pessimistic critical path) goes to `place(task, inputs ready at)`, which
    returns when it ends; its consumers become ready when all their producers are placed."""
    preds = _preds(tg)
    succ = _succs(tg, preds)
    prio = critical_path_priority(tg, [c + k for c, k in zip(costs, cold)], finish)
    missing = [len(ps) for ps in preds]
    ready_at = [0.0] * len(tg.tasks)
    heap = [(-prio[t], t) for t in range(len(tg.tasks)) if missing[t] == 0]
    heapq.heapify(heap)
    while heap:
        _, t = heapq.heappop(heap)
        end = place(t, ready_at[t])
        for s in succ[t]:
            missing[s] -= 1
            ready_at[s] = max(ready_at[s], end)
            if missing[s] == 0:
                heapq.heappush(heap, (-prio[s], s))


def list_schedule(tg: TaskGraph, costs: Sequence[float], num_sms: int,
                  finish: Mapping[int, float] | None = None, cold: Sequence[float] | None = None,
                  setup: Sequence[float] | None = None) -> list[list[int]]:
    """Highest critical-path priority first among ready tasks. A task goes to the earliest-free queue, or to the
    earliest-free queue whose last task ran the same op when that finishes it sooner (it skips the cold cost,
    `cold` = task_cold_us). A member of a reduce group with a finish (`finish`, group_finish_us) holds its queue for
    the finish too: on the device any member may arrive last (so a consumer's partial placed behind a B1 partial
    used to wait out B1's finish). A task starts at max(queue free + its `setup`, inputs ready)."""
    finish = finish or {}
    cold, setup = _per_task(tg, cold), _per_task(tg, setup)
    last: list[str | None] = [None] * num_sms
    version = [0] * num_sms
    any_free = [(0.0, q, 0) for q in range(num_sms)]  # (free at, queue, version): stale entries skipped lazily
    same_op: dict[str, list[tuple[float, int, int]]] = {}  # per op: the queues whose last task ran it
    queues: list[list[int]] = [[] for _ in range(num_sms)]

    def top(h: list[tuple[float, int, int]]) -> tuple[float, int, int] | None:
        while h and h[0][2] != version[h[0][1]]:
            heapq.heappop(h)
        return h[0] if h else None

    def place(t: int, ready: float) -> float:
        kind = _kind(tg.tasks[t])
        hold = finish.get(tg.tasks[t].reduce_group, 0.0)
        best: tuple[float, int] | None = None
        for cand in (top(any_free), top(same_op.get(kind, []))):
            if cand is None:
                continue
            at, q, _ = cand
            done = max(at + setup[t], ready) + costs[t] + (0.0 if last[q] == kind else cold[t]) + hold
            if best is None or done < best[0] - 1e-9:
                best = (done, q)
        assert best is not None
        done, q = best
        queues[q].append(t)
        last[q] = kind
        version[q] += 1
        heapq.heappush(any_free, (done, q, version[q]))
        heapq.heappush(same_op.setdefault(kind, []), (done, q, version[q]))
        return done

    _in_priority_order(tg, costs, finish, cold, place)
    return queues


GAP_MARGIN_US = 0.5  # an inserted task must end this much before the next task's planned start (model error)


def insertion_schedule(tg: TaskGraph, costs: Sequence[float], num_sms: int,
                       finish: Mapping[int, float] | None = None, cold: Sequence[float] | None = None,
                       setup: Sequence[float] | None = None) -> list[list[int]]:
    """List scheduling with insertion (HEFT-style): the same priorities as list_schedule, but a task goes to the
    place where it ends earliest, an idle gap included. A gap is time a queue spends waiting for the producers of
    its next task (a consumer placed early, its inputs late); a task fits one when it is ready before the gap ends
    and its cost (cold cost by its new neighbour, group finish hold) ends GAP_MARGIN_US before the next task's
    planned start, so no placed task moves. It never goes between two tasks of one op unless it is that op (the
    second would turn cold). Deadlock-free like list_schedule: a task's producers end before it is ready, so none
    of them sits after it on its queue."""
    finish = finish or {}
    cold, setup = _per_task(tg, cold), _per_task(tg, setup)
    kinds = [_kind(t) for t in tg.tasks]
    slots: list[list[tuple[float, float, int]]] = [[] for _ in range(num_sms)]  # per queue: (start, end, task)

    def place(t: int, r: float) -> float:
        kind = kinds[t]
        base = costs[t] + finish.get(tg.tasks[t].reduce_group, 0.0)
        best: tuple[float, int, int, float] | None = None  # (end, queue, index, start of the work)
        for q, sl in enumerate(slots):
            prev_end, prev_kind = 0.0, None
            for i in range(len(sl) + 1):
                tail = i == len(sl)
                nxt_start = float("inf") if tail else sl[i][0]
                nxt_kind = None if tail else kinds[sl[i][2]]
                if nxt_start > r and (tail or prev_kind != nxt_kind or kind == nxt_kind):
                    start = max(prev_end + setup[t], r)
                    end = start + base + (0.0 if prev_kind == kind else cold[t])
                    if tail or end <= nxt_start - GAP_MARGIN_US:
                        if best is None or end < best[0] - 1e-9:
                            best = (end, q, i, start)
                        break  # later places on this queue end later
                if not tail:
                    prev_end, prev_kind = sl[i][1], nxt_kind
        assert best is not None
        end, q, i, start = best
        slots[q].insert(i, (start, end, t))
        return end

    _in_priority_order(tg, costs, finish, cold, place)
    return [[t for _, _, t in sl] for sl in slots]


def priority_order(tg: TaskGraph, costs: Sequence[float], finish: Mapping[int, float] | None = None,
                   cold: Sequence[float] | None = None) -> list[int]:
    """The list schedulers' order: ready tasks (every producer listed before) by critical-path priority. Dynamic
    dispatch's one list (topological by construction)."""
    order: list[int] = []

    def place(t: int, ready: float) -> float:
        order.append(t)
        return 0.0

    _in_priority_order(tg, costs, finish or {}, _per_task(tg, cold), place)
    return order


CLAIM_US = 1.5  # dynamic dispatch: a claim (global atomic) and the instruction fetch
CLAIM_LEAD_US = 1.5  # dynamic dispatch: claim the next task this long before the current one's estimated end
CLAIM_AT_DONE = 2**31 - 1  # a claim delay (ns) that never expires: the CTA claims when its task is done


CLAIM_DELAY_TERMS = ("run", "cold", "finish")  # what a claim delay's run-time estimate includes (cumulative)


def claim_delays_ns(order: Sequence[int], costs: Sequence[float], lead_us: float | None, *,
                    cold: Sequence[float] | None = None, finish_of: Sequence[float] | None = None,
                    terms: str = "run") -> list[int]:
    """Per list entry: how long after its inputs are ready its CTA claims the next entry (the device's
    params.claim_delay_ns): its estimated run time minus `lead_us` (>= 0); lead None: when it is done. The
    estimate is `terms`: "run" its cost (the default), "cold" + its cold cost, "finish" + its reduce group's
    finish (only the last arriver runs it: the others then claim at their end). Session 23 call 4, same run,
    1 / 16 / 64 tokens: run 68.5 / 94.5 / 263.7 us, cold 68.9 / 98.2 / 272.2, finish 68.9 / 98.3 / 272.5
    (claiming later leaves the claim latency exposed more often than it avoids a task queued behind another).
    """
    if terms not in CLAIM_DELAY_TERMS:
        raise ValueError(f"claim delay terms must be one of {CLAIM_DELAY_TERMS}, got {terms!r}")
    if lead_us is None:
        return [CLAIM_AT_DONE] * len(order)
    k = CLAIM_DELAY_TERMS.index(terms)
    cold = cold if cold is not None and k >= 1 else [0.0] * len(costs)
    fin = finish_of if finish_of is not None and k >= 2 else [0.0] * len(costs)
    return [int(round(max(0.0, costs[t] + cold[t] + fin[t] - lead_us) * 1e3)) for t in order]


def dynamic_assignment(tg: TaskGraph, order: Sequence[int], costs: Sequence[float], num_sms: int,
                       finish: Mapping[int, float] | None = None, cold: Sequence[float] | None = None,
                       setup: Sequence[float] | None = None, delays_ns: Sequence[int] | None = None
                       ) -> tuple[list[list[int]], float]:
    """Which CTA takes which task of the dynamic list, and the makespan, under the cost model: a CTA claims its
    next task delays_ns[j] (claim_delays_ns; None: 0) after list entry j has its inputs, or at its end, whichever
    comes first (megakernel.cuh Controller::step_dynamic); the earliest claimer takes the next task of `order`.
    The task starts its setup when the CTA is free and the claim has landed (CLAIM_US), and runs once its
    producers are done. A reduce group's finish delays its consumers; it is charged to the CTA of the member that
    ends last only while that CTA has taken nothing since (approximate).
    -> (per-CTA task lists in run order, makespan)."""
    finish = finish or {}
    cold, setup = _per_task(tg, cold), _per_task(tg, setup)
    kinds = [_kind(t) for t in tg.tasks]
    preds = _preds(tg)
    members_left = {g.id: len(g.tasks) for g in tg.reduce_groups}
    member_end: dict[int, tuple[float, int]] = {}
    group_end: dict[int, float] = {}
    end = [0.0] * len(tg.tasks)
    free = [0.0] * num_sms
    last: list[str | None] = [None] * num_sms
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    claims = [(0.0, q) for q in range(num_sms)]
    heapq.heapify(claims)

    def available(p: int) -> float:
        g = tg.tasks[p].reduce_group
        return group_end.get(g, end[p]) if g in finish else end[p]

    for j, t in enumerate(order):
        at, q = heapq.heappop(claims)
        begin = max(free[q], at + CLAIM_US if queues[q] else at)
        ready = max([begin + setup[t]] + [available(p) for p in preds[t]])
        end[t] = free[q] = ready + costs[t] + (0.0 if last[q] == kinds[t] else cold[t])
        last[q] = kinds[t]
        queues[q].append(t)
        delay_us = delays_ns[j] / 1e3 if delays_ns is not None else 0.0
        heapq.heappush(claims, (min(end[t], ready + delay_us), q))
        g = tg.tasks[t].reduce_group
        if g is not None and g in finish:
            if g not in member_end or end[t] > member_end[g][0]:
                member_end[g] = (end[t], q)
            members_left[g] -= 1
            if members_left[g] == 0:
                f, fq = member_end[g]
                group_end[g] = f + finish[g]
                if free[fq] == f:  # that CTA has taken nothing since
                    free[fq] = max(free[fq], group_end[g])
    return queues, max(list(end) + list(group_end.values()), default=0.0)


def round_robin(tg: TaskGraph, num_sms: int) -> list[list[int]]:
    """Task i (topological order) to queue i % num_sms: the article's first MegaRTP plan."""
    queues: list[list[int]] = [[] for _ in range(num_sms)]
    for t in tg.tasks:
        queues[t.id % num_sms].append(t.id)
    return queues


def estimate_makespan(tg: TaskGraph, queues: Sequence[Sequence[int]], costs: Sequence[float],
                      finish: Mapping[int, float] | None = None, cold: Sequence[float] | None = None,
                      setup: Sequence[float] | None = None) -> float:
    """Device-order replay of the queues under the cost model (raises on a deadlocked placement): event-driven,
    the queue whose head can start earliest goes next; a task pays `cold` unless its queue's previous task ran
    the same op; a reduce group's finish runs on the queue of the member that finishes last, and the group's
    outputs are available after it; a task's `setup` runs from when its queue is free, overlapping the wait."""
    finish = finish or {}
    cold, setup = _per_task(tg, cold), _per_task(tg, setup)
    kinds = [_kind(t) for t in tg.tasks]
    preds = _preds(tg)
    group_of = {t.id: t.reduce_group for t in tg.tasks if t.reduce_group in finish}
    done: dict[int, float] = {}
    group_end: dict[int, float] = {}
    members: dict[int, list[tuple[float, int]]] = {}
    pos = [0] * len(queues)
    free = [0.0] * len(queues)
    version = [0] * len(queues)
    waiters: dict[tuple[str, int], list[int]] = {}
    heap: list[tuple[float, int, int]] = []

    def available(p: int) -> tuple[float | None, tuple[str, int]]:
        g = group_of.get(p)
        return (group_end.get(g), ("g", g)) if g is not None else (done.get(p), ("t", p))

    def consider(q: int) -> None:
        if pos[q] >= len(queues[q]):
            return
        start = free[q] + setup[queues[q][pos[q]]]
        for p in preds[queues[q][pos[q]]]:
            at, key = available(p)
            if at is None:
                waiters.setdefault(key, []).append(q)
                return
            start = max(start, at)
        version[q] += 1
        heapq.heappush(heap, (start, q, version[q]))

    def wake(key: tuple[str, int]) -> None:
        for q in waiters.pop(key, []):
            consider(q)

    for q in range(len(queues)):
        consider(q)
    left = sum(len(q) for q in queues)
    while heap:
        start, q, v = heapq.heappop(heap)
        if v != version[q]:
            continue
        t = queues[q][pos[q]]
        warm = pos[q] > 0 and kinds[queues[q][pos[q] - 1]] == kinds[t]
        done[t] = free[q] = start + costs[t] + (0.0 if warm else cold[t])
        pos[q] += 1
        left -= 1
        g = group_of.get(t)
        if g is not None:
            members.setdefault(g, []).append((done[t], q))
            if len(members[g]) == len(tg.reduce_groups[g].tasks):
                f, fq = max(members[g])
                group_end[g] = f + finish[g]
                if fq != q:  # that queue's next task has not started: it can only start after f
                    free[fq] = max(free[fq], f) + finish[g]
                    consider(fq)
                else:
                    free[q] = group_end[g]
                wake(("g", g))
        else:
            wake(("t", t))
        consider(q)
    if left:
        stuck = [(q, queue[pos[q]]) for q, queue in enumerate(queues) if pos[q] < len(queue)]
        raise RuntimeError(f"estimate_makespan: placement deadlocks; stuck (queue, task): {stuck[:6]}")
    return max(list(done.values()) + list(group_end.values()), default=0.0)
