"""Expert parallelism (EP) for MegaMoE: the partition, the per-rank dispatch plan and the symmetric-buffer
layout, as pure functions of the routing (issue #8; design: docs/megamoe_ep.md).

Partition (EPPartition)
    N ranks, E routed experts, E % N == 0, epr = E / N experts per rank:
        expert e lives on rank e // epr with local id e % epr (contiguous blocks: SGLang's EP layout, and
        DeepGEMM / DeepEP's; a rank's local weight stack is a contiguous slice of the global one).
    The shared expert (GLM-5: one) is REPLICATED on every rank as local id epr (after the routed ones:
    the MegaMoEWeights / SGLang fused-shared-expert stack [routed..., shared]) and each rank computes it
    for ITS OWN tokens only. Why: every token selects it, so placing it on one rank would send every
    token there (a hotspot with N x the pairs of any other rank) and add one slot of combine traffic
    per token; sharding it (TP) would add an all-reduce. Replication costs one expert of weights per
    rank (37.75 MB FP8 for GLM-5, 1/33 more at EP8) and makes its slot purely local: it is never
    dispatched and never crosses NVLink (also not in the FP8 combine: it stays bf16).

Dispatch plan (RankPlan, what the in-kernel plan kernel of rank d computes from ALL ranks' topk_ids)
    pairs (src, t, j): token t of rank src, slot j (j < k routed, j == k the shared expert); a token
    whose first id is negative is padding (SGLang's CUDA-graph padding rows): no pairs, output row 0.
    rank d owns the routed pairs with owner(topk_ids[src][t, j]) == d, and the shared pairs (d, t, k)
    of its own tokens.
    ORDER (deterministic, independent of thread timing): local experts in id order (routed 0..epr-1,
    then the shared expert); within an expert by (src rank, token) ascending (a token selects an
    expert at most once, so the slot never breaks a tie). This is exactly the order in which the
    single-GPU MegaMoE reference visits an expert's pairs on the gathered batch
    [rank 0 tokens | rank 1 tokens | ...], which is what makes the EP result bitwise comparable.
    Token pool: each remote token with at least one pair on d is pulled ONCE (deduplicated, not once
    per pair), pool rows ordered by (src, token). Rank d's token rows: [own x8 rows 0..M_d-1 | pulled
    rows M_d..M_d+R-1]; pair_row indexes that concatenation (the kernel: row < M_d -> own x8 of the
    current parity, else the local recv pool row - M_d).

Counts: pair_counts[src, dst] (routed pairs), token_counts[src, dst] (distinct tokens; off-diagonal =
rows pulled over NVLink), dispatch/combine byte totals.

Combine map (CombineMap, per source rank): for every (t, j) the rank that computes it and its pair
index there (= row of that rank's output pool in combine mode B, and what its plan kernel writes
into the source's pair_loc table).

Buffers (buffer_layout): the per-rank symmetric allocation (peers read or write it) and the local
workspace, with byte sizes; glm5_size_table() tabulates GLM-5 (H 6144, I 2048, 256 experts, top-8,
S = 9) for max_tokens 1..4096 per rank and EP 2/4/8.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

PAD = -1  # padding token / no location


class EPLayoutError(ValueError):
    """Bad EP arguments (partition, routing, buffer sizes)."""


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


def _align(a: int, b: int) -> int:
    return _cdiv(a, b) * b


# ---- partition ---------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class EPPartition:
    """E routed experts over N ranks in contiguous blocks; the shared expert replicated (local id epr)."""

    num_experts: int
    world_size: int
    num_shared: int = 1

    def __post_init__(self) -> None:
        if self.world_size < 1:
            raise EPLayoutError(f"world_size={self.world_size} must be >= 1")
        if self.num_experts < self.world_size or self.num_experts % self.world_size:
            raise EPLayoutError(f"num_experts={self.num_experts} must be a positive multiple of world_size="
                                f"{self.world_size}")
        if self.num_shared not in (0, 1):
            raise EPLayoutError(f"num_shared={self.num_shared} must be 0 or 1")

    @property
    def experts_per_rank(self) -> int:
        return self.num_experts // self.world_size

    @property
    def num_local_total(self) -> int:
        """Experts in a rank's weight stack: the local routed experts, then the shared one."""
        return self.experts_per_rank + self.num_shared

    @property
    def shared_local_id(self) -> int | None:
        return self.experts_per_rank if self.num_shared else None

    def owner(self, e: int) -> int:
        if not 0 <= e < self.num_experts:
            raise EPLayoutError(f"expert {e} outside [0, {self.num_experts})")
        return e // self.experts_per_rank

    def local_id(self, e: int) -> int:
        if not 0 <= e < self.num_experts:
            raise EPLayoutError(f"expert {e} outside [0, {self.num_experts})")
        return e % self.experts_per_rank

    def global_id(self, rank: int, local: int) -> int:
        """Global routed id of local expert `local` of `rank` (local < experts_per_rank)."""
        if not (0 <= rank < self.world_size and 0 <= local < self.experts_per_rank):
            raise EPLayoutError(f"(rank {rank}, local {local}) outside ({self.world_size}, {self.experts_per_rank})")
        return rank * self.experts_per_rank + local

    def local_experts(self, rank: int) -> range:
        """Global ids of the routed experts of `rank`."""
        return range(rank * self.experts_per_rank, (rank + 1) * self.experts_per_rank)

    def weight_rows(self, rank: int) -> list[int]:
        """Rows of the global stack [E routed..., shared] that form rank's local stack [routed..., shared]."""
        return list(self.local_experts(rank)) + ([self.num_experts] if self.num_shared else [])


