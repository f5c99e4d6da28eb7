"""A small explicit op graph: named tensors, ops with def-use, and per-op tile decompositions.

Both fast executors consume this one description:
- CMP (CUDA graph + streams + PDL) uses `topo_order`, `edges` and `branches` to place ops on streams;
- MegaRTP (persistent megakernel) expands every op into `Tile`s for a given step shape and turns
  producer-write / consumer-read regions into event counters (pairing policies whole / tile /
  tile_cover / tile_reduce, design article section 4).

Conventions:
- A tensor is produced by at most one op (SSA). An in-place cache update is modelled as a new tensor
  version (`inplace_of` names the cache it updates), so the writer -> reader edge is explicit.
- A `Region` is a box: one half-open (start, stop) range per dimension of the tensor's region space
  (its shape, or `region_shape` for cache versions, whose row m is the slot of new token m).
- A split-K tile contributes a partial sum over `k_range` of the op's reduction dim to its write
  region; a consumer of that region needs all partials (tile_reduce). Other tiles write final values.
- `Tile.reads` lists the regions a tile reads where that is cheap to state; a tensor absent from
  `reads` but in the op's inputs is read whole (the safe "whole" pairing).
"""
from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Mapping, Sequence

import torch

TENSOR_KINDS = ("input", "weight", "cache", "intermediate", "output")

Dim = int | str  # a size, or a symbol resolved from ShapeContext.dims() ("M", "max_ctx", ...)
Range = tuple[int, int]
Region = tuple[Range, ...]


class GraphError(ValueError):
    """The op graph is malformed (undefined / doubly produced tensor, cycle, bad tile plan)."""


# ---- step shape ------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class ShapeContext:
    """The shape of one decode step: M query tokens, the KV length each attends, which share a KV sequence.

    seq_lens[m]: KV length token m attends (including itself). request_ids[m]: tokens with the same id
    read one KV sequence (spec-verify / MTP, or the article's shared-KV benchmark); they must be
    contiguous. None means every token is its own sequence (plain batched decode).
    """

    seq_lens: tuple[int, ...]
    request_ids: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not self.seq_lens:
            raise GraphError("ShapeContext: M must be >= 1")
        if any(s < 1 for s in self.seq_lens):
            raise GraphError(f"ShapeContext: every decode token attends >= 1 KV token, got seq_lens {self.seq_lens}")
        if self.request_ids is not None:
            if len(self.request_ids) != len(self.seq_lens):
                raise GraphError("ShapeContext: request_ids and seq_lens differ in length")
            seen: set[int] = set()
            for i, r in enumerate(self.request_ids):
                if r in seen and self.request_ids[i - 1] != r:
                    raise GraphError(f"ShapeContext: tokens of request {r} are not contiguous")
                seen.add(r)

    @classmethod
    def independent(cls, seq_lens: Iterable[int]) -> "ShapeContext":
        return cls(tuple(int(s) for s in seq_lens))

    @classmethod
    def shared_kv(cls, m: int, kv_len: int) -> "ShapeContext":
        """M tokens of one sequence ending at kv_len (causal: token i attends kv_len - M + 1 + i)."""
        return cls(tuple(kv_len - m + 1 + i for i in range(m)), tuple([0] * m))

    @property
    def M(self) -> int:  # noqa: N802 (the usual name)
        return len(self.seq_lens)

    @property
    def max_ctx(self) -> int:
        return max(self.seq_lens)

    def requests(self) -> list[tuple[int, int, int]]:
        """(first token, end token, KV length = max seq_len of its tokens) per KV sequence, in token order."""
        ids = self.request_ids if self.request_ids is not None else tuple(range(self.M))
        out: list[tuple[int, int, int]] = []
        start = 0
        for m in range(1, self.M + 1):
            if m == self.M or ids[m] != ids[start]:
                out.append((start, m, max(self.seq_lens[start:m])))
                start = m
        return out

    def dims(self) -> dict[str, int]:
        return {"M": self.M, "max_ctx": self.max_ctx}


# ---- tensors, tiles, ops -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorDef:
    name: str
    shape: tuple[Dim, ...]
    dtype: torch.dtype
    kind: str  # one of TENSOR_KINDS
    inplace_of: str | None = None  # this tensor is a new version of that cache, updated in place
    region_shape: tuple[Dim, ...] | None = None  # tile-region space when it is not `shape`
    doc: str = ""

    def __post_init__(self) -> None:
        if self.kind not in TENSOR_KINDS:
            raise GraphError(f"tensor {self.name}: kind {self.kind!r} is not one of {TENSOR_KINDS}")

    @property
    def is_external(self) -> bool:
        """Supplied by the caller, never produced by an op."""
        return self.kind in ("input", "weight") or (self.kind == "cache" and self.inplace_of is None)

    def resolve(self, dims: Mapping[str, int], region: bool = False) -> tuple[int, ...]:
        shape = self.region_shape if (region and self.region_shape is not None) else self.shape
        try:
            return tuple(dims[d] if isinstance(d, str) else d for d in shape)
        except KeyError as e:
            raise GraphError(f"tensor {self.name}: symbolic dim {e.args[0]!r} not given") from None


