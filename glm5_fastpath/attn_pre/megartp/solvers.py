"""One reference solver per opcode: computes exactly one instruction's tile from its payload, with the
reference math of glm5_fastpath/ref/prefix.py restricted to the tile's region.

`o(name)` returns the operand bound at the op's OperandPtrTable row under the family's slot name;
`p` is the named payload. Split-K families have two parts: `partial` (returns the fp32 partial of
rows [m0,m1) x weight rows [n0,n1) over K [k0,k1)) and `epilogue` (gets the reduced fp32 sum of rows
[m0,m1) x weight rows [g0,g1) and writes the final outputs) -- the interpreter owns the workspace
and the reduce counter, as the device runtime will.
"""
from __future__ import annotations

from typing import Callable

import torch

from ...config import FP8_BLOCK, Glm5Config
from ...ref import prefix as P
from ...ref.rope import apply_rope_interleaved, rope_cos_sin
from ...weights import AttnWeights, Fp8Linear, IndexerWeights

BF16 = torch.bfloat16
Operand = Callable[[str], torch.Tensor]  # also o.has(name): is the slot bound


def fp8_cols(x8, xs, w8, ws, n0: int, n1: int, k0: int, k1: int) -> torch.Tensor:
    """fp32 y[:, n0:n1] of fp8.block_fp8_linear over K [k0, k1) only (k0, k1 on 128-groups), same per-group math."""
    m, g0, g1 = x8.shape[0], k0 // FP8_BLOCK, -(-k1 // FP8_BLOCK)
    xg = x8[:, k0:k1].float().view(m, g1 - g0, FP8_BLOCK)
    wg = w8[n0:n1, k0:k1].float().view(n1 - n0, g1 - g0, FP8_BLOCK)
    partial = torch.einsum("mgk,ngk->gmn", xg, wg)
    ws_rows = ws.float().repeat_interleave(FP8_BLOCK, 0)[n0:n1, g0:g1]
    return (partial * xs[:, g0:g1].float().t()[:, :, None] * ws_rows.t()[:, None, :]).sum(0)


def _lin(o: Operand, prefix: str) -> Fp8Linear:
    return Fp8Linear(o(f"{prefix}.weight"), o(f"{prefix}.scale_inv"))


# ---- final-value families ---------------------------------------------------------------------------------

def a0(p, o: Operand, cfg: Glm5Config) -> None:
    r = slice(p["m0"], p["m1"])
    x, res, x8, xs = P.a0_add_rmsnorm_quant(o("hidden")[r], o("residual")[r], o("w.input_norm"), cfg.rms_norm_eps)
    o("x_bf16")[r], o("residual_out")[r], o("x_fp8")[r], o("x_scale")[r] = x, res, x8, xs


def d0(p, o: Operand, cfg: Glm5Config) -> None:
    r, h, qkh, nope = slice(p["m0"], p["m1"]), p["head"], cfg.qk_head_dim, cfg.qk_nope_head_dim
    c0, c1 = p["n0"] - h * qkh, p["n1"] - h * qkh  # columns within the head
    q = fp8_cols(o("q_lora_fp8")[r], o("q_lora_scale")[r], o("w.q_b.weight"), o("w.q_b.scale_inv"),
                 p["n0"], p["n1"], 0, cfg.q_lora_rank).to(BF16)
    if c0 < nope:
        o("q_nope")[r, h, c0:min(c1, nope)] = q[:, :min(c1, nope) - c0]
    if c1 > nope:
        if c0 > nope or c1 != qkh:
            raise ValueError(f"D0 tile head {h} columns [{c0},{c1}) splits the rope dims [{nope},{qkh})")
        cos, sin = rope_cos_sin(o("positions")[r], cfg.qk_rope_head_dim, cfg.rope_theta)
        o("q_pe")[r, h] = apply_rope_interleaved(q[:, nope - c0:], cos, sin).to(BF16)


def d2(p, o: Operand, cfg: Glm5Config) -> None:
    r, h, n0, n1 = slice(p["m0"], p["m1"]), p["head"], p["n0"], p["n1"]
    o("q_lat")[r, h, n0:n1] = torch.einsum("mn,nl->ml", o("q_nope")[r, h].float(),
                                           o("w.w_kc")[h, :, n0:n1].float()).to(BF16)
    if h == 0:  # head-0 tiles store the MLA KV row: c_kv columns, the last tile also the roped k_pe
        loc, kv = o("out_cache_loc")[r].long(), o("kv_cache_written")
        kv[loc, n0:n1] = o("c_kv")[r, n0:n1]
        if n1 == cfg.kv_lora_rank:
            cos, sin = rope_cos_sin(o("positions")[r], cfg.qk_rope_head_dim, cfg.rope_theta)
            kv[loc, n1:] = apply_rope_interleaved(o("k_pe")[r], cos, sin).to(BF16)