# ---- routing checks ------------------------------------------------------------------------------------------

def _check_ids(ids: torch.Tensor, part: EPPartition, src: int, topk: int | None) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 2 or ids.dtype not in (torch.int32, torch.int64):
        got = f"{ids.dtype} {tuple(ids.shape)}" if isinstance(ids, torch.Tensor) else type(ids).__name__
        raise EPLayoutError(f"topk_ids of rank {src} must be a 2-D int32/int64 tensor, got {got}")
    if topk is not None and ids.shape[1] != topk:
        raise EPLayoutError(f"topk_ids of rank {src} has {ids.shape[1]} columns, rank 0 has {topk}")
    ids = ids.detach().to("cpu", torch.int64)
    valid = ids[:, 0] >= 0 if ids.shape[0] else torch.zeros(0, dtype=torch.bool)
    v = ids[valid]
    if v.numel():
        lo, hi = int(v.min()), int(v.max())
        if lo < 0 or hi >= part.num_experts:
            raise EPLayoutError(f"topk_ids of rank {src}: ids span [{lo}, {hi}], routed experts are "
                                f"[0, {part.num_experts}) (padding rows: first id negative)")
        s = v.sort(dim=1).values
        if bool((s[:, 1:] == s[:, :-1]).any()):
            raise EPLayoutError(f"topk_ids of rank {src}: a token selects an expert twice")
    return ids


def valid_tokens(ids: torch.Tensor) -> torch.Tensor:
    """Bool [M]: tokens that are not padding (first id >= 0)."""
    return ids[:, 0] >= 0 if ids.shape[0] else torch.zeros(0, dtype=torch.bool, device=ids.device)


# ---- the dispatch plan -------------------------------------------------------------------------------------

@dataclass
class RankPlan:
    """What rank `rank` computes and pulls (all int64 CPU tensors).

    pool_src / pool_token [R]: remote tokens pulled into the local token pool, in pool order (src, token).
    pair_src / pair_token / pair_slot [P]: the rank's pairs, grouped by local expert (routed 0..epr-1,
        then the shared expert), within an expert by (src, token); pair p is row p of the rank's local
        output pool (combine mode B).
    pair_row [P]: the pair's token row in [own tokens (M_rank rows) | pulled pool rows].
    pair_expert [P]: local expert id; expert_offsets [epr + n_shared + 1]: pair ranges per local expert.
    """

    rank: int
    partition: EPPartition
    topk: int
    num_tokens: tuple[int, ...]
    pool_src: torch.Tensor
    pool_token: torch.Tensor
    pair_src: torch.Tensor
    pair_token: torch.Tensor
    pair_slot: torch.Tensor
    pair_row: torch.Tensor
    pair_expert: torch.Tensor
    expert_offsets: list[int] = field(default_factory=list)

    @property
    def num_pairs(self) -> int:
        return int(self.pair_src.numel())

    @property
    def num_pulled(self) -> int:
        return int(self.pool_src.numel())

    @property
    def num_slots(self) -> int:
        return self.topk + self.partition.num_shared

    def expert_pairs(self, local: int) -> list[tuple[int, int, int]]:
        """(src, token, slot) of local expert `local` in plan order."""
        a, b = self.expert_offsets[local], self.expert_offsets[local + 1]
        return list(zip(self.pair_src[a:b].tolist(), self.pair_token[a:b].tolist(), self.pair_slot[a:b].tolist()))

    def expert_counts(self) -> list[int]:
        return [self.expert_offsets[i + 1] - self.expert_offsets[i] for i in range(len(self.expert_offsets) - 1)]


