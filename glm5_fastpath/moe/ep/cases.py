"""Deterministic EP test / bench cases: weights, per-rank routing of several kinds, per-rank inputs.

Routing kinds (global routed ids, k distinct experts per token, weights > 0 summing to 1):
  uniform    k experts uniformly at random;
  skewed     expert 0 in every token, 3 of 4 tokens pick the rest from a hot set of 2k experts, the others
             from the lower half: the upper half of the experts (whole ranks at EP >= 2) receive no token
             (tests/moe/test_megamoe.py's skew, per rank);
  nowhere    the rank's tokens select only experts of OTHER ranks (its own experts get none of its tokens);
  avoid=R    (any kind) experts of the ranks in R are never selected: those ranks receive no token.
Padding tokens (CUDA-graph padding rows) have every id -1.
The same seeds give the same tensors on CPU and GPU (generated on CPU, then moved).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch

from ...ref.fp8 import FP8, quant_act_per_token, quant_weight_block
from .layout import EPPartition
from .reference import RankInputs

KINDS = ("uniform", "skewed", "nowhere")


def make_weights(n: int, hidden: int, inter: int, seed: int) -> tuple[torch.Tensor, ...]:
    """n experts (stack [routed..., shared]) in checkpoint layout: w13 [n, 2I, H] e4m3 gate||up,
    w13_scale [n, 2I/128, H/128], w2 [n, H, I] e4m3, w2_scale [n, H/128, I/128] (CPU)."""
    g = torch.Generator().manual_seed(seed)
    w13 = torch.empty(n, 2 * inter, hidden, dtype=FP8)
    s13 = torch.empty(n, 2 * inter // 128, hidden // 128, dtype=torch.float32)
    w2 = torch.empty(n, hidden, inter, dtype=FP8)
    s2 = torch.empty(n, hidden // 128, inter // 128, dtype=torch.float32)
    for e in range(n):
        gain = 1 + torch.rand(2 * inter, 1, generator=g)
        w13[e], s13[e] = quant_weight_block(torch.randn(2 * inter, hidden, generator=g) * 0.02 * gain)
        w2[e], s2[e] = quant_weight_block(torch.randn(hidden, inter, generator=g) * 0.02)
    return w13, s13, w2, s2


def make_routing(m: int, part: EPPartition, k: int, seed: int, kind: str = "uniform", rank: int = 0,
                 avoid: Sequence[int] = (), pad_tokens: Sequence[int] = ()) -> tuple[torch.Tensor, torch.Tensor]:
    """(topk_ids [m, k] int32 global ids, topk_weights [m, k] fp32) of one rank's tokens."""
    if kind not in KINDS:
        raise ValueError(f"routing kind {kind!r} not in {KINDS}")
    E = part.num_experts
    g = torch.Generator().manual_seed(seed)
    banned = {e for r in avoid for e in part.local_experts(r)}
    if kind == "nowhere":
        banned |= set(part.local_experts(rank))
    allowed = torch.tensor([e for e in range(E) if e not in banned], dtype=torch.long)
    if allowed.numel() < k:
        raise ValueError(f"routing: only {allowed.numel()} experts allowed, top-{k} needs more")
    ids = torch.empty(m, k, dtype=torch.long)
    for t in range(m):
        if kind == "skewed":
            first = allowed[0]
            rest = allowed[1:]
            pool = min(2 * k, rest.numel()) if t % 4 else max(k - 1, min(rest.numel(), E // 2 - 1))
            ids[t, 0] = first
            ids[t, 1:] = rest[torch.randperm(pool, generator=g)[: k - 1]]
        else:
            ids[t] = allowed[torch.randperm(allowed.numel(), generator=g)[:k]]
    w = torch.rand(m, k, generator=g) + 0.05
    w = (w / w.sum(-1, keepdim=True)).float()
    for t in pad_tokens:
        if t < m:
            ids[t] = -1
    return ids.to(torch.int32), w


@dataclass
class EPCase:
    """One multi-rank case: per-rank inputs, the global weight stack, the partition."""

    name: str
    part: EPPartition
    inputs: list[RankInputs]
    weights: tuple[torch.Tensor, ...]   # global stack [E routed..., shared]
    hidden_bf16: list[torch.Tensor]     # per-rank h before the 1x128 quant (for ref.moe.moe_forward)

    @property
    def num_tokens(self) -> list[int]:
        return [int(i.x8.shape[0]) for i in self.inputs]

    def gathered(self) -> RankInputs:
        """The gathered batch [rank 0 tokens | rank 1 tokens | ...] (the single-GPU reference's input)."""
        cat = lambda xs: torch.cat(xs)  # noqa: E731
        return RankInputs(cat([i.x8 for i in self.inputs]), cat([i.x_scale for i in self.inputs]),
                          cat([i.topk_ids for i in self.inputs]), cat([i.topk_weights for i in self.inputs]))

    def rank_slice(self, r: int) -> slice:
        off = sum(self.num_tokens[:r])
        return slice(off, off + self.num_tokens[r])


def make_case(name: str, tokens: Sequence[int], part: EPPartition, k: int, hidden: int, inter: int, seed: int = 0,
              kinds: Sequence[str] | None = None, avoid: Sequence[int] = (), pad: dict[int, Sequence[int]] | None = None,
              weights: tuple[torch.Tensor, ...] | None = None) -> EPCase:
    """Per rank r: tokens[r] tokens of routing kinds[r] (default uniform), avoiding the experts of `avoid`,
    with padding rows pad[r]; weights: the global stack (made from `seed` when None)."""
    N = part.world_size
    if len(tokens) != N:
        raise ValueError(f"make_case: {len(tokens)} token counts for {N} ranks")
    kinds = list(kinds) if kinds is not None else ["uniform"] * N
    w = weights if weights is not None else make_weights(part.num_experts + part.num_shared, hidden, inter, seed)
    g = torch.Generator().manual_seed(seed + 7)
    inputs, hs = [], []
    for r, m in enumerate(tokens):
        h = torch.randn(m, hidden, generator=g).to(torch.bfloat16)
        x8, xs = quant_act_per_token(h)
        ids, wts = make_routing(m, part, k, seed * 1000 + r, kinds[r], r, avoid, (pad or {}).get(r, ()))
        inputs.append(RankInputs(x8, xs, ids, wts))
        hs.append(h)
    return EPCase(name, part, inputs, w, hs)


# ---- the standard scenarios of the tests (and of the GPU checks next to them) ---------------------------------------

SMALL_DIMS = dict(num_experts=16, topk=4, hidden=256, inter=128)
SCENARIOS: dict[str, tuple] = {
    # name: (EP size, tokens per rank, routing kind per rank (None: uniform), ranks nobody routes to, padding rows)
    "ep2_uniform": (2, [9, 5], None, (), None),
    "ep2_skewed": (2, [10, 7], ["skewed", "skewed"], (), None),
    "ep2_nowhere_m0": (2, [8, 0], ["nowhere", "uniform"], (), None),          # rank 1: M = 0
    "ep4_uniform_m0": (4, [7, 0, 12, 3], None, (), None),
    "ep4_skewed": (4, [10, 8, 6, 11], ["skewed"] * 4, (), None),              # ranks 2-3 receive (almost) nothing
    "ep4_nowhere_starved_pad": (4, [9, 4, 13, 6], ["nowhere", "uniform", "skewed", "uniform"], (3,),
                                {2: (1, 5)}),                                 # rank 3 receives no token
}


def scenario(name: str, weights: tuple[torch.Tensor, ...] | None = None, num_experts: int = 16, topk: int = 4,
             hidden: int = 256, inter: int = 128, num_shared: int = 1) -> EPCase:
    """One of SCENARIOS (seeded by its name's length, as the tests always used)."""
    n, tokens, kinds, avoid, pad = SCENARIOS[name]
    return make_case(name, tokens, EPPartition(num_experts, n, num_shared), topk, hidden, inter, seed=len(name),
                     kinds=kinds, avoid=avoid, pad=pad, weights=weights)
