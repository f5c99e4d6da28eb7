"""Plan validator and human-readable dump. Works from the instruction tensor itself (decoded), so a
hand-edited or corrupted plan is judged by what the kernel would execute.

Checks (PlanError names the SM, queue slot, op and tile):
1. every op tile appears exactly once; opcodes / operand rows / tile indices are consistent;
2. satisfiable, epoch-exact waits: every waited event's producers increment it by exactly the
   threshold it is waited at (more would break the next epoch's target, less never arrives);
   every reduce counter is referenced by exactly `target` partials; a two-level group's sub-counters
   (families with tile_counters) exist and belong to it alone;
3. no deadlock under any interleaving: counters only grow and waits are ">=", so the set of
   instructions that can ever complete is the fixed point of "complete any queue head whose waits
   hold", independent of order. A queue stuck there deadlocks in every interleaving. A dynamic-dispatch
   plan's one list passes exactly when it is topological, which is what makes the kernel's run-time
   claiming deadlock-free (each CTA runs its claims in list order);
4. exact dependencies: each consumer waits (through its events) for exactly the producer tiles
   whose writes intersect its reads (widened to whole reduce groups); a superset is accepted only
   on pairs registered `whole` (conservative by declaration); a finaliser waits for exactly the
   partials of its reduce group.
"""
from __future__ import annotations

from collections import defaultdict

from ...graph.op_graph import GraphError
from .isa import FAMILY_BY_OPCODE, Instruction, Opcode, decode
from .pairing import ProducerTask, needed_producers
from .plan import TILE_ROWS, KernelPlan


class PlanError(GraphError):
    """The plan is not executable as is (unsatisfiable wait, deadlock, missing or extra dependency)."""


Slot = tuple[int, int]  # (sm, position)


def _decode_all(plan: KernelPlan) -> dict[Slot, Instruction]:
    out = {}
    sms, n, _ = plan.instructions.shape
    for sm in range(sms):
        for pos in range(n):
            ins = decode(plan.instructions[sm, pos])
            if ins.opcode != Opcode.NOOP:
                out[(sm, pos)] = ins
    return out


def _name(plan: KernelPlan, slot: Slot, ins: Instruction) -> str:
    return f"SM {slot[0]} slot {slot[1]} ({plan.ops[ins.operand_row]} tile {ins.tile_index})"


def _check_coverage(plan: KernelPlan, prog: dict[Slot, Instruction]) -> dict[tuple[str, int], Slot]:
    where: dict[tuple[str, int], Slot] = {}
    for slot, ins in prog.items():
        if not 0 <= ins.operand_row < len(plan.ops):
            raise PlanError(f"SM {slot[0]} slot {slot[1]}: operand_row {ins.operand_row} outside [0, {len(plan.ops)})")
        op = plan.ops[ins.operand_row]
        if FAMILY_BY_OPCODE[ins.opcode].name != op:
            raise PlanError(f"{_name(plan, slot, ins)}: opcode {Opcode(ins.opcode).name} does not run op {op}")
        key = (op, ins.tile_index)
        if key in where:
            raise PlanError(f"{_name(plan, slot, ins)} is also at SM {where[key][0]} slot {where[key][1]}")
        where[key] = slot
    for op, n in plan.taskgraph.tile_counts().items():
        missing = [i for i in range(n) if (op, i) not in where]
        if missing:
            raise PlanError(f"op {op}: tiles {missing[:8]} are in no queue")
    return where