@dataclass(frozen=True)
class Tile:
    """One unit of work of an op for a given step shape (one MegaRTP instruction)."""

    op: str
    index: int  # position within the op's tile list
    coords: tuple[int, ...]  # named by OpDef.tile_axes
    writes: Mapping[str, Region]
    reads: Mapping[str, Region] = field(default_factory=dict)
    k_range: Range | None = None  # split-K: the slice of the reduction dim this partial covers


TileFn = Callable[[ShapeContext], list[Tile]]
RefFn = Callable[[Mapping[str, torch.Tensor]], Mapping[str, torch.Tensor]]


@dataclass(frozen=True)
class OpDef:
    name: str
    inputs: tuple[str, ...]
    outputs: tuple[str, ...]
    ref: RefFn  # {input name: tensor} -> {output name: tensor}
    tiles: TileFn
    tile_axes: tuple[str, ...] = ()
    reduce_extent: int | None = None  # K of split-K tiles (None: tiles write final values)
    doc: str = ""


@dataclass(frozen=True)
class Edge:
    src: str
    dst: str
    tensors: tuple[str, ...]


# ---- the graph ---------------------------------------------------------------------------------------------

class OpGraph:
    """Ops (in declaration order) over named tensors. Cheap to build; call validate() once."""

    def __init__(self, ops: Sequence[OpDef], tensors: Iterable[TensorDef], name: str = "graph"):
        self.name = name
        self.ops: dict[str, OpDef] = {}
        for op in ops:
            if op.name in self.ops:
                raise GraphError(f"{name}: two ops named {op.name}")
            self.ops[op.name] = op
        self.tensors: dict[str, TensorDef] = {}
        for t in tensors:
            if t.name in self.tensors:
                raise GraphError(f"{name}: tensor {t.name} defined twice")
            self.tensors[t.name] = t

    # -- def-use ------------------------------------------------------------------------------------------
    def producers(self, tensor: str) -> list[str]:
        return [o.name for o in self.ops.values() if tensor in o.outputs]

    def producer(self, tensor: str) -> str | None:
        p = self.producers(tensor)
        if len(p) > 1:
            raise GraphError(f"{self.name}: tensor {tensor} is produced by {p}")
        return p[0] if p else None

    def consumers(self, tensor: str) -> list[str]:
        return [o.name for o in self.ops.values() if tensor in o.inputs]

    def edges(self) -> list[Edge]:
        """Op -> op data edges, each with the tensors carried, in declaration order."""
        out: dict[tuple[str, str], list[str]] = {}
        for dst in self.ops.values():
            for t in dst.inputs:
                src = self.producer(t)
                if src is not None:
                    out.setdefault((src, dst.name), []).append(t)
        return [Edge(s, d, tuple(ts)) for (s, d), ts in out.items()]

    def predecessors(self, op: str) -> list[str]:
        return [e.src for e in self.edges() if e.dst == op]

    def successors(self, op: str) -> list[str]:
        return [e.dst for e in self.edges() if e.src == op]

    def topo_order(self) -> list[str]:
        """Kahn's order; ties keep declaration order (stable, so executors are reproducible)."""
        indeg = {o: 0 for o in self.ops}
        succ: dict[str, list[str]] = {o: [] for o in self.ops}
        for e in self.edges():
            indeg[e.dst] += 1
            succ[e.src].append(e.dst)
        pos = {o: i for i, o in enumerate(self.ops)}
        ready = deque(sorted((o for o, d in indeg.items() if d == 0), key=pos.get))
        order: list[str] = []
        while ready:
            o = ready.popleft()
            order.append(o)
            for s in succ[o]:
                indeg[s] -= 1
                if indeg[s] == 0:
                    ready.append(s)
            ready = deque(sorted(ready, key=pos.get))
        if len(order) != len(self.ops):
            stuck = [o for o in self.ops if o not in order]
            raise GraphError(f"{self.name}: cycle among ops {stuck}")
        return order

    def ancestors(self, op: str) -> set[str]:
        seen: set[str] = set()
        stack = self.predecessors(op)
        while stack:
            o = stack.pop()
            if o not in seen:
                seen.add(o)
                stack.extend(self.predecessors(o))
        return seen

    def independent(self, a: str, b: str) -> bool:
        """No path either way: the two ops may run concurrently (different streams / no event between)."""
        return a != b and a not in self.ancestors(b) and b not in self.ancestors(a)

    def branches(self, fork: str) -> list[str]:
        """Heads of the parallel branches after `fork`: its successors that depend on no other successor.

        E.g. A0 -> [B0, C0, B1]; B0 -> [D1, D0] (D2 also reads B0 but follows D0).
        """
        succ = self.successors(fork)
        return [s for s in succ if not any(o in self.ancestors(s) for o in succ if o != s)]

    def forks(self) -> dict[str, list[str]]:
        """Every op with more than one parallel branch after it."""
        out = {o: self.branches(o) for o in self.topo_order()}
        return {o: b for o, b in out.items() if len(b) > 1}

    # -- checks -------------------------------------------------------------------------------------------
    def validate(self) -> "OpGraph":
        n = self.name
        for op in self.ops.values():
            for t in op.inputs + op.outputs:
                if t not in self.tensors:
                    raise GraphError(f"{n}: op {op.name} uses undefined tensor {t}")
            if len(set(op.outputs)) != len(op.outputs) or len(set(op.inputs)) != len(op.inputs):
                raise GraphError(f"{n}: op {op.name} lists a tensor twice")
        for t in self.tensors.values():
            prods = self.producers(t.name)
            if len(prods) > 1:
                raise GraphError(f"{n}: tensor {t.name} is produced by several ops {prods}")
            if t.is_external and prods:
                raise GraphError(f"{n}: {t.kind} tensor {t.name} is supplied by the caller but op {prods[0]} produces it")
            if not t.is_external and not prods:
                users = self.consumers(t.name)
                raise GraphError(f"{n}: {t.kind} tensor {t.name} has no producer" + (f" (read by {users})" if users else ""))
            if t.inplace_of is not None:
                root = self.tensors.get(t.inplace_of)
                if root is None or root.kind != "cache":
                    raise GraphError(f"{n}: tensor {t.name} is an in-place version of {t.inplace_of}, which is not a cache tensor")
                # the writer must also read the old version: it updates that storage
                if t.inplace_of not in self.ops[prods[0]].inputs:
                    raise GraphError(f"{n}: op {prods[0]} writes {t.name} in place of {t.inplace_of} but does not take it as input")
        self.topo_order()  # raises on a cycle
        return self

    # -- variants and tiles ---------------------------------------------------------------------------------
    def without(self, drop: Iterable[str], retype: Mapping[str, str] | None = None, name: str | None = None) -> "OpGraph":
        """A copy without the ops in `drop` and the tensors only they used; `retype` changes tensor kinds
        (e.g. a tensor no longer produced becomes a caller-supplied input). A retyped in-place cache version
        (e.g. index_k_cache_written once B1 is dropped) stops being a version: the caller supplies it."""
        drop = set(drop)
        retype = dict(retype or {})
        ops = [o for o in self.ops.values() if o.name not in drop]
        used = {t for o in ops for t in o.inputs + o.outputs} | set(retype)
        tensors = [replace(t, kind=retype[t.name], inplace_of=None) if t.name in retype else t
                   for t in self.tensors.values() if t.name in used]
        return OpGraph(ops, tensors, name or self.name)

    def tiles(self, ctx: ShapeContext) -> dict[str, list[Tile]]:
        return {o: self.ops[o].tiles(ctx) for o in self.topo_order()}

    def tile_counts(self, ctx: ShapeContext) -> dict[str, int]:
        return {o: len(ts) for o, ts in self.tiles(ctx).items()}

    def external_tensors(self) -> list[str]:
        return [t.name for t in self.tensors.values() if t.is_external]

    def produced_tensors(self) -> list[str]:
        return [t for o in self.ops.values() for t in o.outputs]


