"""Python interpreter of a KernelPlan: executes the very int32 instruction tensor the kernel runs.

Per instruction (decoded from plan.instructions[sm, pos]):
  1. wait: every (event, threshold) until counter[event] >= epoch x threshold;
  2. run: the opcode's solver on the payload (solvers.py) with operands from the OperandPtrTable row;
     split-K: the partial goes to workspace[k_split, m0:m1, n0:n1], then the reduce counter is
     incremented; the last arriver (counter == epoch x target) sums workspace[:, m0:m1, g0:g1] in
     k-split order and runs the epilogue; for a family with finalisers (B0) a finaliser instruction
     (k_split = FINAL_K_SPLIT) does that for its row instead (its event: the group's partials);
  3. signal: counter[event] += increment for each signal.
Queues advance in a seeded random interleaving; steps 2 and 3 of one instruction are separate
scheduling points, so other queues run between an instruction's writes and its signals.
Counters persist across `run` calls (pass the next epoch): the monotone-target scheme is exercised.

A dynamic-dispatch plan (one list) runs on DYNAMIC_CTAS virtual CTAs that claim from the list as the kernel's do:
a CTA takes its next instruction when it holds none, or when the one it holds has its inputs; the action to take
(claim, run, signal) is picked at random among the possible ones.
"""
from __future__ import annotations

import random
from typing import Mapping

import torch

from ...config import Glm5Config
from ...graph.op_graph import GraphError
from ...testing.numerics import poison_
from .families import FINAL_K_SPLIT
from .isa import FAMILY_BY_OPCODE, Instruction, Opcode, decode
from .plan import KernelPlan
from .solvers import SOLVERS, SPLIT_K_SOLVERS


DYNAMIC_CTAS = 5  # virtual CTAs claiming from a dynamic plan's list (few: more interleavings per CTA)


class InterpreterDeadlock(GraphError):
    """No queue can make progress: some wait is never satisfied."""


class _Operands:
    def __init__(self, plan: KernelPlan, row: int):
        self.table, self.row = plan.operands, row

    def __call__(self, name: str) -> torch.Tensor:
        return self.table.tensor(self.row, name)

    def has(self, name: str) -> bool:
        names = self.table.slot_names(self.row)
        return name in names and int(self.table.ptrs[self.row, names.index(name)]) != 0