def e1(p, o: Operand, cfg: Glm5Config) -> None:
    """Logits of tokens [q0,q1) x logical KV [kv0,kv1): the reference on a KV window starting at page kv0/64."""
    r, k0, k1 = slice(p["q0"], p["q1"]), p["kv0"], p["kv1"]
    page = P.PAGE
    if k0 % page:
        raise ValueError(f"E1 KV split start {k0} is not on a {page}-token page")
    lens = (o("seq_lens")[r].long() - k0).clamp(0, k1 - k0).to(o("seq_lens").dtype)
    table = o("block_table")[r, k0 // page:]
    o("logits")[r, k0:k1] = P.e1_indexer_logits(o("index_q_fp8")[r], o("head_w")[r], o("index_k_cache_written"),
                                                lens, table, cfg, max_ctx=k1 - k0)


def e2(p, o: Operand, cfg: Glm5Config) -> None:
    r = slice(p["m0"], p["m1"])
    o("topk_slots")[r] = P.e2_topk(o("logits")[r], o("seq_lens")[r], o("block_table")[r], cfg.index_topk)


# ---- split-K families: partial + epilogue ---------------------------------------------------------------

def b0_partial(p, o: Operand, cfg: Glm5Config) -> torch.Tensor:
    r = slice(p["m0"], p["m1"])
    return fp8_cols(o("x_fp8")[r], o("x_scale")[r], o("w.qkv_a.weight"), o("w.qkv_a.scale_inv"),
                    p["n0"], p["n1"], p["k0"], p["k1"])


def b0_epilogue(p, acc: torch.Tensor, o: Operand, cfg: Glm5Config) -> None:
    if (p["g0"], p["g1"]) != (0, cfg.qkv_a_out):
        raise ValueError(f"B0 epilogue needs whole rows, got weight rows [{p['g0']},{p['g1']})")
    r = slice(p["m0"], p["m1"])
    w = AttnWeights(input_norm=None, qkv_a=None, q_a_norm=o("w.q_a_norm"), kv_a_norm=o("w.kv_a_norm"), q_b=None,
                      w_kc=None, w_vc=None, o_proj=None, indexer=None)
    for name, v in P.b0_row_epilogue(acc.to(BF16), w, cfg).items():
        o(name)[r] = v


def c0_partial(p, o: Operand, cfg: Glm5Config) -> torch.Tensor:
    r, k = slice(p["m0"], p["m1"]), slice(p["k0"], p["k1"])
    return o("x_bf16")[r, k].float() @ o("w.indexer.weights_proj")[p["n0"]:p["n1"], k].float().t()


def c0_epilogue(p, acc: torch.Tensor, o: Operand, cfg: Glm5Config) -> None:
    o("w_raw")[p["m0"]:p["m1"], p["g0"]:p["g1"]] = acc.to(BF16)


def b1_partial(p, o: Operand, cfg: Glm5Config) -> torch.Tensor:
    r, k = slice(p["m0"], p["m1"]), slice(p["k0"], p["k1"])
    if o.has("x_fp8"):
        return fp8_cols(o("x_fp8")[r], o("x_scale")[r], o("w.indexer.wk.weight"), o("w.indexer.wk.scale_inv"),
                        p["n0"], p["n1"], p["k0"], p["k1"])
    wk = _lin(o, "w.indexer.wk").dequant().to(BF16)  # the bf16 GEMM variant (SGLang's)
    return o("x_bf16")[r, k].float() @ wk[p["n0"]:p["n1"], k].float().t()


def b1_epilogue(p, acc: torch.Tensor, o: Operand, cfg: Glm5Config) -> None:
    r = slice(p["m0"], p["m1"])
    idx = IndexerWeights(wq_b=None, wk=None, k_norm_weight=o("w.indexer.k_norm_weight"),
                         k_norm_bias=o("w.indexer.k_norm_bias"), weights_proj=None)
    k8, s = P.b1_key_epilogue(acc.to(BF16), idx, o("positions")[r], o("out_cache_loc")[r],
                              o("index_k_cache_written"), cfg)
    o("index_k_fp8")[r], o("index_k_scale")[r] = k8, s


def d1_partial(p, o: Operand, cfg: Glm5Config) -> torch.Tensor:
    r = slice(p["m0"], p["m1"])
    return fp8_cols(o("q_lora_fp8")[r], o("q_lora_scale")[r], o("w.indexer.wq_b.weight"),
                    o("w.indexer.wq_b.scale_inv"), p["n0"], p["n1"], p["k0"], p["k1"])


def d1_epilogue(p, acc: torch.Tensor, o: Operand, cfg: Glm5Config) -> None:
    d = cfg.index_head_dim
    r, h0, h1 = slice(p["m0"], p["m1"]), p["g0"] // d, p["g1"] // d
    if p["g0"] % d or p["g1"] % d:
        raise ValueError(f"D1 epilogue weight rows [{p['g0']},{p['g1']}) are not whole heads of {d}")
    q8, s, hw = P.d1_head_epilogue(acc.to(BF16).view(acc.shape[0], h1 - h0, d), o("w_raw")[r, h0:h1],
                                   o("positions")[r], cfg)
    o("index_q_fp8")[r, h0:h1], o("index_q_scale")[r, h0:h1], o("head_w")[r, h0:h1] = q8, s, hw


SOLVERS = {"A0": a0, "D0": d0, "D2": d2, "E1": e1, "E2": e2}
SPLIT_K_SOLVERS = {"B0": (b0_partial, b0_epilogue), "C0": (c0_partial, c0_epilogue),
                   "B1": (b1_partial, b1_epilogue), "D1": (d1_partial, d1_epilogue)}
