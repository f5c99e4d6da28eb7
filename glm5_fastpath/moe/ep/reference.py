"""The EP MegaMoE computation in PyTorch: the single-GPU MegaMoE math executed per rank with explicit
dispatch / compute / combine (issue #8; plan rules: layout.py; kernel design: docs/megamoe_ep.md).

Math (= glm5_fastpath/moe/megamoe.py's docstring, rounding point by rounding point):
    FC1   gu = bf16(fp8_linear(x8[t], W13_e))          act  a = bf16(silu(g) * u), a8 = 1x128 requant of a
    FC2   y  = bf16(fp8_linear(a8, W2_e) * w)           w = topk_weights[t, j], or fp32(1/rsf) for the shared slot
    combine out[t] = bf16(rsf * sum_{j=0..S-1} fp32(y[t, j]))   (ref.moe.moe_combine: slot order, fp32)
fp8_linear = the block-FP8 GEMM with the 128-wide group partial sums computed EXACTLY (float64: products of
two e4m3 values are multiples of 2^-18 below 2^18, a 128-term sum stays below 2^25, so every partial fits
in 53 bits whatever the summation order) and rounded once to fp32, then scaled and accumulated over the
groups in order g = 0, 1, ... in fp32, as ref.fp8.block_fp8_linear ((partial * x_scale) * w_scale).
Every op runs on fixed tiles of `tile_rows` rows (zero padded; 4 rows keeps every GLM-5 elementwise tensor
under torch's 32768-element parallel grain), so a row's result never depends on which other rows share its
batch. That is the property the EP path needs: rank d computes expert e on the pairs it pulled and the
shared expert on its own tokens only, the single-GPU reference computes them on the gathered batch, and the
results are the same bits. (ref.moe.moe_forward uses an fp32 einsum: equal within fp8_same_quant.)

Combine modes (all produce out [M, H] bf16 on the token's source rank):
  A   sender addressing: the expert rank writes the weighted bf16 y of pair (t, j) into the source's slot
      buffer [M, S, H] at (t, j); the source sums its slots in slot order.
  B   receiver addressing: the expert rank keeps y in its local output pool (pair order); the source looks up
      where each (t, j) lives (CombineMap: owner rank, pair index) and reads the S rows in slot order.
  A and B are bitwise equal to each other and to the single-GPU reference: each (t, j) carries the same bf16
  value (computed once, by the same function on a batch-invariant tile), and the reduction is the same
  function (moe_combine) over the same slot order; neither mode changes a value or an order, only who
  addresses the slot buffer.
  fp8 low-precision combine: each ROUTED slot's bf16 y is quantized per 32 consecutive elements with an E8M0
      (power-of-two) scale before it is sent: e = smallest integer with 448 * 2^e >= amax_32 (no saturation;
      amax_32 / 2^e in (224, 448]); q = e4m3(y / 2^e) (the division is exact, one RNE rounding). The shared
      slot is local and stays bf16. The source's separate top-k reduce: out = bf16(rsf * sum_j fp32(deq_j)),
      slot order, shared slot last. Bytes on NVLink per routed pair: H * (1 + 1/32) instead of 2H.
      Error vs the bf16 combine (fp8_combine_error_bound, rigorous, elementwise):
          |out_fp8 - out_bf16| <= rsf * E + 2^-7 * mag + S * 2^-22 * mag,
          E = sum_{j<k} (|y_j| / 16 + amax_32(j) / 229376),   mag = rsf * (sum_j |y_j| + E)
      (e4m3 RNE: half-ulp <= 2^-4 |v| for normals, 2^-10 absolute in the subnormal range, and 2^e <= amax/224;
      2^-7 * mag covers the two final bf16 roundings; the last term the fp32 sums; measured max diff/bound
      0.66). Measured rel_err(out_fp8, out_bf16): 2.0-2.3e-2 with top-4 + the bf16 shared slot, 2.4e-2 on
      random top-8 slots (tests/moe/ep/test_ep_reference.py prints them), vs 0 for modes A/B and 4e-3 for
      the staged baseline: the size of the FP8 GEMM noise itself, so it is a model-quality decision, not a
      free win. Only routed slots are quantized, on every rank including local experts, so the FP8 result
      does not depend on N (tested: EP2 == EP4 bitwise).

Two executions of the same plan: ep_forward_simulated (one process, N ranks as lists of tensors) and
ep_forward_dist (one rank per process over torch.distributed: gloo on CPU, NCCL on GPU; all_gather of the
routing, all_to_all for the pull / combine traffic). Both must give the same bits.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import torch

from ...ref.fp8 import FP8, quant_act_per_token
from ...ref.moe import moe_combine
from .layout import MODES, PAD, CombineMap, EPPartition, RankPlan, combine_maps, plan_all, valid_tokens

BF16 = torch.bfloat16
TILE_ROWS = 4
E8M0_BLOCK = 32
E8M0_BIAS = 127


# ---- batch-invariant expert FFN -----------------------------------------------------------------------------------

def fp8_linear_exact(x8: torch.Tensor, xs: torch.Tensor, w8: torch.Tensor, ws: torch.Tensor) -> torch.Tensor:
    """Block-FP8 GEMM [T, K] x [N, K]^T -> fp32 [T, N] with exact 128-group partials (see the module doc)."""
    t, k = x8.shape
    n = w8.shape[0]
    g = k // 128
    part = torch.einsum("tgk,ngk->gtn", x8.double().view(t, g, 128), w8.double().view(n, g, 128)).float()
    xs_t = xs.float().t()                                         # [G, T]
    ws_r = ws.float().repeat_interleave(128, 0)[:n].t()           # [G, N]
    acc = part[0] * xs_t[0][:, None] * ws_r[0][None, :]
    for i in range(1, g):
        acc = acc + part[i] * xs_t[i][:, None] * ws_r[i][None, :]
    return acc


def _ffn_tile(h8, hs, w13, s13, w2, s2, wt) -> torch.Tensor:
    inter = w2.shape[1]
    gu = fp8_linear_exact(h8, hs, w13, s13).to(BF16)
    g, u = gu[:, :inter].float(), gu[:, inter:].float()
    a = (torch.nn.functional.silu(g) * u).to(BF16)
    a8, a_s = quant_act_per_token(a)
    return (fp8_linear_exact(a8, a_s, w2, s2) * wt[:, None]).to(BF16)


def expert_ffn(h8: torch.Tensor, hs: torch.Tensor, w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor,
               s2: torch.Tensor, weight: torch.Tensor, tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """One expert on T pre-quantized rows -> weighted y [T, H] bf16 = bf16(FC2_acc * weight), computed on
    fixed tiles of tile_rows rows (row results independent of the batch)."""
    t, h = h8.shape
    out = torch.empty(t, w2.shape[0], dtype=BF16, device=h8.device)
    for a in range(0, t, tile_rows):
        b = min(t, a + tile_rows)
        x8, xs, wt = h8[a:b], hs[a:b], weight[a:b].float()
        if b - a < tile_rows:  # zero-pad the last tile to the fixed shape
            pad = tile_rows - (b - a)
            x8 = torch.cat([x8, torch.zeros(pad, h, dtype=FP8, device=h8.device)])
            xs = torch.cat([xs, torch.ones(pad, xs.shape[1], dtype=xs.dtype, device=h8.device)])
            wt = torch.cat([wt, torch.zeros(pad, dtype=torch.float32, device=h8.device)])
        out[a:b] = _ffn_tile(x8, xs, w13, s13, w2, s2, wt)[: b - a]
    return out


def shared_weight(rsf: float, device=None) -> torch.Tensor:
    """fp32(1 / rsf): the shared slot's routing weight (as ref.moe and the kernel's c_float)."""
    return torch.tensor(1.0 / rsf, dtype=torch.float32, device=device)


# ---- the single-GPU reference (what MegaMoE computes on one GPU) -----------------------------------------------

def single_gpu_slots(x8: torch.Tensor, xs: torch.Tensor, ids: torch.Tensor, wts: torch.Tensor, w13: torch.Tensor,
                     s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor, num_shared: int, rsf: float,
                     tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """Slot buffer [M, S, H] bf16 of single-GPU MegaMoE over all E = w13.shape[0] - num_shared routed experts
    (stack [routed..., shared]); padding tokens (first id < 0) get zero slots."""
    m, k = ids.shape
    E = w13.shape[0] - num_shared
    S = k + num_shared
    slots = torch.zeros(m, S, w2.shape[1], dtype=BF16, device=x8.device)
    ok = valid_tokens(ids)
    ids_l = ids.long()
    for e in range(E + num_shared):
        if e < E:
            tok, slot = ((ids_l == e) & ok[:, None]).nonzero(as_tuple=True)
            wt = wts[tok, slot]
        else:
            tok = ok.nonzero().flatten()
            slot = torch.full_like(tok, k)
            wt = shared_weight(rsf, x8.device).expand(tok.numel())
        if tok.numel():
            slots[tok, slot] = expert_ffn(x8[tok], xs[tok], w13[e], s13[e], w2[e], s2[e], wt, tile_rows)
    return slots


def single_gpu_forward(x8, xs, ids, wts, w13, s13, w2, s2, num_shared: int = 1, rsf: float = 2.5,
                       tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """out [M, H] bf16 of single-GPU MegaMoE (the gathered batch of all ranks, global expert ids)."""
    return moe_combine(single_gpu_slots(x8, xs, ids, wts, w13, s13, w2, s2, num_shared, rsf, tile_rows), rsf)


# ---- FP8 (E8M0 per 32) combine ---------------------------------------------------------------------------------

def e8m0_quant(y: torch.Tensor, block: int = E8M0_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., H] bf16 -> (q [..., H] e4m3, scale exponents [..., H/32] uint8 = e + 127), y ~= q * 2^e per block.
    e = smallest integer with 448 * 2^e >= amax (amax = 1.m x 2^E: e = E - 8 + (1.m > 1.75)); amax 0 -> e = -127."""
    *lead, h = y.shape
    yb = y.float().reshape(*lead, h // block, block)
    amax = yb.abs().amax(-1)
    frac, ex = torch.frexp(amax)  # amax = frac * 2^ex, frac in [0.5, 1)
    e = ex - 9 + (frac > 0.875).to(ex.dtype)
    e = torch.where(amax > 0, e, torch.full_like(e, -E8M0_BIAS)).clamp(-E8M0_BIAS, E8M0_BIAS)
    q = (yb * pow2(-e)[..., None]).clamp(-448.0, 448.0).to(FP8)  # exact power-of-two division, one RNE rounding
    return q.reshape(*lead, h), (e + E8M0_BIAS).to(torch.uint8)


def pow2(e: torch.Tensor) -> torch.Tensor:
    """Exact fp32 2^e for integer e in [-149, 127] (built from the bits; subnormal below -126)."""
    e = e.to(torch.int32)
    bits = torch.where(e >= -126, (e + 127) << 23, torch.ones_like(e) << (e + 149).clamp(0, 31))
    return bits.view(torch.float32)


def e8m0_dequant(q: torch.Tensor, scale: torch.Tensor, block: int = E8M0_BLOCK) -> torch.Tensor:
    *lead, h = q.shape
    e = scale.to(torch.int32) - E8M0_BIAS
    return (q.float().reshape(*lead, h // block, block) * pow2(e)[..., None]).reshape(*lead, h)


def topk_reduce_fp8(q: torch.Tensor, scale: torch.Tensor, shared_y: torch.Tensor | None, rsf: float) -> torch.Tensor:
    """The separate top-k reduce of the FP8 combine: q [M, k, H] e4m3 + scale [M, k, H/32] u8 (routed slots),
    shared_y [M, H] bf16 (local shared slot) -> bf16(rsf * (sum_j fp32(dequant_j) + fp32(shared))), slot order."""
    m, k, h = q.shape
    acc = torch.zeros(m, h, dtype=torch.float32, device=q.device)
    deq = e8m0_dequant(q, scale)
    for j in range(k):
        acc = acc + deq[:, j]
    if shared_y is not None:
        acc = acc + shared_y.float()
    return (acc * rsf).to(BF16)


def fp8_combine_error_bound(slots: torch.Tensor, topk: int, rsf: float, block: int = E8M0_BLOCK) -> torch.Tensor:
    """Rigorous elementwise bound [M, H] (float64) on |out_fp8 - out_bf16| for the slot buffer [M, S, H] bf16
    (routed slots 0..topk-1 quantized, the rest bf16). See the module docstring for the derivation."""
    m, S, h = slots.shape
    y = slots.double().abs()
    r = y[:, :topk]
    amax = r.reshape(m, topk, h // block, block).amax(-1).repeat_interleave(block, -1)
    E = (r / 16 + amax / (224.0 * 1024.0)).sum(1)
    mag = rsf * (y.sum(1) + E)
    return rsf * E + 2.0 ** -7 * mag + S * 2.0 ** -22 * mag


# ---- per-rank pieces (shared by the simulated and the distributed execution) --------------------------------

@dataclass
class RankInputs:
    """One rank's MoE inputs: x8 [M, H] e4m3, x_scale [M, H/128] fp32, topk_ids [M, k] global routed ids
    (padding rows: first id -1), topk_weights [M, k] fp32 (normalised, without rsf)."""

    x8: torch.Tensor
    x_scale: torch.Tensor
    topk_ids: torch.Tensor
    topk_weights: torch.Tensor


@dataclass
class RankWeights:
    """A rank's local stack [epr routed..., shared] (rows EPPartition.weight_rows(rank) of the global stack)."""

    w13: torch.Tensor
    w13_scale: torch.Tensor
    w2: torch.Tensor
    w2_scale: torch.Tensor


def shard_weights(w13: torch.Tensor, s13: torch.Tensor, w2: torch.Tensor, s2: torch.Tensor,
                  part: EPPartition) -> list[RankWeights]:
    """Global stack [E routed..., shared] -> per-rank local stacks (the shared expert replicated)."""
    if w13.shape[0] != part.num_experts + part.num_shared:
        raise ValueError(f"shard_weights: stack has {w13.shape[0]} experts, partition needs "
                         f"{part.num_experts} + {part.num_shared}")
    out = []
    for r in range(part.world_size):
        idx = torch.tensor(part.weight_rows(r), device=w13.device)
        out.append(RankWeights(w13.index_select(0, idx), s13.index_select(0, idx), w2.index_select(0, idx),
                               s2.index_select(0, idx)))
    return out


def pair_weights(plan: RankPlan, topk_weights: Sequence[torch.Tensor], rsf: float) -> torch.Tensor:
    """fp32 [P]: routing weight of each of the plan's pairs (read from the source ranks' topk_weights; the
    in-kernel plan kernel copies them into pair_weight), fp32(1/rsf) for the shared pairs."""
    k = plan.topk
    dev = topk_weights[0].device
    w = torch.empty(plan.num_pairs, dtype=torch.float32, device=dev)
    routed = plan.pair_slot < k
    for s in range(plan.partition.world_size):
        sel = routed & (plan.pair_src == s)
        if bool(sel.any()):
            w[sel.to(dev)] = topk_weights[s][plan.pair_token[sel].to(dev), plan.pair_slot[sel].to(dev)].float()
    if bool((~routed).any()):
        w[(~routed).to(dev)] = shared_weight(rsf, dev)
    return w


def rank_compute(plan: RankPlan, x8_rows: torch.Tensor, xs_rows: torch.Tensor, weights: torch.Tensor,
                 w: RankWeights, tile_rows: int = TILE_ROWS) -> torch.Tensor:
    """FC1 + act + FC2 + routing weight of every pair of the plan -> the local output pool y [P, H] bf16 (pair
    order). x8_rows / xs_rows: the rank's token rows [own tokens | pulled pool rows]."""
    dev = x8_rows.device
    y = torch.empty(plan.num_pairs, w.w2.shape[1], dtype=BF16, device=dev)
    for le in range(len(plan.expert_offsets) - 1):
        a, b = plan.expert_offsets[le], plan.expert_offsets[le + 1]
        if a == b:
            continue
        rows = plan.pair_row[a:b].to(dev)
        y[a:b] = expert_ffn(x8_rows[rows], xs_rows[rows], w.w13[le], w.w13_scale[le], w.w2[le], w.w2_scale[le],
                            weights[a:b], tile_rows)
    return y


def _slot_codes(plan: RankPlan, sel: torch.Tensor) -> torch.Tensor:
    return plan.pair_token[sel] * 16 + plan.pair_slot[sel]


@dataclass
class EPOutputs:
    """Per mode ('A', 'B', 'fp8'): out [M_r, H] bf16 for every rank r (simulated) or this rank (dist)."""

    out: dict[str, list[torch.Tensor]]
    plans: list[RankPlan] = field(default_factory=list)
    pools: list[torch.Tensor] = field(default_factory=list)   # per rank: y [P, H] bf16 (mode B output pool)
    slots: list[torch.Tensor] = field(default_factory=list)   # per rank: mode A slot buffer [M, S, H] bf16


# ---- execution 1: N simulated ranks in one process ---------------------------------------------------------------

def ep_forward_simulated(inputs: Sequence[RankInputs], weights: Sequence[RankWeights], part: EPPartition,
                         rsf: float = 2.5, modes: Sequence[str] = MODES, tile_rows: int = TILE_ROWS) -> EPOutputs:
    """The EP MegaMoE of N ranks, explicit per rank: plan (from every rank's topk_ids) -> dispatch (pull the
    plan's remote rows into the rank's token pool) -> compute (local experts + the shared expert on own tokens)
    -> combine per mode. Returns out per mode per rank."""
    N = part.world_size
    if len(inputs) != N or len(weights) != N:
        raise ValueError(f"ep_forward_simulated: need {N} ranks of inputs and weights, got {len(inputs)}, {len(weights)}")
    plans = plan_all([i.topk_ids for i in inputs], part)
    k, S = plans[0].topk, plans[0].num_slots
    H = weights[0].w2.shape[1]
    dev = inputs[0].x8.device
    pools = []
    for d, p in enumerate(plans):
        src, tok = p.pool_src.tolist(), p.pool_token.tolist()
        pulled8 = [inputs[s].x8[t] for s, t in zip(src, tok)]
        pulleds = [inputs[s].x_scale[t] for s, t in zip(src, tok)]
        x8_rows = torch.cat([inputs[d].x8] + ([torch.stack(pulled8)] if pulled8 else []))
        xs_rows = torch.cat([inputs[d].x_scale] + ([torch.stack(pulleds)] if pulleds else []))
        pools.append(rank_compute(p, x8_rows, xs_rows, pair_weights(p, [i.topk_weights for i in inputs], rsf),
                                  weights[d], tile_rows))
    M = [int(i.x8.shape[0]) for i in inputs]
    out: dict[str, list[torch.Tensor]] = {}
    slots_a: list[torch.Tensor] = []
    if "A" in modes:  # sender addressing: rank d writes slot (t, j) of the source's slot buffer
        slots_a = [torch.zeros(M[s], S, H, dtype=BF16, device=dev) for s in range(N)]
        for d, p in enumerate(plans):
            for s in range(N):
                sel = p.pair_src == s
                if bool(sel.any()):
                    slots_a[s][p.pair_token[sel].to(dev), p.pair_slot[sel].to(dev)] = pools[d][sel.to(dev)]
        out["A"] = [moe_combine(sl, rsf) for sl in slots_a]
    if "B" in modes:  # receiver addressing: the source reads every (t, j) from its owner's output pool
        maps = combine_maps(plans)
        out["B"] = [moe_combine(_gather_slots(maps[s], pools, H, dev), rsf) for s in range(N)]
    if "fp8" in modes:
        qs = [torch.zeros(M[s], k, H, dtype=FP8, device=dev) for s in range(N)]
        es = [torch.zeros(M[s], k, H // E8M0_BLOCK, dtype=torch.uint8, device=dev) for s in range(N)]
        sh = [torch.zeros(M[s], H, dtype=BF16, device=dev) for s in range(N)]
        for d, p in enumerate(plans):
            routed = p.pair_slot < k
            q, e = e8m0_quant(pools[d][routed.to(dev)])
            for s in range(N):
                sel = (p.pair_src[routed] == s)
                if bool(sel.any()):
                    t, j = p.pair_token[routed][sel].to(dev), p.pair_slot[routed][sel].to(dev)
                    qs[s][t, j] = q[sel.to(dev)]
                    es[s][t, j] = e[sel.to(dev)]
            if part.num_shared:
                shp = ~routed
                sh[d][p.pair_token[shp].to(dev)] = pools[d][shp.to(dev)]
        out["fp8"] = [topk_reduce_fp8(qs[s], es[s], sh[s] if part.num_shared else None, rsf) for s in range(N)]
    return EPOutputs(out, plans, pools, slots_a)


def _gather_slots(cmap: CombineMap, pools: Sequence[torch.Tensor], H: int, dev) -> torch.Tensor:
    m, S = cmap.dst_rank.shape
    slots = torch.zeros(m, S, H, dtype=BF16, device=dev)
    for j in range(S):  # slot order, as the combine warps read them
        for r in range(len(pools)):
            sel = cmap.dst_rank[:, j] == r
            if bool(sel.any()):
                slots[sel.to(dev), j] = pools[r][cmap.dst_pair[sel, j].to(dev)]
    return slots


# ---- execution 2: one rank per process over torch.distributed ---------------------------------------------------

def _row_bytes(t: torch.Tensor) -> int:
    n = t.element_size()
    for s in t.shape[1:]:
        n *= int(s)
    return n


def _as_bytes(t: torch.Tensor) -> torch.Tensor:
    """[R, ...] -> [R, row_bytes] uint8 view (gloo moves uint8 for every collective we need)."""
    t = t.contiguous()
    rb = _row_bytes(t)
    if t.numel() == 0:
        return torch.zeros(t.shape[0], rb, dtype=torch.uint8, device=t.device)
    return t.view(torch.uint8).reshape(t.shape[0], rb)


def _from_bytes(b: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    trail = tuple(like.shape[1:])
    if b.shape[0] == 0:
        return torch.zeros((0, *trail), dtype=like.dtype, device=b.device)
    return b.contiguous().view(like.dtype).reshape(b.shape[0], *trail)


def all_gather_rows(t: torch.Tensor, counts: Sequence[int], group=None) -> list[torch.Tensor]:
    """Every rank's [M_r, ...] tensor (rows padded to max M for the collective, trimmed after)."""
    import torch.distributed as dist
    n = len(counts)
    mx = max(max(counts), 1)
    b = _as_bytes(t)
    rb = b.shape[1]
    pad = torch.zeros(mx, rb, dtype=torch.uint8, device=t.device)
    if b.shape[0]:
        pad[: b.shape[0]] = b
    outb = torch.empty(n * mx, rb, dtype=torch.uint8, device=t.device)
    ag = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    ag(outb.view(-1), pad.view(-1), group=group)
    return [_from_bytes(outb[r * mx: r * mx + counts[r]], t) for r in range(n)]


def all_to_all_rows(send: Sequence[torch.Tensor], recv_counts: Sequence[int], group=None) -> list[torch.Tensor]:
    """send[r]: rows [n_r, ...] for rank r (same trailing shape / dtype) -> rows received from each rank."""
    import torch.distributed as dist
    like = send[0]
    rb = _row_bytes(like)
    sb = torch.cat([_as_bytes(s) for s in send])
    out = torch.empty(sum(recv_counts), rb, dtype=torch.uint8, device=like.device)
    dist.all_to_all_single(out.view(-1), sb.reshape(-1), [c * rb for c in recv_counts],
                           [int(s.shape[0]) * rb for s in send], group=group)
    res, o = [], 0
    for c in recv_counts:
        res.append(_from_bytes(out[o:o + c], like))
        o += c
    return res


def ep_forward_dist(inp: RankInputs, weights: RankWeights, part: EPPartition, rsf: float = 2.5,
                    modes: Sequence[str] = MODES, group=None, tile_rows: int = TILE_ROWS) -> EPOutputs:
    """This process's rank of the EP MegaMoE over torch.distributed (the same plan as ep_forward_simulated,
    moved by collectives): all_gather M and the routing (the plan kernel's remote topk_ids / topk_weights
    reads), all_to_all of the pulled token rows (dispatch), local compute, then per mode:
      A    all_to_all of (y rows, their (t, j) codes) to the source, scattered by the received codes;
      B    all_to_all of pair-index requests from the source, all_to_all of the requested pool rows back
           (the source's reads of the owners' output pools, addressed by its CombineMap);
      fp8  all_to_all of (E8M0-quantized rows, scales, codes), then the local top-k reduce.
    Returns EPOutputs whose out[mode] is [this rank's out]."""
    import torch.distributed as dist
    N = dist.get_world_size(group)
    me = dist.get_rank(group)
    if N != part.world_size:
        raise ValueError(f"ep_forward_dist: group has {N} ranks, partition {part.world_size}")
    dev = inp.x8.device
    cnt = torch.tensor([int(inp.x8.shape[0])], dtype=torch.int64, device=dev)
    M = [int(x.view(-1)[0]) for x in all_gather_rows(cnt.view(1, 1), [1] * N, group)]
    ids_all = [x.cpu() for x in all_gather_rows(inp.topk_ids.to(torch.int32), M, group)]
    wts_all = all_gather_rows(inp.topk_weights.float(), M, group)
    plans = plan_all(ids_all, part)
    p = plans[me]
    k, S = p.topk, p.num_slots
    H = weights.w2.shape[1]
    # dispatch: rank r pulls my tokens plans[r].pool_token[pool_src == me] (ascending), in its pool order
    want = [plans[r].pool_token[plans[r].pool_src == me].to(dev) for r in range(N)]
    recv_n = [int((p.pool_src == s).sum()) for s in range(N)]
    got8 = all_to_all_rows([inp.x8[w] for w in want], recv_n, group)
    gots = all_to_all_rows([inp.x_scale[w] for w in want], recv_n, group)
    x8_rows = torch.cat([inp.x8] + got8)
    xs_rows = torch.cat([inp.x_scale] + gots)
    y = rank_compute(p, x8_rows, xs_rows, pair_weights(p, wts_all, rsf), weights, tile_rows)
    m = M[me]
    out: dict[str, list[torch.Tensor]] = {}
    slots_a: list[torch.Tensor] = []
    if "A" in modes:
        sel = [(p.pair_src == s) for s in range(N)]
        rows = all_to_all_rows([y[s_.to(dev)] for s_ in sel], _incoming(plans, me), group)
        codes = all_to_all_rows([_slot_codes(p, s_).to(torch.int32).view(-1, 1).to(dev) for s_ in sel],
                                _incoming(plans, me), group)
        slots = torch.zeros(m, S, H, dtype=BF16, device=dev)
        for r_rows, r_codes in zip(rows, codes):  # sender addressing: the received codes say where
            c = r_codes.view(-1).long()
            slots[c >> 4, c & 15] = r_rows
        out["A"] = [moe_combine(slots, rsf)]
        slots_a = [slots]
    if "B" in modes:
        maps = combine_maps(plans)
        cmap = maps[me]
        req = [cmap.dst_pair[cmap.dst_rank == r] for r in range(N)]  # (t, j) row-major order per owner
        asked = all_to_all_rows([q.to(torch.int32).view(-1, 1).to(dev) for q in req],
                                [int((maps[r].dst_rank == me).sum()) for r in range(N)], group)
        served = all_to_all_rows([y[a.view(-1).long()] for a in asked], [int(q.numel()) for q in req], group)
        slots = torch.zeros(m, S, H, dtype=BF16, device=dev)
        for r in range(N):
            hit = (cmap.dst_rank == r).to(dev)
            slots[hit] = served[r]
        out["B"] = [moe_combine(slots, rsf)]
    if "fp8" in modes:
        routed = p.pair_slot < k
        q, e = e8m0_quant(y[routed.to(dev)])
        sel = [(p.pair_src[routed] == s) for s in range(N)]
        inc = _incoming(plans, me, routed_only=True)
        rq = all_to_all_rows([q[s_.to(dev)] for s_ in sel], inc, group)
        re_ = all_to_all_rows([e[s_.to(dev)] for s_ in sel], inc, group)
        codes_r = p.pair_token[routed] * 16 + p.pair_slot[routed]
        rc = all_to_all_rows([codes_r[s_].to(torch.int32).view(-1, 1).to(dev) for s_ in sel], inc, group)
        qs = torch.zeros(m, k, H, dtype=FP8, device=dev)
        es = torch.zeros(m, k, H // E8M0_BLOCK, dtype=torch.uint8, device=dev)
        for a_q, a_e, a_c in zip(rq, re_, rc):
            c = a_c.view(-1).long()
            qs[c >> 4, c & 15] = a_q
            es[c >> 4, c & 15] = a_e
        sh = None
        if part.num_shared:
            sh = torch.zeros(m, H, dtype=BF16, device=dev)
            shp = ~routed
            sh[p.pair_token[shp].to(dev)] = y[shp.to(dev)]
        out["fp8"] = [topk_reduce_fp8(qs, es, sh, rsf)]
    return EPOutputs(out, plans, [y], slots_a)


def _incoming(plans: Sequence[RankPlan], me: int, routed_only: bool = False) -> list[int]:
    """Rows rank `me` receives from each rank in the combine: its pairs computed there."""
    res = []
    for p in plans:
        sel = p.pair_src == me
        if routed_only:
            sel = sel & (p.pair_slot < p.topk)
        res.append(int(sel.sum()))
    return res


__all__ = ["EPOutputs", "RankInputs", "RankWeights", "e8m0_dequant", "e8m0_quant", "ep_forward_dist",
           "ep_forward_simulated", "expert_ffn", "fp8_combine_error_bound", "fp8_linear_exact", "shard_weights",
           "single_gpu_forward", "single_gpu_slots", "topk_reduce_fp8", "PAD"]