def allocate(plan: KernelPlan, env: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """env + every produced tensor (poisoned, so an unwritten element fails the comparison) + workspaces."""
    g, dims = plan.graph, plan.taskgraph.ctx.dims()
    missing = [t for t in g.external_tensors() if t not in env]
    if missing:
        raise GraphError(f"interpreter: caller must supply {missing}")
    out = dict(env)
    for name in g.produced_tensors():
        td = g.tensors[name]
        if td.inplace_of is not None:
            out[name] = env[td.inplace_of]
        else:
            out[name] = poison_(torch.empty(td.resolve(dims), dtype=td.dtype))
    for name, t in plan.alloc_workspaces().items():
        out[name] = poison_(t)
    return out


class Interpreter:
    def __init__(self, plan: KernelPlan, cfg: Glm5Config):
        self.plan, self.cfg = plan, cfg
        self.counters = [0] * plan.num_counters
        sms, n, _ = plan.instructions.shape
        self.queues = [[ins for ins in (decode(plan.instructions[sm, p]) for p in range(n))
                        if ins.opcode != Opcode.NOOP] for sm in range(sms)]
        self.trace: list[tuple[int, str, int]] = []  # (sm, op, tile) in execution order

    def _ready(self, ins: Instruction, epoch: int) -> bool:
        return all(self.counters[e] >= epoch * thr for e, thr in ins.waits)

    def _execute(self, ins: Instruction, epoch: int) -> None:
        fam = FAMILY_BY_OPCODE[ins.opcode]
        if self.plan.ops[ins.operand_row] != fam.name:
            raise GraphError(f"opcode {fam.name} with operand row {ins.operand_row} of op {self.plan.ops[ins.operand_row]}")
        o, p = _Operands(self.plan, ins.operand_row), ins.named_payload()
        if not fam.split_k:
            SOLVERS[fam.name](p, o, self.cfg)
            return
        partial, epilogue = SPLIT_K_SOLVERS[fam.name]
        ws = o("workspace")
        if p["k_split"] == FINAL_K_SPLIT:  # a finaliser (families.OpFamily.finalizer): its row, all partials in
            epilogue(p, self._reduced(ws, p), o, self.cfg)
            return
        ws[p["k_split"], p["m0"]:p["m1"], p["n0"]:p["n1"]] = partial(p, o, self.cfg)
        self.counters[ins.reduce_counter] += 1
        if self.counters[ins.reduce_counter] == epoch * ins.reduce_target and not fam.finalizer:  # last arriver
            epilogue(p, self._reduced(ws, p), o, self.cfg)

    @staticmethod
    def _reduced(ws: torch.Tensor, p) -> torch.Tensor:
        """The k-split sum (in split order) of workspace rows [m0, m1) x weight rows [g0, g1)."""
        acc = ws[0, p["m0"]:p["m1"], p["g0"]:p["g1"]].clone()
        for s in range(1, ws.shape[0]):
            acc += ws[s, p["m0"]:p["m1"], p["g0"]:p["g1"]]
        return acc

    def run(self, epoch: int = 1, seed: int = 0) -> None:
        if self.plan.dispatch == "dynamic":
            self._run_dynamic(epoch, random.Random(seed))
            return
        rng = random.Random(seed)
        pos = [0] * len(self.queues)
        pending_signal: list[Instruction | None] = [None] * len(self.queues)
        while True:
            live = [q for q in range(len(self.queues)) if pending_signal[q] is not None or pos[q] < len(self.queues[q])]
            if not live:
                return
            ready = [q for q in live if pending_signal[q] is not None or self._ready(self.queues[q][pos[q]], epoch)]
            if not ready:
                heads = [(q, self.plan.ops[self.queues[q][pos[q]].operand_row], self.queues[q][pos[q]].tile_index,
                          [(e, t, self.counters[e]) for e, t in self.queues[q][pos[q]].waits]) for q in live[:4]]
                raise InterpreterDeadlock(f"epoch {epoch}: no queue can proceed; heads (sm, op, tile, "
                                          f"[(event, threshold, counter)]): {heads}")
            q = rng.choice(ready)
            if pending_signal[q] is not None:
                for ev, inc, _ in pending_signal[q].signals:
                    self.counters[ev] += inc
                pending_signal[q] = None
                continue
            ins = self.queues[q][pos[q]]
            self._execute(ins, epoch)
            self.trace.append((q, self.plan.ops[ins.operand_row], ins.tile_index))
            pending_signal[q] = ins
            pos[q] += 1


    def _run_dynamic(self, epoch: int, rng: random.Random, ctas: int = DYNAMIC_CTAS) -> None:
        todo = self.queues[0]  # the list (NOOPs dropped)
        nxt = 0
        held: list[list[Instruction]] = [[] for _ in range(ctas)]  # claimed, in claim order (at most two)
        pending: list[Instruction | None] = [None] * ctas
        while True:
            actions = []
            for c in range(ctas):
                if pending[c] is not None:
                    actions.append(("signal", c))
                    continue
                head_ready = bool(held[c]) and self._ready(held[c][0], epoch)
                if head_ready:
                    actions.append(("run", c))
                if nxt < len(todo) and (not held[c] or (head_ready and len(held[c]) < 2)):
                    actions.append(("claim", c))
            if not actions:
                if nxt == len(todo) and not any(held):
                    return
                heads = [(c, self.plan.ops[h[0].operand_row], h[0].tile_index,
                          [(e, t, self.counters[e]) for e, t in h[0].waits]) for c, h in enumerate(held) if h][:4]
                raise InterpreterDeadlock(f"epoch {epoch}: no CTA can proceed (dynamic list at {nxt}/{len(todo)}); "
                                          f"held heads (cta, op, tile, [(event, threshold, counter)]): {heads}")
            kind, c = rng.choice(actions)
            if kind == "signal":
                for ev, inc, _ in pending[c].signals:
                    self.counters[ev] += inc
                pending[c] = None
            elif kind == "claim":
                held[c].append(todo[nxt])
                nxt += 1
            else:
                ins = held[c].pop(0)
                self._execute(ins, epoch)
                self.trace.append((c, self.plan.ops[ins.operand_row], ins.tile_index))
                pending[c] = ins


def run_plan(plan: KernelPlan, env: Mapping[str, torch.Tensor], cfg: Glm5Config, *, seed: int = 0,
             epochs: int = 1) -> dict[str, torch.Tensor]:
    """Bind fresh outputs/workspaces, run `epochs` steps (epoch 1, 2, ...) in seeded random interleavings.

    -> env plus every produced tensor (in-place caches updated), like graph.run_eager.
    Running several epochs re-executes the same step with the counters not reset."""
    tensors = allocate(plan, env)
    plan.rebind(tensors)
    interp = Interpreter(plan, cfg)
    for e in range(1, epochs + 1):
        interp.run(epoch=e, seed=seed + e)
    return tensors