def _routed_pairs(ids: torch.Tensor):
    """All routed pairs of one source rank as (expert, token, slot) int64 tensors in (token, slot) order."""
    m, k = ids.shape
    ok = valid_tokens(ids)
    tok = torch.arange(m).repeat_interleave(k)
    slot = torch.arange(k).repeat(m)
    e = ids.reshape(-1)
    keep = ok.repeat_interleave(k)
    return e[keep], tok[keep], slot[keep]


def dispatch_plan(topk_ids: Sequence[torch.Tensor], part: EPPartition, rank: int) -> RankPlan:
    """Rank `rank`'s plan from every rank's topk_ids [M_r, k] (global routed ids; padding rows -1)."""
    if not 0 <= rank < part.world_size:
        raise EPLayoutError(f"rank={rank} outside [0, {part.world_size})")
    return _plan_one(_checked(topk_ids, part), part, rank)


def _checked(topk_ids: Sequence[torch.Tensor], part: EPPartition) -> list[torch.Tensor]:
    if len(topk_ids) != part.world_size:
        raise EPLayoutError(f"got topk_ids of {len(topk_ids)} ranks for world_size={part.world_size}")
    k = int(topk_ids[0].shape[1]) if isinstance(topk_ids[0], torch.Tensor) and topk_ids[0].dim() == 2 else None
    if k is not None and not 1 <= k <= part.num_experts:
        raise EPLayoutError(f"top-k={k} must be in 1..{part.num_experts}")
    return [_check_ids(ids, part, r, k) for r, ids in enumerate(topk_ids)]


def _plan_one(ids_all: list[torch.Tensor], part: EPPartition, rank: int) -> RankPlan:
    N, epr = part.world_size, part.experts_per_rank
    k = int(ids_all[0].shape[1])
    M = tuple(int(i.shape[0]) for i in ids_all)
    lo, hi = rank * epr, (rank + 1) * epr
    srcs, toks, slots, locs = [], [], [], []
    for src in range(N):  # ascending src, then (token, slot): the concatenation is already in plan order
        e, t, j = _routed_pairs(ids_all[src])
        mine = (e >= lo) & (e < hi)
        srcs.append(torch.full((int(mine.sum()),), src, dtype=torch.int64))
        toks.append(t[mine])
        slots.append(j[mine])
        locs.append(e[mine] - lo)
    src_c, tok_c, slot_c, loc_c = (torch.cat(x) if x else torch.zeros(0, dtype=torch.int64)
                                   for x in (srcs, toks, slots, locs))
    # stable sort by local expert keeps (src, token) order inside each expert
    order = torch.sort(loc_c, stable=True).indices
    src_c, tok_c, slot_c, loc_c = src_c[order], tok_c[order], slot_c[order], loc_c[order]
    if part.num_shared:
        own = torch.nonzero(valid_tokens(ids_all[rank])).flatten()
        src_c = torch.cat([src_c, torch.full_like(own, rank)])
        tok_c = torch.cat([tok_c, own])
        slot_c = torch.cat([slot_c, torch.full_like(own, k)])
        loc_c = torch.cat([loc_c, torch.full_like(own, epr)])
    counts = torch.bincount(loc_c, minlength=part.num_local_total).tolist() if loc_c.numel() else \
        [0] * part.num_local_total
    offsets = [0]
    for c in counts:
        offsets.append(offsets[-1] + c)
    # token pool: distinct remote (src, token), ordered by (src, token)
    remote = src_c != rank
    key = src_c[remote] * (max(M) + 1) + tok_c[remote]
    ukey = torch.unique(key, sorted=True)
    pool_src = ukey // (max(M) + 1) if ukey.numel() else torch.zeros(0, dtype=torch.int64)
    pool_tok = ukey % (max(M) + 1) if ukey.numel() else torch.zeros(0, dtype=torch.int64)
    pair_row = tok_c.clone()
    if ukey.numel():
        pair_row[remote] = M[rank] + torch.searchsorted(ukey, key)
    return RankPlan(rank, part, k, M, pool_src, pool_tok, src_c, tok_c, slot_c, pair_row, loc_c, offsets)


