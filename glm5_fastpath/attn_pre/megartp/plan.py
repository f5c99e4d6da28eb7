"""TaskGraph -> KernelPlan: the instruction tensor [num_sms, max_queue_len, 32] int32 (NOOP padded),
the counter layout, the spec table, workspace shapes and the OperandPtrTable.

Scheduler "dynamic": the tensor is one topologically ordered list [1, num_tasks, 32] (the list schedulers' priority
order) that the kernel's num_ctas CTAs claim from at run time through a claim counter (the last counter); see
csrc/megartp/megakernel.cuh Controller::run_dynamic.

Counter layout (one uint32 array the kernel zeroes once, never per step): events [0, num_events),
then the reduce groups' blocks [num_events, num_counters): a group's counter, followed, for a family
with `tile_counters` (B0), by one sub-counter per 128-row weight tile of the group's region (the
device finds tile t's at the group counter + 1 + t). Waits target epoch x threshold (isa.py).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping

import torch

from ...config import Glm5Config
from ...graph.op_graph import GraphError, OpGraph, ShapeContext
from ...jit import env as jit_env
from .isa import INSTR_WORDS, NOOP, Instruction, Opcode, decode, encode
from .operands import OperandTable, workspace_name
from .scheduler import (CLAIM_LEAD_US, claim_delays_ns, dynamic_assignment, estimate_makespan, group_finish_us,
                        insertion_schedule, list_schedule, priority_order, round_robin, task_cold_us, task_costs_us,
                        task_setup_us)
from .taskgraph import Pair, TaskGraph, build_taskgraph, family_of

H200_SMS = 132
SCHEDULERS = ("list", "insertion", "round_robin", "dynamic")


@dataclass
class KernelPlan:
    taskgraph: TaskGraph
    ops: list[str]  # operand row -> op
    queues: list[list[int]]  # per SM: task ids in execution order (dynamic: [the one list])
    instructions: torch.Tensor  # [num_sms, max_queue_len, 32] int32 (dynamic: [1, num_tasks, 32])
    specs: list[tuple]  # spec id -> (family, widths...)
    workspaces: dict[str, tuple[int, ...]]  # name -> fp32 shape
    operands: OperandTable
    stats: dict = field(default_factory=dict)
    dispatch: str = "static"  # "static": queue q runs on CTA q; "dynamic": CTAs claim from the one list
    num_ctas: int = 0  # the launch grid (0: one CTA per queue)
    claim_delay_ns: torch.Tensor | None = None  # dynamic: [num_tasks] int32 (scheduler.claim_delays_ns)

    @property
    def graph(self) -> OpGraph:
        return self.taskgraph.graph

    @property
    def grid_ctas(self) -> int:
        return self.num_ctas or int(self.instructions.shape[0])

    @property
    def claim_counter(self) -> int:
        """The dynamic list's claim counter (the last counter), -1 for static queues."""
        return self.num_counters - 1 if self.dispatch == "dynamic" else -1

    @property
    def num_events(self) -> int:
        return len(self.taskgraph.events)

    @property
    def num_counters(self) -> int:
        return self.num_events + sum(n for _, n in counter_blocks(self.taskgraph)) + (self.dispatch == "dynamic")

    def reduce_counter(self, group: int) -> int:
        return self.num_events + counter_blocks(self.taskgraph)[group][0]

    def decoded(self, sm: int, pos: int) -> Instruction:
        return decode(self.instructions[sm, pos])

    def alloc_workspaces(self, device=None) -> dict[str, torch.Tensor]:
        """fp32 split-K workspaces (every slice is written before it is read each step: no zeroing needed)."""
        return {n: torch.empty(s, dtype=torch.float32, device=device) for n, s in self.workspaces.items()}

    def rebind(self, tensors: Mapping[str, torch.Tensor]) -> OperandTable:
        """New buffers / caches / weights: only the OperandPtrTable changes, never `instructions`."""
        return self.operands.rebind(tensors)


TILE_ROWS = 128  # weight rows per sub-counter tile (csrc/megartp/families.cuh: sk::kBlockN)


