"""OperandPtrTable: [num_ops, 16] uint64 device pointers, one row per op, slots as its family declares.

Every instruction of an op carries the op's row (operand_row); the slot meaning is the family's
(families.OpFamily.slots). Re-binding (new activations, caches, weights, workspaces) rewrites the
table only: the instruction tensor does not change. An in-place cache version (kv_cache_written)
binds to the storage of the cache it updates.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

from ...graph.op_graph import GraphError, OpGraph
from .families import WORKSPACE
from .isa import OPERAND_SLOTS
from .taskgraph import family_of


def workspace_name(op: str) -> str:
    return f"{WORKSPACE}.{op}"


class OperandTable:
    def __init__(self, graph: OpGraph, ops: Sequence[str]):
        self.graph = graph
        self.ops = list(ops)
        self.ptrs = torch.zeros(len(self.ops), OPERAND_SLOTS, dtype=torch.uint64)
        self._bound: list[list[torch.Tensor | None]] = [[None] * OPERAND_SLOTS for _ in self.ops]
        for op in self.ops:
            fam = family_of(op)
            used = set(graph.ops[op].inputs + graph.ops[op].outputs)
            unknown = used - set(fam.slots)
            if unknown:
                raise GraphError(f"op {op} uses {sorted(unknown)}, which family {fam.name} has no operand slot for "
                                 f"(slots: {fam.slots})")

    def slot_names(self, row: int) -> tuple[str, ...]:
        return family_of(self.ops[row]).slots

    def _resolve(self, name: str, op: str, tensors: Mapping[str, torch.Tensor]) -> torch.Tensor | None:
        if name == WORKSPACE:
            name = workspace_name(op)
        elif name not in self.graph.ops[op].inputs + self.graph.ops[op].outputs:
            return None  # a slot this variant of the op does not use
        td = self.graph.tensors.get(name)
        if name not in tensors and td is not None and td.inplace_of is not None:
            name = td.inplace_of
        if name not in tensors:
            raise GraphError(f"OperandTable.rebind: op {op} needs tensor {name!r}, not supplied")
        return tensors[name]

    def rebind(self, tensors: Mapping[str, torch.Tensor]) -> "OperandTable":
        """Point every slot at `tensors[name]` (same plan, new buffers)."""
        for row, op in enumerate(self.ops):
            for slot, name in enumerate(self.slot_names(row)):
                t = self._resolve(name, op, tensors)
                self._bound[row][slot] = t
                self.ptrs[row, slot] = 0 if t is None else t.data_ptr()
        return self

    def tensor(self, row: int, name: str) -> torch.Tensor:
        """The tensor behind (row, slot `name`), checked against the pointer the device would read."""
        names = self.slot_names(row)
        if name not in names:
            raise GraphError(f"op {self.ops[row]} has no operand slot {name!r} (slots: {names})")
        slot = names.index(name)
        t = self._bound[row][slot]
        if t is None or int(self.ptrs[row, slot]) != t.data_ptr():
            raise GraphError(f"operand {self.ops[row]}.{name} (row {row}, slot {slot}) is not bound")
        return t