def _check_counters(plan: KernelPlan, prog: dict[Slot, Instruction]) -> None:
    incs: dict[int, int] = defaultdict(int)
    for ins in prog.values():
        for ev, inc, _ in ins.signals:
            incs[ev] += inc
    for slot, ins in prog.items():
        for ev, thr in ins.waits:
            if incs[ev] != thr:
                kind = "never reached" if incs[ev] < thr else "overshoots the next epoch's target"
                raise PlanError(f"{_name(plan, slot, ins)} waits event {ev} >= {thr} but its producers increment "
                                f"it by {incs[ev]} per step ({kind})")
    refs: dict[int, list[Instruction]] = defaultdict(list)
    for ins in prog.values():
        if ins.reduce_counter >= 0:
            refs[ins.reduce_counter].append(ins)
    for c, group in refs.items():
        targets = {i.reduce_target for i in group}
        if targets != {len(group)}:
            raise PlanError(f"reduce counter {c}: {len(group)} partials but targets {sorted(targets)}")
    # Two-level reduce groups (families with tile_counters) own the sub-counters after their counter: no
    # event or other group may use them, and they must exist.
    used = {ev for ins in prog.values() for ev, _ in ins.waits} | {ev for ins in prog.values() for ev, _, _ in ins.signals}
    owner: dict[int, int] = {}
    for c, group in refs.items():
        fam = FAMILY_BY_OPCODE.get(group[0].opcode)
        span = 1
        if fam is not None and fam.tile_counters:
            g = dict(zip(fam.payload, group[0].payload))
            span += -(-(g["g1"] - g["g0"]) // TILE_ROWS)
        for k in range(c, c + span):
            if k >= plan.num_counters:
                raise PlanError(f"reduce counter {c} ({fam.name if fam else '?'}): sub-counter {k} is past the "
                                f"plan's {plan.num_counters} counters")
            if k in owner or k in used or (k != c and k in refs):
                raise PlanError(f"reduce counter {c}: counter {k} of its block is also used elsewhere")
            owner[k] = c


def _check_deadlock(plan: KernelPlan, prog: dict[Slot, Instruction]) -> None:
    sms, n, _ = plan.instructions.shape
    queues = [[prog[(sm, p)] if (sm, p) in prog else None for p in range(n)] for sm in range(sms)]
    counters: dict[int, int] = defaultdict(int)
    pos = [0] * sms
    changed = True
    while changed:
        changed = False
        for sm in range(sms):
            while pos[sm] < n:
                ins = queues[sm][pos[sm]]
                if ins is not None and any(counters[e] < thr for e, thr in ins.waits):
                    break
                if ins is not None:
                    for ev, inc, _ in ins.signals:
                        counters[ev] += inc
                pos[sm] += 1
                changed = True
    stuck = [(sm, pos[sm]) for sm in range(sms) if pos[sm] < n]
    if stuck:
        lines = []
        for sm, p in stuck[:4]:
            ins = queues[sm][p]
            for ev, thr in ins.waits:
                if counters[ev] < thr:
                    later = [q for q in range(p + 1, n) if queues[sm][q] is not None
                             and any(s[0] == ev for s in queues[sm][q].signals)]
                    why = f"; producers later in the same queue at slots {later}" if later else ""
                    lines.append(f"{_name(plan, (sm, p), ins)} waits event {ev} >= {thr}, reaches {counters[ev]}{why}")
        raise PlanError(f"deadlock: {len(stuck)} queues can never finish: " + " | ".join(lines))


def _check_dependencies(plan: KernelPlan, prog: dict[Slot, Instruction], where) -> None:
    tg = plan.taskgraph
    task_of = {(t.op, t.tile.index): t for t in tg.tasks}
    producers_of_event: dict[int, set[int]] = defaultdict(set)
    for slot, ins in prog.items():
        tid = task_of[(plan.ops[ins.operand_row], ins.tile_index)].id
        for ev, _, _ in ins.signals:
            producers_of_event[ev].add(tid)
    by_op: dict[str, list[ProducerTask]] = defaultdict(list)
    for t in tg.tasks:
        group = tg.reduce_groups[t.reduce_group].tasks if t.reduce_group is not None else (t.id,)
        by_op[t.op].append(ProducerTask(t.id, t.tile.index, t.tile.writes, t.tile.k_range, group))
    for c in (t for t in tg.tasks if t.final_of is not None):  # finalisers: exactly their group's partials
        slot = where[(c.op, c.tile.index)]
        ins = prog[slot]
        waited = {p for ev, _ in ins.waits for p in producers_of_event[ev]}
        need = set(tg.reduce_groups[c.final_of].tasks)
        if waited != need:
            raise PlanError(f"{_name(plan, slot, ins)} (a finaliser) waits for {len(waited)} tasks, not exactly the "
                            f"{len(need)} partials of its reduce group (missing {len(need - waited)}, extra "
                            f"{len(waited - need)})")
    for edge in tg.graph.edges():
        whole = tg.policies.get((edge.src, edge.dst), "whole") == "whole"
        for c in (t for t in tg.tasks_of(edge.dst) if t.final_of is None):
            slot = where[(c.op, c.tile.index)]
            ins = prog[slot]
            waited = {p for ev, _ in ins.waits for p in producers_of_event[ev] if tg.tasks[p].op == edge.src}
            need = set(needed_producers(edge.tensors, c.tile.reads, by_op[edge.src]))
            if need - waited:
                miss = sorted(tg.tasks[p].tile.index for p in need - waited)
                raise PlanError(f"{_name(plan, slot, ins)} reads {list(edge.tensors)} from {edge.src} tiles {miss[:8]}"
                                f"{'...' if len(miss) > 8 else ''} but waits for none of them (missing wait)")
            if waited - need and not whole:
                extra = sorted(tg.tasks[p].tile.index for p in waited - need)
                raise PlanError(f"{_name(plan, slot, ins)} waits for {edge.src} tiles {extra[:8]} it does not read "
                                f"(over-synchronised {edge.src}->{edge.dst}, registered "
                                f"{tg.policies.get((edge.src, edge.dst))})")


def validate(plan: KernelPlan) -> KernelPlan:
    prog = _decode_all(plan)
    where = _check_coverage(plan, prog)
    _check_counters(plan, prog)
    _check_deadlock(plan, prog)
    _check_dependencies(plan, prog, where)
    return plan


def dump(plan: KernelPlan, max_sms: int | None = None) -> str:
    """Per-SM queues (a dynamic plan: its one list): opcode, tile coords (payload), waits, signals, reduce counter."""
    s = plan.stats
    lines = [f"KernelPlan {plan.graph.name}: M={plan.taskgraph.ctx.M} max_ctx={plan.taskgraph.ctx.max_ctx} "
             f"tasks={s['tasks']} events={s['events']} reduce_counters={s['reduce_counters']} "
             f"instructions={tuple(plan.instructions.shape)} scheduler={s['scheduler']} "
             f"est_makespan_us=" + ", ".join(f"{k} {v:.2f}" for k, v in s["est_makespan_us"].items()),
             "events: " + "; ".join(f"e{e.id} {e.producer_op}->{'/'.join(sorted({plan.taskgraph.tasks[c].op for c in e.consumers}))}"
                                    f" >= {e.threshold} ({e.policy})" for e in plan.taskgraph.events[:12])
             + (f"; ... {plan.num_events - 12} more" if plan.num_events > 12 else "")]
    sms, n, _ = plan.instructions.shape
    dynamic = plan.dispatch == "dynamic"
    for sm in range(sms if max_sms is None else min(sms, max_sms)):
        lines.append(f"list (claimed at run time by {plan.grid_ctas} CTAs, claim counter c{plan.claim_counter}):"
                     if dynamic else f"SM {sm}:")
        for p in range(n):
            ins = decode(plan.instructions[sm, p])
            if ins.opcode == Opcode.NOOP:
                lines.append(f"  [{p}] NOOP")
                continue
            pay = " ".join(f"{k}={v}" for k, v in ins.named_payload().items())
            waits = " ".join(f"e{e}>={t}" for e, t in ins.waits) or "-"
            sigs = " ".join(f"e{e}+={i}@{pub:#x}" for e, i, pub in ins.signals) or "-"
            red = f" reduce c{ins.reduce_counter}/{ins.reduce_target}" if ins.reduce_counter >= 0 else ""
            lines.append(f"  [{p}] {Opcode(ins.opcode).name:<4} tile {ins.tile_index:<4} spec {ins.spec_id} {pay} | "
                         f"wait {waits} | signal {sigs}{red}")
    return "\n".join(lines)