def counter_blocks(tg: TaskGraph) -> list[tuple[int, int]]:
    """Per reduce group: (its counter's offset after the events, counters its block takes)."""
    out, at = [], 0
    for g in tg.reduce_groups:
        fam = family_of(g.op)
        n = 1 + (-(-(g.key[3] - g.key[2]) // TILE_ROWS) if fam.tile_counters else 0)
        out.append((at, n))
        at += n
    return out


def _instruction(tg: TaskGraph, task_id: int, row: int, spec: int, n_events: int,
                 blocks: list[tuple[int, int]]) -> Instruction:
    t = tg.tasks[task_id]
    waits = tuple((e, tg.events[e].threshold) for e in tg.waits[task_id])
    signals = tuple((e, 1, tg.events[e].publication) for e in tg.signals[task_id])
    red, target = -1, 0
    if t.reduce_group is not None:
        red, target = n_events + blocks[t.reduce_group][0], len(tg.reduce_groups[t.reduce_group].tasks)
    return Instruction(int(Opcode[family_of(t.op).name]), spec, row, t.tile.index, red, target, waits, signals,
                       t.payload)


def _workspaces(tg: TaskGraph) -> dict[str, tuple[int, ...]]:
    out = {}
    for op in tg.graph.ops:
        fam = family_of(op)
        if fam.split_k:
            splits = 1 + max(dict(zip(fam.payload, t.payload))["k_split"] for t in tg.tasks_of(op))
            out[workspace_name(op)] = (splits, tg.ctx.M, int(tg.graph.tensors[fam.weight].shape[0]))
    return out


CLAIM_LEAD_ENV = "GLM5_FASTPATH_MRTP_CLAIM_LEAD_US"
CLAIM_TERMS_ENV = "GLM5_FASTPATH_MRTP_CLAIM_TERMS"  # run (default) | cold | finish: scheduler.claim_delays_ns


def claim_lead_us(value: str | float | None = None) -> float | None:
    """Dynamic dispatch's claim lead (scheduler.claim_delays_ns): a number of microseconds, "ready" (0 delay:
    claim as soon as the current task has its inputs) or "done" (None: claim when it is done). None / "" -> the
    environment's GLM5_FASTPATH_MRTP_CLAIM_LEAD_US, else CLAIM_LEAD_US."""
    if value is None or value == "":
        value = jit_env.text(CLAIM_LEAD_ENV) or ""
        if value == "":
            return CLAIM_LEAD_US
    if value == "done":
        return None
    if value == "ready":
        return float("inf")
    try:
        return float(value)
    except ValueError:
        raise GraphError(f"claim lead must be microseconds, 'ready' or 'done'; got {value!r} "
                         f"(from {CLAIM_LEAD_ENV} or claim_lead)") from None


def claim_terms() -> str:
    """What a dynamic claim delay's estimate includes (scheduler.CLAIM_DELAY_TERMS): GLM5_FASTPATH_MRTP_CLAIM_TERMS,
    else "run"."""
    return jit_env.text(CLAIM_TERMS_ENV) or "run"


def plan_from_taskgraph(tg: TaskGraph, cfg: Glm5Config, *, num_sms: int = H200_SMS, scheduler: str = "list",
                        claim_lead: str | float | None = None) -> KernelPlan:
    if scheduler not in SCHEDULERS:
        raise GraphError(f"scheduler must be one of {SCHEDULERS}, got {scheduler!r}")
    costs = task_costs_us(tg, cfg, num_sms)
    cold = task_cold_us(tg)
    setup = task_setup_us(tg)
    finish = group_finish_us(tg)
    queues = {"list": lambda: list_schedule(tg, costs, num_sms, finish, cold, setup),
              "insertion": lambda: insertion_schedule(tg, costs, num_sms, finish, cold, setup),
              "round_robin": lambda: round_robin(tg, num_sms)}
    dynamic = scheduler == "dynamic"
    delays, lead, terms = None, None, None
    if dynamic:  # one list; the model's per-CTA assignment only gives the estimate
        order = priority_order(tg, costs, finish, cold)
        lead = claim_lead_us(claim_lead)
        finish_of = [finish.get(t.reduce_group, 0.0) for t in tg.tasks]
        terms = claim_terms()
        try:
            delay_list = claim_delays_ns(order, costs, lead, cold=cold, finish_of=finish_of, terms=terms)
        except ValueError as e:
            raise GraphError(f"{CLAIM_TERMS_ENV}: {e}") from None
        _, dyn_makespan = dynamic_assignment(tg, order, costs, num_sms, finish, cold, setup, delay_list)
        delays = torch.tensor(delay_list, dtype=torch.int32)
        chosen = [order]
    else:
        chosen = queues[scheduler]()
    ops = [op for op in tg.graph.topo_order()]
    rows = {op: i for i, op in enumerate(ops)}
    spec_ids: dict[tuple, int] = {}
    for t in tg.tasks:
        spec_ids.setdefault(family_of(t.op).spec_key(t.payload), len(spec_ids))
    max_len = max(1, max(len(q) for q in chosen))
    blocks = counter_blocks(tg)
    words = torch.tensor(encode(NOOP), dtype=torch.int32).repeat(len(chosen), max_len, 1)
    for sm, queue in enumerate(chosen):
        for pos, tid in enumerate(queue):
            t = tg.tasks[tid]
            spec = spec_ids[family_of(t.op).spec_key(t.payload)]
            words[sm, pos] = torch.tensor(encode(_instruction(tg, tid, rows[t.op], spec, len(tg.events), blocks)),
                                          dtype=torch.int32)
    assert words.shape[-1] == INSTR_WORDS
    # The chosen placement and the two cheap ones, for comparison (insertion costs seconds at 64 tokens: only
    # when chosen).
    compared = {scheduler, "list", "round_robin"}
    makespans = {name: estimate_makespan(tg, chosen if name == scheduler else fn(), costs, finish, cold, setup)
                 for name, fn in queues.items() if name in compared}
    if dynamic:
        makespans["dynamic"] = dyn_makespan
    stats = {"tasks": len(tg.tasks), "tiles": tg.tile_counts(), "events": len(tg.events),
             "reduce_counters": sum(n for _, n in blocks), "num_sms": num_sms, "max_queue_len": max_len,
             "scheduler": scheduler, "dispatch": "dynamic" if dynamic else "static", "est_makespan_us": makespans,
             "claim_lead_us": (None if not dynamic else "done" if lead is None else "ready" if lead == float("inf")
                               else lead),
             "claim_terms": terms,
             "critical_path_us": _critical_path(tg, [c + k for c, k in zip(costs, cold)], finish),
             "max_epoch": (2**32 - 1) // max([e.threshold for e in tg.events] +
                                             [len(g.tasks) for g in tg.reduce_groups] + [1])}
    if dynamic:  # every step takes num_tasks + num_ctas claims of the uint32 claim counter
        stats["max_epoch"] = min(stats["max_epoch"], (2**32 - 1) // (max_len + num_sms))
    return KernelPlan(tg, ops, chosen, words, sorted(spec_ids, key=spec_ids.get), _workspaces(tg),
                      OperandTable(tg.graph, ops), stats, "dynamic" if dynamic else "static",
                      num_sms if dynamic else 0, delays)


def _critical_path(tg: TaskGraph, costs, finish=None) -> float:
    from .scheduler import critical_path_priority
    return max(critical_path_priority(tg, costs, finish), default=0.0)


def build_plan(graph: OpGraph, ctx: ShapeContext, cfg: Glm5Config, *, num_sms: int = H200_SMS,
               scheduler: str = "list", policies: Mapping[Pair, str] | None = None,
               claim_lead: str | float | None = None) -> KernelPlan:
    """OpGraph -> TaskGraph -> KernelPlan for one step shape (re-plan when M / KV lengths change). claim_lead:
    dynamic dispatch only (claim_lead_us)."""
    return plan_from_taskgraph(build_taskgraph(graph, ctx, policies), cfg, num_sms=num_sms, scheduler=scheduler,
                               claim_lead=claim_lead)