def write_coverage(graph: OpGraph, op: str, ctx: ShapeContext) -> dict[str, torch.Tensor]:
    """Per output tensor of `op`: how many times each element is written by the op's tiles.

    A split-K partial counts k_range length / reduce_extent, so a correct plan gives exactly 1 everywhere
    (every element written once, or its K fully covered once by partials).
    """
    o = graph.ops[op]
    dims = ctx.dims()
    unit = o.reduce_extent or 1  # count in K elements, divide once at the end: exact
    cov = {t: torch.zeros(graph.tensors[t].resolve(dims, region=True), dtype=torch.int64) for t in o.outputs}
    for tile in o.tiles(ctx):
        if tile.op != op:
            raise GraphError(f"tile {tile.index} of {op} claims op {tile.op}")
        w = unit
        if tile.k_range is not None:
            if o.reduce_extent is None:
                raise GraphError(f"{op}: tile {tile.index} has a k_range but the op has no reduce_extent")
            k0, k1 = tile.k_range
            if not 0 <= k0 < k1 <= unit:
                raise GraphError(f"{op}: tile {tile.index} k_range {tile.k_range} outside [0, {unit})")
            w = k1 - k0
        for t, region in tile.writes.items():
            if t not in cov:
                raise GraphError(f"{op}: tile {tile.index} writes {t}, which is not an output of {op}")
            shape = cov[t].shape
            if len(region) != len(shape) or not all(0 <= a < b <= n for (a, b), n in zip(region, shape)):
                raise GraphError(f"{op}: tile {tile.index} writes {t} region {region}, outside or empty in {tuple(shape)}")
            cov[t][tuple(slice(a, b) for a, b in region)] += w
    return {t: c.double() / unit for t, c in cov.items()}
