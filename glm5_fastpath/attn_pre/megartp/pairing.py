"""Producer/consumer pairing policies and their host checks (design article section 4, "TaskGraph").

For one graph edge (producer op P -> consumer op C, carrying tensors T) and one consumer tile c,
`needed_producers` finds the P tasks whose writes intersect what c reads of T (a tensor c does
not list in `Tile.reads` is read whole), widened to whole reduce groups for split-K producers
(the group's last arriver writes the group's final values). The policy registered for (P, C) says
what that set must look like, and `check_policy` raises PairingError when it does not:

- whole:       no tile analysis; c waits for every P task (the default for unregistered pairs).
- tile:        exactly one P task, final values, whose write region contains c's read region.
- tile_cover:  P tasks write final values (no split-K) that cover c's read region exactly once
               (disjoint and complete).
- tile_reduce: P tasks are split-K partials whose K ranges add up to the full reduction over every
               element of c's read region.

The device sees no difference between tile_cover and tile_reduce (a counter, threshold = count);
the distinction is the data relation the host checks.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

import torch

from ...graph.op_graph import GraphError, OpGraph, Region, ShapeContext

POLICIES = ("whole", "tile", "tile_cover", "tile_reduce")


class PairingError(GraphError):
    """A registered pairing policy does not match the producer/consumer regions."""


@dataclass(frozen=True)
class ProducerTask:
    """What pairing needs of a producer task."""

    task: int
    tile_index: int
    writes: Mapping[str, Region]
    k_range: tuple[int, int] | None
    group: tuple[int, ...]  # the task ids of its reduce group ((task,) when not split-K)


def intersects(a: Region, b: Region | None) -> bool:
    return b is None or all(a0 < b1 and b0 < a1 for (a0, a1), (b0, b1) in zip(a, b))


def needed_producers(edge_tensors: Sequence[str], reads: Mapping[str, Region], producers: Sequence[ProducerTask]
                     ) -> list[int]:
    need: set[int] = set()
    for t in edge_tensors:
        region = reads.get(t)
        for p in producers:
            if t in p.writes and intersects(p.writes[t], region):
                need.update(p.group)
    return sorted(need)


def _box(graph: OpGraph, ctx: ShapeContext, tensor: str, region: Region | None) -> Region:
    if region is not None:
        return region
    return tuple((0, n) for n in graph.tensors[tensor].resolve(ctx.dims(), region=True))


def _fmt(region: Region) -> str:
    return "[" + ", ".join(f"{a}:{b}" for a, b in region) + "]"


def _raster(box: Region, regions: Sequence[tuple[Region, int]]) -> torch.Tensor:
    """Per element of `box`: the sum of the weights of `regions` covering it."""
    cnt = torch.zeros([b - a for a, b in box], dtype=torch.int64)
    for r, w in regions:
        sl = tuple(slice(max(a, ra) - a, min(b, rb) - a) for (a, b), (ra, rb) in zip(box, r))
        if all(s.start < s.stop for s in sl):
            cnt[sl] += w
    return cnt


def _bad_box(box: Region, bad: torch.Tensor) -> Region:
    idx = bad.nonzero()
    lo, hi = idx.min(0).values.tolist(), idx.max(0).values.tolist()
    return tuple((a + l, a + h + 1) for (a, _), l, h in zip(box, lo, hi))


def check_policy(policy: str, *, graph: OpGraph, ctx: ShapeContext, src: str, dst: str, dst_tile: int,
                 edge_tensors: Sequence[str], reads: Mapping[str, Region], chosen: Sequence[ProducerTask]) -> None:
    """Raise PairingError unless `chosen` (the P tasks c will wait for) matches `policy`."""
    if policy not in POLICIES:
        raise PairingError(f"pairing {src}->{dst}: unknown policy {policy!r} (known: {POLICIES})")
    where = f"pairing {src}->{dst} ({policy}): {dst} tile {dst_tile}"
    if not chosen:
        raise PairingError(f"{where} reads {list(edge_tensors)} but no {src} tile writes any of it")
    if policy == "whole":
        return
    partial = [p for p in chosen if p.k_range is not None]
    if policy in ("tile", "tile_cover") and partial:
        raise PairingError(f"{where}: {src} tiles {[p.tile_index for p in partial][:8]} are split-K partials; "
                           f"their regions are reduced, not covered (register tile_reduce)")
    if policy == "tile_reduce" and len(partial) != len(chosen):
        finals = [p.tile_index for p in chosen if p.k_range is None]
        raise PairingError(f"{where}: {src} tiles {finals[:8]} write final values, not split-K partials "
                           f"(register tile_cover or tile)")
    if policy == "tile" and len(chosen) != 1:
        raise PairingError(f"{where} reads data written by {len(chosen)} {src} tiles "
                           f"{[p.tile_index for p in chosen][:8]}...; policy tile needs exactly one (use tile_cover)")
    extent = graph.ops[src].reduce_extent or 1
    for t in edge_tensors:
        box = _box(graph, ctx, t, reads.get(t))
        weights = [(p.writes[t], (p.k_range[1] - p.k_range[0]) if p.k_range else 1) for p in chosen if t in p.writes]
        cnt = _raster(box, weights)
        want = extent if policy == "tile_reduce" else 1
        bad = cnt != want
        if bool(bad.any()):
            got = sorted(set(cnt[bad].tolist()))
            what = ("K coverage" if policy == "tile_reduce" else "coverage") + f" {got[:4]} instead of {want}"
            kind = "uncovered" if 0 in got else "overlapping" if policy != "tile_reduce" else "incompletely reduced"
            raise PairingError(f"{where} reads {t}{_fmt(box)}; region {t}{_fmt(_bad_box(box, bad))} is {kind} "
                               f"by {src} tiles {[p.tile_index for p in chosen][:8]} ({what})")