def plan_all(topk_ids: Sequence[torch.Tensor], part: EPPartition) -> list[RankPlan]:
    """Every rank's plan (each rank's plan kernel computes its own; the tests and the gloo path use all)."""
    ids_all = _checked(topk_ids, part)
    return [_plan_one(ids_all, part, r) for r in range(part.world_size)]


# ---- counts -----------------------------------------------------------------------------------------------------

def pair_counts(topk_ids: Sequence[torch.Tensor], part: EPPartition) -> torch.Tensor:
    """[N, N] int64: routed pairs of source rank (row) computed on destination rank (column)."""
    ids_all = _checked(topk_ids, part)
    out = torch.zeros(part.world_size, part.world_size, dtype=torch.int64)
    for src, ids in enumerate(ids_all):
        e, _, _ = _routed_pairs(ids)
        if e.numel():
            out[src] += torch.bincount(e // part.experts_per_rank, minlength=part.world_size)
    return out


def token_counts(topk_ids: Sequence[torch.Tensor], part: EPPartition) -> torch.Tensor:
    """[N, N] int64: distinct tokens of source rank (row) with at least one routed pair on destination rank
    (column). Off-diagonal entries are the rows a destination pulls over NVLink (dispatch)."""
    ids_all = _checked(topk_ids, part)
    N = part.world_size
    out = torch.zeros(N, N, dtype=torch.int64)
    for src, ids in enumerate(ids_all):
        ok = valid_tokens(ids)
        if not ids.shape[0]:
            continue
        owners = ids[ok] // part.experts_per_rank  # [M_valid, k]
        hit = torch.zeros(owners.shape[0], N, dtype=torch.bool)
        if owners.numel():
            hit.scatter_(1, owners, True)
        out[src] = hit.sum(0)
    return out


@dataclass(frozen=True)
class TrafficSummary:
    """Bytes moved between ranks for one call (NVLink), per rank and in total."""

    dispatch_rows: torch.Tensor       # [N] rows pulled by each destination
    combine_pairs: torch.Tensor       # [N] remote pair results sent back by each expert rank
    dispatch_bytes: torch.Tensor      # [N] per destination: rows x (H + H/128 * 4)
    combine_bytes_bf16: torch.Tensor  # [N] per expert rank: pairs x H x 2
    combine_bytes_fp8: torch.Tensor   # [N] per expert rank: pairs x H x (1 + 1/32)


def traffic(topk_ids: Sequence[torch.Tensor], part: EPPartition, hidden: int) -> TrafficSummary:
    tc, pc = token_counts(topk_ids, part), pair_counts(topk_ids, part)
    off = 1 - torch.eye(part.world_size, dtype=torch.int64)
    rows = (tc * off).sum(0)
    pairs = (pc * off).sum(0)
    return TrafficSummary(rows, pairs, rows * (hidden + hidden // 128 * 4), pairs * hidden * 2,
                          pairs * (hidden + hidden // 32))


# ---- combine map (where each (token, slot) result lives) -------------------------------------------------------

@dataclass
class CombineMap:
    """For source rank `rank`: owner rank and pair index there of every (token, slot) [M, S] (int64, PAD for
    padding tokens). The shared slot (j == k) is the rank itself."""

    rank: int
    dst_rank: torch.Tensor
    dst_pair: torch.Tensor


def combine_maps(plans: Sequence[RankPlan]) -> list[CombineMap]:
    part = plans[0].partition
    S = plans[0].num_slots
    M = plans[0].num_tokens
    maps = [CombineMap(s, torch.full((M[s], S), PAD, dtype=torch.int64), torch.full((M[s], S), PAD, dtype=torch.int64))
            for s in range(part.world_size)]
    for d, p in enumerate(plans):
        idx = torch.arange(p.num_pairs)
        for s in range(part.world_size):
            sel = p.pair_src == s
            if bool(sel.any()):
                maps[s].dst_rank[p.pair_token[sel], p.pair_slot[sel]] = d
                maps[s].dst_pair[p.pair_token[sel], p.pair_slot[sel]] = idx[sel]
    return maps


# ---- symmetric buffer layout -------------------------------------------------------------------------------------

MODES = ("A", "B", "fp8")
FIELD_ALIGN = 256        # every field starts 256-byte aligned (TMA needs 16; 256 keeps 128B-swizzle boxes happy)
E8M0_BLOCK = 32          # FP8 combine: one E8M0 scale per 32 elements
PAIR_ALIGN = 8           # as the single-GPU plan: each expert's pair range starts at a multiple of 8
TILE_COLS = 256          # FC2 output tile width: combine counters per (token, 256 columns)

_DTYPE_BYTES = {"e4m3": 1, "u8": 1, "bf16": 2, "i32": 4, "f32": 4}


@dataclass(frozen=True)
class BufferField:
    name: str
    shape: tuple[int, ...]
    dtype: str
    symmetric: bool  # in the peer-accessible allocation
    writer: str
    reader: str
    offset: int = 0

    @property
    def nbytes(self) -> int:
        n = _DTYPE_BYTES[self.dtype]
        for s in self.shape:
            n *= s
        return n


@dataclass(frozen=True)
class EPBufferLayout:
    hidden: int
    inter: int
    num_experts: int
    topk: int
    num_shared: int
    world_size: int
    max_tokens: int
    modes: tuple[str, ...]
    recv_cap: int
    pairs_cap: int
    fields: tuple[BufferField, ...]

    @property
    def num_slots(self) -> int:
        return self.topk + self.num_shared

    def field(self, name: str) -> BufferField:
        for f in self.fields:
            if f.name == name:
                return f
        raise KeyError(name)

    @property
    def symmetric_bytes(self) -> int:
        """Size of one rank's symmetric allocation (same on every rank; offsets included)."""
        sym = [f for f in self.fields if f.symmetric]
        return _align(sym[-1].offset + sym[-1].nbytes, FIELD_ALIGN) if sym else 0

    @property
    def local_bytes(self) -> int:
        loc = [f for f in self.fields if not f.symmetric]
        return _align(loc[-1].offset + loc[-1].nbytes, FIELD_ALIGN) if loc else 0

    def bytes_by_group(self) -> dict[str, int]:
        """Field bytes per group: inputs, signals, combine_ctr, A, B, fp8 (symmetric); pool, workspace, fp8_local."""
        groups = {"inputs": ("x8", "x_scale", "topk_ids", "topk_weights"), "signals": ("signals",),
                  "combine_ctr": ("combine_ctr",), "A": ("slots",), "B": ("out_pool", "pair_loc"),
                  "fp8": ("slots_fp8", "slots_e8m0"), "fp8_local": ("shared_y",),
                  "pool": ("recv_x8", "recv_scale", "pool_src"),
                  "workspace": ("pair_code", "pair_weight", "act", "act_scale", "tasks", "counters", "shared_y")}
        have = {f.name: f.nbytes for f in self.fields}
        return {g: sum(have.get(n, 0) for n in names) for g, names in groups.items()}


def worst_case_caps(world_size: int, max_tokens: int, topk: int, num_experts: int, num_shared: int) -> tuple[int, int]:
    """(recv_cap, pairs_cap) that no routing can overflow: every remote token pulled once; every token of
    every rank with min(k, epr) routed pairs here, plus the own shared pairs and per-expert alignment."""
    epr = num_experts // world_size
    recv = (world_size - 1) * max_tokens
    pairs = world_size * max_tokens * min(topk, epr) + num_shared * max_tokens + PAIR_ALIGN * (epr + num_shared)
    return recv, _align(pairs, PAIR_ALIGN)


def buffer_layout(hidden: int, inter: int, num_experts: int, topk: int, world_size: int, max_tokens: int, *,
                  num_shared: int = 1, modes: Sequence[str] = MODES, recv_cap: int | None = None,
                  pairs_cap: int | None = None) -> EPBufferLayout:
    """Per-rank buffers of the in-kernel EP MegaMoE (docs/megamoe_ep.md, "Buffers").

    Symmetric (one torch symmetric-memory allocation per rank, identical layout on every rank):
      x8 [T, H] e4m3, x_scale [T, H/128] f32, topk_weights [T, k] f32: the rank's inputs (written by the op's
          input copy, later directly by the producer kernel); single-buffered: a peer reads them only for
          pairs it computes for this rank, and this rank's call cannot finish before those pairs' results
          arrived, so they are never read after the call ends;
      topk_ids [2][T, k] i32 (+ num_tokens in signals): read by EVERY peer's plan kernel, also by peers that
          compute nothing for this rank, so they are double-buffered by call parity (epoch & 1) and copied
          in by the plan kernel (no exit barrier needed);
      signals: epoch, num_tokens[2], ready[N] (peers store their epoch here: the entry barrier), diag;
      combine_ctr [T, H/256] i32: per (token, 256-column tile) arrivals of slot results (peers' atomics);
      A:   slots [T, S, H] bf16: peers' FC2 epilogues store the weighted y of pair (t, j) here;
      B:   out_pool [pairs_cap, H] bf16 (this rank's FC2 outputs, read by the source ranks' combine warps)
           and pair_loc [T, S] i32 (the owner's plan kernel writes the pair index of (t, j));
      fp8: slots_fp8 [T, k, H] e4m3 + slots_e8m0 [T, k, H/32] u8 (routed slots only).
    Local workspace (not peer-accessible):
      recv_x8 [recv_cap, H] e4m3, recv_scale [recv_cap, H/128] f32, pool_src [recv_cap] i32 (src << 24 | token);
      pair_code / pair_weight [pairs_cap], act [pairs_cap, I] e4m3 + act_scale [I/128, pairs_cap] f32
      (FC1 output, as the single-GPU workspace), tasks, counters (fc1_done, pool-ready per block);
      fp8 mode: shared_y [T, H] bf16 (the shared slot is local and stays bf16).
    T = max_tokens per rank. recv_cap / pairs_cap default to the worst case (worst_case_caps).
    """
    bad = [m for m in modes if m not in MODES]
    if bad:
        raise EPLayoutError(f"unknown combine mode(s) {bad}; choose from {MODES}")
    if hidden % TILE_COLS or inter % 128 or max_tokens < 1 or topk < 1:
        raise EPLayoutError(f"need H % 256 == 0, I % 128 == 0, max_tokens >= 1, topk >= 1 (H={hidden}, I={inter}, "
                            f"max_tokens={max_tokens}, topk={topk})")
    part = EPPartition(num_experts, world_size, num_shared)
    T, H, I, k, N = max_tokens, hidden, inter, topk, world_size
    S = k + num_shared
    wr, wp = worst_case_caps(N, T, k, num_experts, num_shared)
    recv_cap = wr if recv_cap is None else recv_cap
    pairs_cap = wp if pairs_cap is None else _align(pairs_cap, PAIR_ALIGN)
    blocks_cap = _cdiv(pairs_cap, 8) + part.num_local_total
    tasks_cap = blocks_cap * (2 * 2 * I // 256 + H // 256)
    sym = [
        BufferField("x8", (T, H), "e4m3", True, "own rank (input copy)", "own FC1 + peers' dispatch pull"),
        BufferField("x_scale", (T, H // 128), "f32", True, "own rank", "own FC1 + peers' dispatch pull"),
        BufferField("topk_ids", (2, T, k), "i32", True, "own plan kernel (parity epoch & 1)",
                    "every rank's plan kernel"),
        BufferField("topk_weights", (T, k), "f32", True, "own rank", "owner ranks' plan kernels (pair weights)"),
        BufferField("signals", (_align(8 + N, 64),), "i32", True, "own plan kernel; peers store ready[]",
                    "own plan kernel (entry barrier)"),
    ]
    if modes:
        sym.append(BufferField("combine_ctr", (T, H // TILE_COLS), "i32", True, "owner ranks (red.release.sys)",
                               "own combine (acquire.sys), reset to 0 by it"))
    if "A" in modes:
        sym.append(BufferField("slots", (T, S, H), "bf16", True, "owner ranks' FC2 epilogues (remote stores)",
                               "own combine"))
    if "B" in modes:
        sym.append(BufferField("out_pool", (pairs_cap, H), "bf16", True, "own FC2 epilogue",
                               "source ranks' combine warps (remote loads)"))
        sym.append(BufferField("pair_loc", (T, S), "i32", True, "owner ranks' plan kernels", "own combine warps"))
    if "fp8" in modes:
        sym.append(BufferField("slots_fp8", (T, k, H), "e4m3", True, "owner ranks' FC2 epilogues", "own top-k reduce"))
        sym.append(BufferField("slots_e8m0", (T, k, H // E8M0_BLOCK), "u8", True, "owner ranks' FC2 epilogues",
                               "own top-k reduce"))
    loc = [
        BufferField("recv_x8", (recv_cap, H), "e4m3", False, "own dispatch warp (pull)", "own FC1"),
        BufferField("recv_scale", (recv_cap, H // 128), "f32", False, "own dispatch warp", "own FC1"),
        BufferField("pool_src", (recv_cap,), "i32", False, "own plan kernel", "own dispatch warp"),
        BufferField("pair_code", (pairs_cap,), "i32", False, "own plan kernel", "own loader / epilogues"),
        BufferField("pair_weight", (pairs_cap,), "f32", False, "own plan kernel (from peers' topk_weights)",
                    "own FC2 epilogue"),
        BufferField("act", (pairs_cap, I), "e4m3", False, "own FC1 epilogue", "own FC2"),
        BufferField("act_scale", (I // 128, pairs_cap), "f32", False, "own FC1 epilogue", "own FC2"),
        BufferField("tasks", (tasks_cap,), "i32", False, "own plan kernel", "own scheduler"),
        BufferField("counters", (2 * blocks_cap + 64,), "i32", False, "own kernels", "own kernels"),
    ]
    if "fp8" in modes and num_shared:
        loc.append(BufferField("shared_y", (T, H), "bf16", False, "own shared-expert FC2 epilogue", "own top-k reduce"))
    fields: list[BufferField] = []
    for group in (sym, loc):
        off = 0
        for f in group:
            fields.append(BufferField(f.name, f.shape, f.dtype, f.symmetric, f.writer, f.reader, off))
            off = _align(off + f.nbytes, FIELD_ALIGN)
    return EPBufferLayout(H, I, num_experts, k, num_shared, N, T, tuple(modes), recv_cap, pairs_cap, tuple(fields))


# ---- GLM-5 size table -----------------------------------------------------------------------------------------

GLM5_DIMS = dict(hidden=6144, inter=2048, num_experts=256, topk=8, num_shared=1)
TABLE_TOKENS = (1, 16, 64, 256, 1024, 4096)
TABLE_EP = (2, 4, 8)


def glm5_size_table(max_tokens: Sequence[int] = TABLE_TOKENS, world_sizes: Sequence[int] = TABLE_EP) -> list[dict]:
    """Per (EP size, max_tokens per rank): bytes of each buffer group of GLM-5, worst-case capacities."""
    rows = []
    for n in world_sizes:
        for t in max_tokens:
            lay = buffer_layout(world_size=n, max_tokens=t, **GLM5_DIMS)
            g = lay.bytes_by_group()
            rows.append({"ep": n, "max_tokens": t, "recv_cap": lay.recv_cap, "pairs_cap": lay.pairs_cap,
                         "symmetric_bytes": lay.symmetric_bytes, "local_bytes": lay.local_bytes, **g})
    return rows


def _mb(b: int) -> str:
    return f"{b / 1e6:.1f}" if b >= 1e5 else f"{b / 1e6:.3f}"


def format_size_table(rows: Sequence[dict]) -> str:
    """Markdown (MB = 1e6 bytes) of glm5_size_table()."""
    out = ["| EP | max tokens/rank | inputs + signals | combine ctr | A: slots | B: out pool + loc | fp8 slots | "
           "symmetric total | recv pool | workspace (act...) | local total |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        out.append(f"| {r['ep']} | {r['max_tokens']} | {_mb(r['inputs'] + r['signals'])} | {_mb(r['combine_ctr'])} | "
                   f"{_mb(r['A'])} | {_mb(r['B'])} | {_mb(r['fp8'])} | "
                   f"{_mb(r['symmetric_bytes'])} | {_mb(r['pool'])} | {_mb(r['workspace'])} | {_mb(r['local_bytes'])} |")
    return "\n".join(out)
