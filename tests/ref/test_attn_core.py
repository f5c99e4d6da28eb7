"""Reference attention core (sparse MLA + W_UV + o_proj) vs an explicit per-(token, head) float64 loop."""
import pytest
import torch

from glm5_fastpath.config import Glm5Config
from glm5_fastpath.ref.attn_core import attention_core, sparse_mla_decode
from glm5_fastpath.testing.numerics import assert_close
from glm5_fastpath.weights import random_layer


@pytest.mark.parametrize("preset,m,k", [("small", 1, 5), ("small", 3, 64), ("small", 16, 17), ("glm5", 2, 40)])
def test_sparse_mla_decode_vs_loop(seed, preset, m, k):
    cfg = Glm5Config.preset(preset)
    nh, r, p = cfg.num_attention_heads, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    slots = 4 * k + 7
    kv = torch.randn(slots, r + p).to(torch.bfloat16)
    q_lat, q_pe = torch.randn(m, nh, r).to(torch.bfloat16), torch.randn(m, nh, p).to(torch.bfloat16)
    topk = torch.stack([torch.randperm(slots)[:k] for _ in range(m)]).int()
    topk[0, k // 2:] = -1  # padded row
    out = sparse_mla_decode(q_lat, q_pe, kv, topk, cfg)
    ref = torch.empty(m, nh, r, dtype=torch.float64)
    for i in range(m):
        sel = [s for s in topk[i].tolist() if s >= 0]
        e = kv[sel].double()
        for h in range(nh):
            sc = (e[:, :r] @ q_lat[i, h].double() + e[:, r:] @ q_pe[i, h].double()) / (cfg.qk_head_dim ** 0.5)
            pr = torch.exp(sc - sc.max())
            ref[i, h] = (pr / pr.sum()) @ e[:, :r]
    assert_close("sparse_mla_decode", out, ref, kind="bf16", context=f"{preset=} {m=} {k=}")


def test_attention_core_vs_float64(seed):
    cfg = Glm5Config.preset("small")
    w = random_layer(cfg, 1, seed=seed).attn
    m, k, slots = 3, 9, 50
    kv = torch.randn(slots, cfg.kv_cache_dim).to(torch.bfloat16)
    q_lat = torch.randn(m, cfg.num_attention_heads, cfg.kv_lora_rank).to(torch.bfloat16)
    q_pe = torch.randn(m, cfg.num_attention_heads, cfg.qk_rope_head_dim).to(torch.bfloat16)
    topk = torch.stack([torch.randperm(slots)[:k] for _ in range(m)]).int()
    out = attention_core(q_lat, q_pe, kv, topk, w, cfg)
    o_lat = sparse_mla_decode(q_lat, q_pe, kv, topk, cfg).double()
    o = torch.einsum("mhr,hrv->mhv", o_lat, w.w_vc.double()).reshape(m, -1)
    ref = o @ w.o_proj.dequant().double().t()
    assert_close("attention_core", out, ref, kind="fp8_vs_exact")


def test_row_without_valid_slot_is_an_error():
    cfg = Glm5Config.preset("small")
    with pytest.raises(ValueError, match="no valid slot"):
        sparse_mla_decode(torch.zeros(1, 4, 128), torch.zeros(1, 4, 32), torch.zeros(4, 160), torch.full((1, 2), -1), cfg)
