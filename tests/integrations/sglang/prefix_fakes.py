"""Faithful fakes of the SGLang objects the prefix seam touches, for CPU tests (no GPU, no sglang needed).

Attribute names are SGLang's (0.5.23 `DeepseekV2AttentionMLA`, `Indexer`, `LayerNorm`, `RMSNorm`,
`RotaryEmbedding`, `DSATokenToKVPool`, the DSA backend's indexer metadata); test_prefix_route.py checks
each name against the real class source with inspect when sglang is importable. Weights are a GLM-5
`random_layer` put into SGLang's runtime layouts: fused QKV-A FP8, q_b FP8, W_UK bf16 with SGLang's
transposed strides, the fused indexer's bf16 `wk_weights_proj` = [dequant(wk) ; weights_proj].

`stock_prepare` is a stand-in for SGLang's forward_absorb_prepare built from the reference ops with
SGLang 0.5.23's fused-indexer numerics (bf16 x * bf16 wk for the indexer key, torch.bmm on the strided
W_UK), returning the same tuple and writing the index-K cache at out_cache_loc; with a non-fused indexer it
calls the indexer module itself (0.5.14's rotating indexer: prefix_fakes_0514.py).
"""
from __future__ import annotations

import types

import torch

from glm5_fastpath.config import INDEX_K_PAGE_TOKENS, small_config
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.ref.fp8 import index_k_page_bytes, quant_act_per_token
from glm5_fastpath.ref.rope import apply_rope_interleaved, rope_cos_sin
from glm5_fastpath.testing.decode_step import make_decode_step
from glm5_fastpath.weights import generated_source, random_layer

BF16 = torch.bfloat16
PAGE = INDEX_K_PAGE_TOKENS


def small_cfg(**kw):
    return small_config(**kw)


class ReplicatedLinear:
    def __init__(self, weight, scale=None):
        self.weight = weight
        if scale is not None:
            self.weight_scale_inv = scale


class RMSNorm:
    def __init__(self, weight, eps):
        self.weight, self.variance_epsilon = weight, eps


class LayerNorm:
    def __init__(self, weight, bias, eps=1e-6):
        self.weight, self.bias, self.variance_epsilon = weight, bias, eps


class RotaryEmbedding:
    def __init__(self, dim, base, max_pos, neox=False):
        self.head_size = self.rotary_dim = dim
        self.base, self.max_position_embeddings, self.is_neox_style = base, max_pos, neox


