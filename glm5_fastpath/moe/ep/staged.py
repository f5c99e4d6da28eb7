"""The staged EP baseline of issue #8 (and of the MegaMoE talk's comparison, shared/design notes section 17):

    all-gather dispatch  ->  grouped FP8 GEMM per local expert (FC1, SwiGLU + 1x128 requant, FC2)  ->
    reduce-scatter combine

written against torch.distributed collectives (gloo on CPU, NCCL on GPU) and a pluggable grouped GEMM:

    grouped_gemm(a8 [Mp, K] e4m3, a_scale [Mp, K/128] fp32, w [G, N, K] e4m3, w_scale [G, N/128, K/128] fp32,
                 m_indices [Mp] int32) -> out [Mp, N] bf16,
    out[r] = bf16(block_fp8(a8[r], w[m_indices[r]])) for m_indices[r] >= 0; rows with -1 are padding (skipped).
    Rows are in DeepGEMM's "contiguous" layout: each group's rows form one segment whose length is padded to
    `align` (DeepGEMM: deep_gemm.get_mk_alignment_for_contiguous_layout(), 128 on SM90 in sgl-deep-gemm).

CPU: reference_grouped_gemm (ref.fp8.block_fp8_linear per segment, the reference einsum). GPU (the bench):
DeepGemmGroupedGemm, i.e. sgl-deep-gemm's

    deep_gemm.m_grouped_fp8_gemm_nt_contiguous((a8, a_scale), (w, w_scale), out, m_indices)

(C++ signature: m_grouped_fp8_fp4_gemm_nt_contiguous(a, b, d, grouped_layout, recipe=None, recipe_a=None,
recipe_b=None, compiled_dims="nk", disable_ue8m0_cast=False, use_psum_layout=False,
expected_m_for_psum_layout=None); on SM90 with fp32 scales it runs sm90_m_grouped_fp8_gemm_contiguous_1d2d and
transforms a_scale into the MN-major TMA-aligned layout itself, which costs one extra small kernel per call:
SGLang's quant kernel writes that layout directly; get_mn_major_tma_aligned_tensor does it ahead of time).

Numerics (why staged == reference only within fp8_same_quant, not bitwise): the routing weight multiplies
FC2's bf16 output (bf16(bf16(acc) * w), as SGLang's non-fused paths) instead of the fp32 accumulator; each
rank sums its local experts' contributions first (partial in `combine_dtype`, bf16 by default = the bytes
NCCL moves), and the reduce-scatter sums the ranks' partials in the collective's order; the shared expert
(replicated, own tokens, as the EP kernel) is added after: out = bf16(rsf * (fp32(rs) + fp32(y_shared))).
"""
from __future__ import annotations

from typing import Callable

import torch

from ...ref.fp8 import FP8, block_fp8_linear, quant_act_per_token
from .layout import EPPartition, valid_tokens
from .reference import BF16, RankInputs, RankWeights, all_gather_rows, shared_weight

GroupedGemm = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]
DEFAULT_ALIGN = 128


def reference_grouped_gemm(a8: torch.Tensor, a_scale: torch.Tensor, w: torch.Tensor, w_scale: torch.Tensor,
                           m_indices: torch.Tensor) -> torch.Tensor:
    """The grouped-GEMM contract in PyTorch (any device): one block_fp8_linear per group's rows."""
    out = torch.zeros(a8.shape[0], w.shape[1], dtype=BF16, device=a8.device)
    mi = m_indices.long()
    for g in torch.unique(mi[mi >= 0]).tolist():
        rows = (mi == g).nonzero().flatten()
        out[rows] = block_fp8_linear(a8[rows], a_scale[rows], w[g], w_scale[g]).to(BF16)
    return out


class DeepGemmGroupedGemm:
    """sgl-deep-gemm's grouped FP8 GEMM (SM90). Import errors surface at construction."""

    def __init__(self) -> None:
        import deep_gemm
        self.dg = deep_gemm
        self.align = int(deep_gemm.get_mk_alignment_for_contiguous_layout())

    def __call__(self, a8, a_scale, w, w_scale, m_indices) -> torch.Tensor:
        out = torch.empty(a8.shape[0], w.shape[1], dtype=BF16, device=a8.device)
        if a8.shape[0]:
            self.dg.m_grouped_fp8_gemm_nt_contiguous((a8, a_scale), (w, w_scale), out, m_indices)
        return out


