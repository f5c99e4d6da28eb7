"""Reference of the attention core that follows the prefix (not replaced by glm5_fastpath, but needed
to run a whole decode layer): sparse MLA over the top-k slots, W_UV, o_proj (spec section 3, row 16+).
"""
from __future__ import annotations

import torch

from ..config import Glm5Config
from ..weights import AttnWeights
from .fp8 import block_fp8_linear, quant_act_per_token

BF16 = torch.bfloat16


def sparse_mla_decode(q_lat: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, topk_slots: torch.Tensor,
                      cfg: Glm5Config) -> torch.Tensor:
    """o_lat[m,h] = softmax_j((q_lat.c_kv_j + q_pe.k_pe_j) * scale) . c_kv_j over the valid slots j -> [M,H,kv_lora] bf16."""
    m, nh, r = q_lat.shape
    if topk_slots.shape[0] != m:
        raise ValueError(f"sparse_mla_decode: topk_slots has {topk_slots.shape[0]} rows for M={m}")
    valid = topk_slots >= 0
    if not valid.any(dim=1).all():
        raise ValueError("sparse_mla_decode: a row of topk_slots has no valid slot")
    kv = kv_cache[topk_slots.clamp_min(0).long()].float()  # [M, K, r + rope]
    c_kv, k_pe = kv[..., :r], kv[..., r:]
    s = (torch.einsum("mhr,mkr->mhk", q_lat.float(), c_kv) + torch.einsum("mhp,mkp->mhk", q_pe.float(), k_pe))
    s = (s * cfg.softmax_scale).masked_fill(~valid[:, None, :], float("-inf"))
    p = torch.softmax(s, dim=-1)
    return torch.einsum("mhk,mkr->mhr", p, c_kv).to(BF16)


def attention_core(q_lat: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, topk_slots: torch.Tensor,
                   w: AttnWeights, cfg: Glm5Config) -> torch.Tensor:
    """Sparse MLA -> W_UV (bf16 bmm) -> o_proj (block-FP8 GEMM) -> [M, hidden] bf16."""
    o_lat = sparse_mla_decode(q_lat, q_pe, kv_cache, topk_slots, cfg)
    o = torch.einsum("mhr,hrv->mhv", o_lat.float(), w.w_vc.float()).to(BF16)  # [M, H, v]
    o8, os_ = quant_act_per_token(o.reshape(o.shape[0], -1))
    return block_fp8_linear(o8, os_, w.o_proj.weight, w.o_proj.scale_inv).to(BF16)


def sparse_mla_flat(q: torch.Tensor, kv: torch.Tensor, indices: torch.Tensor, sm_scale: float, d_v: int = 512,
                    *, return_lse: bool = False):
    """Sparse MLA over flat slot ids, as SGLang's DSA backend calls FlashMLA's sparse kernel (one KV head):

        o[t, h] = sum_j softmax_j(sm_scale * q[t, h] . kv[idx[t, j]]) * kv[idx[t, j], :d_v]

    over the valid j (idx >= 0); a row without a valid index gives zeros (and lse = -inf).
    q [T, H, D] bf16, kv [S, 1, D] or [S, D] (the first d_v columns are also V), indices [T, K] int (-1 =
    unused, valid entries anywhere in the row). fp32 math. -> o [T, H, d_v] bf16, or (o, lse [T, H] fp32,
    natural log of the sum of exp(sm_scale * score)) with return_lse=True."""
    if q.dim() != 3 or indices.dim() != 2 or indices.shape[0] != q.shape[0]:
        raise ValueError(f"sparse_mla_flat: q {tuple(q.shape)} must be [T, H, D] and indices {tuple(indices.shape)} [T, K]")
    t, h, d = q.shape
    kv2 = kv.reshape(kv.shape[0], -1)
    if kv2.shape[1] != d or not 0 < d_v <= d:
        raise ValueError(f"sparse_mla_flat: kv rows of {kv2.shape[1]} columns for q of D={d}, d_v={d_v}")
    o = torch.zeros(t, h, d_v, dtype=torch.float32, device=q.device)
    lse = torch.full((t, h), float("-inf"), dtype=torch.float32, device=q.device)
    k = indices.shape[1]
    step = max(1, (1 << 24) // max(1, k * d))  # tokens per chunk: bounds the gathered [chunk, K, D] fp32 rows
    for t0 in range(0, t, step):
        idx = indices[t0:t0 + step]
        valid = idx >= 0
        rows = kv2[idx.clamp_min(0).long()].float()  # [c, K, D]
        s = torch.einsum("chd,ckd->chk", q[t0:t0 + step].float(), rows) * sm_scale
        s = s.masked_fill(~valid[:, None, :], float("-inf"))
        m = s.amax(dim=-1, keepdim=True)
        m = torch.where(torch.isneginf(m), torch.zeros_like(m), m)  # empty row: p = 0, not exp(-inf + inf)
        p = torch.exp(s - m)
        l = p.sum(dim=-1)
        pv = torch.einsum("chk,ckd->chd", p, rows[..., :d_v])
        o[t0:t0 + step] = torch.where(l[..., None] > 0, pv / l[..., None].clamp_min(1e-30), torch.zeros_like(pv))
        lse[t0:t0 + step] = torch.where(l > 0, torch.log(l) + m[..., 0], lse[t0:t0 + step])
    o = o.to(BF16)
    return (o, lse) if return_lse else o
