"""Eager executor: run an OpGraph's reference ops in topological order over a dict of named tensors.

It is the executable meaning of the graph: a fast executor is correct when it produces what
`run_eager` produces. Each op sees only the tensors it declares (undeclared reads fail), must return
exactly its declared outputs, and an in-place cache version must be the very storage it updates.
"""
from __future__ import annotations

from typing import Callable, Mapping

import torch

from .op_graph import GraphError, OpGraph


OpImpl = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]
OpHook = Callable[[str, Callable[[], Mapping[str, torch.Tensor]]], Mapping[str, torch.Tensor]]


def run_eager(graph: OpGraph, env: Mapping[str, torch.Tensor], *, impls: Mapping[str, OpImpl] | None = None,
              hook: OpHook | None = None) -> dict[str, torch.Tensor]:
    """-> a new dict: the caller's tensors plus every tensor the ops produced (caches are updated in place).

    impls: per-op replacements of the reference (same inputs -> same outputs contract), e.g. a kernel.
    hook(name, run): called instead of run() for every op, e.g. to time it; must return run()'s result.
    """
    missing = [t for t in graph.external_tensors() if t not in env]
    if missing:
        raise GraphError(f"run_eager({graph.name}): caller must supply {missing}")
    out = dict(env)
    for name in graph.topo_order():
        op = graph.ops[name]
        fn = (impls or {}).get(name, op.ref)
        ins = {t: out[t] for t in op.inputs}
        produced = hook(name, lambda: fn(ins)) if hook is not None else fn(ins)
        if set(produced) != set(op.outputs):
            raise GraphError(f"run_eager: op {name} returned {sorted(produced)}, declared {sorted(op.outputs)}")
        for t, v in produced.items():
            root = graph.tensors[t].inplace_of
            if root is not None and v.data_ptr() != out[root].data_ptr():
                raise GraphError(f"run_eager: op {name} returned {t} in new storage instead of updating {root} in place")
            out[t] = v
    return out