class Indexer:
    """SGLang's DSA Indexer (fused layout when fused=True: wk_weights_proj bf16, no Hadamard)."""

    def __init__(self, cfg, iw, fused=True):
        self.n_heads, self.head_dim, self.rope_head_dim = cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
        self.index_topk, self.q_lora_rank = cfg.index_topk, cfg.q_lora_rank
        self.num_init_tokens = self.num_local_tokens = 0
        self.use_dsa_indexer_fusion = fused
        self.wq_b = ReplicatedLinear(iw.wq_b.weight, iw.wq_b.scale_inv)
        if fused:
            self.wk_weights_proj = ReplicatedLinear(torch.cat([iw.wk.dequant().to(BF16), iw.weights_proj]).contiguous())
        else:
            self.wk = ReplicatedLinear(iw.wk.weight, iw.wk.scale_inv)
            self.weights_proj = ReplicatedLinear(iw.weights_proj)
        self.k_norm = LayerNorm(iw.k_norm_weight, iw.k_norm_bias)
        self.rotary_emb = RotaryEmbedding(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        self.calls = []
        self._iw, self._cfg = iw, cfg

    def __call__(self, x, q_lora, positions, forward_batch, layer_id):
        """Stand-in of SGLang's indexer forward (used by the partial route): reference C0/B1/D1/E1/E2."""
        self.calls.append(q_lora)
        return _indexer_topk(self._cfg, self._iw_sglang(), x, q_lora, positions, forward_batch, layer_id)

    def _iw_sglang(self):
        return _sglang_indexer_weights(self)


class DeepseekV2AttentionMLA:
    """The attributes of SGLang's DeepseekV2AttentionMLA the prefix adapter reads."""

    def __init__(self, cfg, layer_id=1, seed=0, fused_indexer=True, shared=False):
        lw = random_layer(cfg, layer_id, seed=seed)
        w = lw.attn
        self.cfg = cfg
        self.layer_id, self.q_lora_rank, self.kv_lora_rank = layer_id, cfg.q_lora_rank, cfg.kv_lora_rank
        self.qk_nope_head_dim, self.qk_rope_head_dim = cfg.qk_nope_head_dim, cfg.qk_rope_head_dim
        self.qk_head_dim, self.v_head_dim = cfg.qk_head_dim, cfg.v_head_dim
        self.num_heads = self.num_local_heads = cfg.num_attention_heads
        self.dcp_size, self.use_deep_gemm_bmm, self.current_attention_backend = 1, False, "dsa"
        self.is_nextn, self.skip_topk, self.use_dsa = False, shared, True
        self.w_kc_qrep = None
        self.fused_qkv_a_proj_with_mqa = ReplicatedLinear(w.qkv_a.weight, w.qkv_a.scale_inv)
        self.q_a_layernorm = RMSNorm(w.q_a_norm, cfg.rms_norm_eps)
        self.kv_a_layernorm = RMSNorm(w.kv_a_norm, cfg.rms_norm_eps)
        self.q_b_proj = ReplicatedLinear(w.q_b.weight, w.q_b.scale_inv)
        # SGLang: w_kc.transpose(1, 2).contiguous().transpose(1, 2) (deepseek_weight_loader.py)
        self.w_kc = w.w_kc.transpose(1, 2).contiguous().transpose(1, 2)
        self.w_vc = w.w_vc
        # SGLang keeps kv_b_proj (block FP8) for its prefill; the W8 D2 route copies W_UK's rows from it
        src = generated_source(cfg, layer_id, seed)
        kvb = f"model.layers.{layer_id}.self_attn.kv_b_proj."
        self.kv_b_proj = ReplicatedLinear(src(kvb + "weight"), src(kvb + "weight_scale_inv").float())
        self.rotary_emb = RotaryEmbedding(cfg.qk_rope_head_dim, cfg.rope_theta, cfg.max_position_embeddings)
        self.indexer = None if shared else Indexer(cfg, w.indexer if w.indexer is not None else
                                                   random_layer(cfg, 0, seed=seed).attn.indexer, fused=fused_indexer)
        self.attn_mqa = types.SimpleNamespace(layer_id=layer_id)
        self.weights = w

    # the seam (0.5.23 signature); stands in for SGLang's own method
    def forward_absorb_prepare(self, positions, hidden_states, forward_batch, zero_allocator, llama_4_scaling=None,
                               prev_topk_indices=None):
        return stock_prepare(self, positions, hidden_states, forward_batch, zero_allocator, llama_4_scaling,
                             prev_topk_indices)

    def forward_absorb_core(self, q_pe, k_pe, q_nope_out, k_nope, forward_batch, zero_allocator, positions,
                            topk_indices, llama_4_scaling, fusion_plan=None, attention_output_gate=None):
        raise NotImplementedError


class DeepseekV2AttentionMLA0514(DeepseekV2AttentionMLA):
    """SGLang 0.5.14's seam: a 9-element tuple (no fusion_plan)."""

    def forward_absorb_prepare(self, positions, hidden_states, forward_batch, zero_allocator, llama_4_scaling=None,
                               prev_topk_indices=None):
        return stock_prepare(self, positions, hidden_states, forward_batch, zero_allocator, llama_4_scaling,
                             prev_topk_indices)[:9]

    def forward_absorb_core(self, q_pe, k_pe, q_nope_out, k_nope, forward_batch, zero_allocator, positions,
                            topk_indices, llama_4_scaling):
        raise NotImplementedError


class DSATokenToKVPool:
    """Layout of SGLang's DSATokenToKVPool: per layer one [pages, 64 * (D + 4)] uint8 index-K buffer."""

    def __init__(self, cfg, num_pages, layers=4):
        self.page_size = self.index_page_size = PAGE
        self.index_kpool, self.index_head_dim, self.quant_block_size = 1, cfg.index_head_dim, cfg.index_head_dim
        self.index_k_with_scale_buffer = [torch.zeros(num_pages, index_k_page_bytes(cfg.index_head_dim),
                                                      dtype=torch.uint8) for _ in range(layers)]

    def get_index_k_with_scale_buffer(self, layer_id):
        return self.index_k_with_scale_buffer[layer_id]


class DSAIndexerMetadata:
    def __init__(self, seq_lens, page_table_64):
        self._sl, self._bt = seq_lens, page_table_64

    def get_seqlens_int32(self):
        return self._sl

    def get_page_table_64(self):
        return self._bt


class DSABackend:
    def __init__(self, pool, metadata, fused_topk=True):
        self.token_to_kv_pool, self._md, self.use_fused_topk = pool, metadata, fused_topk
        self.hisparse_coordinator, self.dsa_index_kpool = None, 1

    def get_indexer_metadata(self, layer_id, forward_batch):
        return self._md


class ForwardMode:
    def __init__(self, name="DECODE"):
        self.name = name

    def is_decode(self):
        return self.name == "DECODE"

    def is_decode_or_idle(self):
        return self.name in ("DECODE", "IDLE")


def make_batch(cfg, seq_lens, *, seed=0, layer_id=1, fused_topk=True, layers=4):
    """A decode step as SGLang presents it at the seam: (positions, normed hidden, forward_batch), plus the
    DecodeStep (block table, caches) it was built from. The index-K cache lives in a fake DSATokenToKVPool."""
    step = make_decode_step(cfg, seq_lens, seed=seed)
    pool = DSATokenToKVPool(cfg, step.index_k_cache.shape[0], layers)
    pool.index_k_with_scale_buffer[layer_id].copy_(step.index_k_cache)
    backend = DSABackend(pool, DSAIndexerMetadata(step.seq_lens, step.block_table), fused_topk)
    fb = types.SimpleNamespace(forward_mode=ForwardMode("DECODE"), out_cache_loc=step.out_cache_loc,
                               attn_backend=backend, token_to_kv_pool=pool, batch_size=len(seq_lens))
    x = P.a0_add_rmsnorm_quant(step.hidden, step.residual, torch.ones(cfg.hidden_size, dtype=BF16),
                               cfg.rms_norm_eps)[0]
    return step, x, fb


# ---- the stock stand-in --------------------------------------------------------------------------------

class _Bf16Linear:
    def __init__(self, w):
        self._w = w

    def dequant(self):
        return self._w


def _sglang_indexer_weights(idx):
    d = idx.head_dim
    kw = idx.wk_weights_proj.weight if idx.use_dsa_indexer_fusion else None
    from glm5_fastpath.weights import Fp8Linear, IndexerWeights

    return IndexerWeights(wq_b=Fp8Linear(idx.wq_b.weight, idx.wq_b.weight_scale_inv),
                          wk=_Bf16Linear(kw[:d]) if kw is not None else Fp8Linear(idx.wk.weight, idx.wk.weight_scale_inv),
                          k_norm_weight=idx.k_norm.weight, k_norm_bias=idx.k_norm.bias,
                          weights_proj=kw[d:] if kw is not None else idx.weights_proj.weight)


def _indexer_topk(cfg, iw, x, q_lora, positions, fb, layer_id):
    """SGLang 0.5.23 fused-indexer numerics: bf16 GEMM for the key (x bf16, wk bf16) and the head gate."""
    backend = fb.attn_backend
    md = backend.get_indexer_metadata(layer_id, fb)
    sl, bt = md.get_seqlens_int32(), md.get_page_table_64()
    cache = backend.token_to_kv_pool.get_index_k_with_scale_buffer(layer_id)
    w_raw = P.c0_head_gate(x, iw.weights_proj)
    key = P._bf16_gemm(x, iw.wk.dequant().to(BF16))
    P.b1_key_epilogue(key, iw, positions, fb.out_cache_loc, cache, cfg)
    q8l, qsl = quant_act_per_token(q_lora)
    q8, _, hw = P.d1_indexer_q(q8l, qsl, w_raw, iw, positions, cfg)
    logits = P.e1_indexer_logits(q8, hw, cache, sl, bt, cfg, max_ctx=bt.shape[1] * PAGE)
    if backend.use_fused_topk:
        return P.e2_topk(logits, sl, bt, cfg.index_topk)
    ident = torch.arange(bt.shape[1], dtype=torch.int32)[None, :].expand(bt.shape[0], -1)
    return P.e2_topk(logits, sl, ident, cfg.index_topk)  # logical positions


def stock_prepare(attn, positions, hidden, fb, zero_allocator, llama_4_scaling=None, prev_topk_indices=None):
    """What SGLang's forward_absorb_prepare returns (0.5.23 fused-indexer semantics), from reference math."""
    cfg = attn.cfg
    x8, xs = quant_act_per_token(hidden)
    qkv = P._fp8_gemm_bf16(x8, xs, _lin(attn.fused_qkv_a_proj_with_mqa))
    q, kvl = cfg.q_lora_rank, cfg.kv_lora_rank
    q_lora = P._rmsnorm_bf16(qkv[:, :q], attn.q_a_layernorm.weight, cfg.rms_norm_eps)
    k_nope = P._rmsnorm_bf16(qkv[:, q:q + kvl], attn.kv_a_layernorm.weight, cfg.rms_norm_eps).unsqueeze(1)
    if attn.skip_topk:
        topk = prev_topk_indices
    else:
        topk = attn.indexer(x=hidden, q_lora=q_lora, positions=positions, forward_batch=fb, layer_id=attn.layer_id) \
            if not getattr(attn.indexer, "use_dsa_indexer_fusion", False) else \
            _indexer_topk(cfg, _sglang_indexer_weights(attn.indexer), hidden, q_lora, positions, fb, attn.layer_id)
    q8l, qsl = quant_act_per_token(q_lora)
    qf = P._fp8_gemm_bf16(q8l, qsl, _lin(attn.q_b_proj)).view(-1, cfg.num_attention_heads, cfg.qk_head_dim)
    q_nope, q_pe = qf[..., :cfg.qk_nope_head_dim], qf[..., cfg.qk_nope_head_dim:]
    q_nope_out = torch.bmm(q_nope.transpose(0, 1).float(), attn.w_kc.float()).to(BF16).transpose(0, 1)
    cos, sin = rope_cos_sin(positions, cfg.qk_rope_head_dim, cfg.rope_theta)
    q_pe = apply_rope_interleaved(q_pe, cos, sin).to(BF16)
    k_pe = apply_rope_interleaved(qkv[:, q + kvl:], cos, sin).to(BF16).unsqueeze(1)
    return (q_pe, k_pe, q_nope_out, k_nope, fb, zero_allocator, positions, topk, llama_4_scaling, None)


def _lin(mod):
    from glm5_fastpath.weights import Fp8Linear

    return Fp8Linear(mod.weight, mod.weight_scale_inv)


def fake_model(attns):
    layers = [types.SimpleNamespace(self_attn=a, mlp=None) for a in attns]
    return types.SimpleNamespace(model=types.SimpleNamespace(layers=layers), config=None)
