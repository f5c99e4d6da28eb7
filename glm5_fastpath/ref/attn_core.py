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