def contiguous_layout(ids_g: torch.Tensor, part: EPPartition, rank: int, align: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Rank's pairs of the gathered routing ids_g [R, k] (row = src * Mmax + t, padding rows -1), in DeepGEMM's
    contiguous layout: (pair_row [P] gathered token row, pair_slot [P], pair_pos [P] row in the padded GEMM
    input, m_indices [Mp] int32 (-1 = padding), counts per local expert). Order: local expert, then row."""
    ids = ids_g.long().cpu()
    R, k = ids.shape
    ok = valid_tokens(ids) if R else torch.zeros(0, dtype=torch.bool)
    epr = part.experts_per_rank
    row = torch.arange(R).repeat_interleave(k)
    slot = torch.arange(k).repeat(R)
    e = ids.reshape(-1)
    keep = ok.repeat_interleave(k) & (e // epr == rank) & (e >= 0)
    row, slot, loc = row[keep], slot[keep], e[keep] - rank * epr
    order = torch.sort(loc * max(R, 1) + row).indices
    row, slot, loc = row[order], slot[order], loc[order]
    counts = torch.bincount(loc, minlength=epr) if loc.numel() else torch.zeros(epr, dtype=torch.int64)
    seg = (counts + align - 1) // align * align
    seg_start = torch.cumsum(seg, 0) - seg
    first = torch.cumsum(counts, 0) - counts
    pos = seg_start[loc] + (torch.arange(loc.numel()) - first[loc])
    m_indices = torch.full((int(seg.sum()),), -1, dtype=torch.int32)
    m_indices[pos] = loc.to(torch.int32)
    return row, slot, pos, m_indices, counts


def _ffn_grouped(a8: torch.Tensor, a_s: torch.Tensor, w: RankWeights, lo: int, hi: int, m_idx: torch.Tensor,
                 gg: GroupedGemm) -> torch.Tensor:
    """FC1 -> SwiGLU -> 1x128 requant -> FC2 with the grouped GEMM over local experts [lo, hi) -> bf16 [Mp, H]."""
    inter = w.w2.shape[2]
    gu = gg(a8, a_s, w.w13[lo:hi], w.w13_scale[lo:hi], m_idx)
    g, u = gu[:, :inter].float(), gu[:, inter:].float()
    act = (torch.nn.functional.silu(g) * u).to(BF16)
    act8, act_s = quant_act_per_token(act)
    return gg(act8, act_s, w.w2[lo:hi], w.w2_scale[lo:hi], m_idx)


def staged_forward_dist(inp: RankInputs, weights: RankWeights, part: EPPartition, rsf: float = 2.5, *,
                        grouped_gemm: GroupedGemm = reference_grouped_gemm, align: int = DEFAULT_ALIGN,
                        combine_dtype: torch.dtype = BF16, group=None) -> torch.Tensor:
    """This process's rank of the staged baseline -> out [M, H] bf16 for its own tokens."""
    import torch.distributed as dist
    N = dist.get_world_size(group)
    me = dist.get_rank(group)
    dev = inp.x8.device
    epr = part.experts_per_rank
    H = weights.w2.shape[1]
    m = int(inp.x8.shape[0])
    cnt = torch.tensor([[m]], dtype=torch.int64, device=dev)
    M = [int(x.view(-1)[0]) for x in all_gather_rows(cnt, [1] * N, group)]
    mx = max(max(M), 1)
    # 1. all-gather dispatch (each input padded to mx rows: one fixed-size collective per tensor)
    ids_pad = torch.full((mx, inp.topk_ids.shape[1]), -1, dtype=torch.int32, device=dev)
    ids_pad[:m] = inp.topk_ids.to(torch.int32)
    x8_g = torch.cat(_pad_gather(inp.x8, mx, N, group))
    xs_g = torch.cat(_pad_gather(inp.x_scale, mx, N, group))
    ids_g = torch.cat(all_gather_rows(ids_pad, [mx] * N, group))
    wts_g = torch.cat(_pad_gather(inp.topk_weights.float(), mx, N, group))
    # 2. grouped FP8 GEMMs over the local routed experts (contiguous layout)
    row, slot, pos, m_idx, _ = contiguous_layout(ids_g, part, me, align)
    mp_rows = int(m_idx.numel())
    a8 = torch.zeros(mp_rows, H, dtype=FP8, device=dev)
    a_s = torch.ones(mp_rows, H // 128, dtype=torch.float32, device=dev)
    row_d, pos_d = row.to(dev), pos.to(dev)
    a8[pos_d] = x8_g[row_d]
    a_s[pos_d] = xs_g[row_d]
    y0 = _ffn_grouped(a8, a_s, weights, 0, epr, m_idx.to(dev), grouped_gemm)
    y = (y0[pos_d].float() * wts_g[row_d, slot.to(dev)][:, None]).to(BF16)  # weight on the bf16 GEMM output
    partial = torch.zeros(N * mx, H, dtype=torch.float32, device=dev)
    partial.index_add_(0, row_d, y.float())
    # 3. reduce-scatter combine (sum of the ranks' partials for my rows)
    rs = torch.empty(mx, H, dtype=combine_dtype, device=dev)
    red = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    red(rs, partial.to(combine_dtype), group=group)
    acc = rs[:m].float()
    # shared expert: replicated, own tokens only
    if part.num_shared and m:
        own = valid_tokens(inp.topk_ids).nonzero().flatten().to(dev)
        if own.numel():
            mi = torch.zeros(own.numel(), dtype=torch.int32, device=dev)
            ysh = _ffn_grouped(inp.x8[own], inp.x_scale[own], weights, epr, epr + 1, mi, grouped_gemm)
            ysh = (ysh.float() * shared_weight(rsf, dev)).to(BF16)
            acc[own] = acc[own] + ysh.float()
    return (acc * rsf).to(BF16)


def _pad_gather(t: torch.Tensor, mx: int, n: int, group) -> list[torch.Tensor]:
    pad = torch.zeros((mx, *t.shape[1:]), dtype=t.dtype, device=t.device)
    if t.shape[0]:
        pad[: t.shape[0]] = t
    return all_gather_rows(pad, [mx] * n, group)


__all__ = ["DEFAULT_ALIGN", "DeepGemmGroupedGemm", "GroupedGemm", "contiguous_layout", "reference_grouped_gemm",
           "staged_forward_dist"]
