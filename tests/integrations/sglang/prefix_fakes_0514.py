"""A faithful fake of SGLang 0.5.14's DSA indexer (the H200's release) for CPU tests of the "full" route with
the Hadamard rotation.

0.5.14's indexer (srt/layers/attention/dsa/dsa_indexer.py of the 0.5.14 wheel) differs from 0.5.23's fused one
in what prefix_adapter reads:
- separate projections: `wk` (block-FP8 ReplicatedLinear, weight e4m3 [128, H] + weight_scale_inv) and
  `weights_proj` (bf16 [32, H]); no `wk_weights_proj`, no `use_dsa_indexer_fusion`;
- q and k are rotated after RoPE by the module-level `rotate_activation` (normalised 128-point
  Walsh-Hadamard, `hadamard_transform(x, scale=hidden_size**-0.5)`), unconditionally, in `_get_q_k_bf16`
  (decode / extend) and `_get_k_bf16` (the k-only prefill path).
prefix_adapter.indexer_rotates recognises the indexer from that source, so the module function and the two
methods below keep 0.5.14's shape; their bodies are the reference math with 0.5.14's roundings (bf16
LayerNorm output, bf16 RoPE output, bf16 rotation output).

`Indexer.__call__` stands in for 0.5.14's forward_cuda on the decode path: the rotated bf16 q / k above, q
quantised per (token, head) with UE8M0 scales (act_quant(query, 128, "ue8m0")), k stored by the fused store
kernel (s = max(amax, 1e-4)/448, fp32), head weights fp32(x . weights_proj^T) * n_heads^-0.5 * q_scale *
head_dim^-0.5 (no bf16 rounding of the gate), paged logits and the top-k (reference E1 / E2).
"""
from __future__ import annotations

import torch

import prefix_fakes as F
from glm5_fastpath.ref import fp8, prefix as P
from glm5_fastpath.ref.hadamard import fwht
from glm5_fastpath.ref.rope import apply_rope_interleaved, rope_cos_sin

BF16 = torch.bfloat16


def hadamard_transform(x, scale=1.0):
    """Stand-in of sglang.jit_kernel.hadamard.hadamard_transform (CUDA only): fp32 butterflies, dtype kept."""
    return fwht(x, scale).to(x.dtype)


def rotate_activation(x: torch.Tensor) -> torch.Tensor:
    hidden_size = x.size(-1)
    assert (hidden_size & (hidden_size - 1)) == 0, "Hidden size must be a power of 2 for Hadamard transform."
    return hadamard_transform(x, scale=hidden_size**-0.5)


def _lin(mod):
    from glm5_fastpath.weights import Fp8Linear

    return Fp8Linear(mod.weight, mod.weight_scale_inv)


def _fp8_linear_bf16(x: torch.Tensor, mod) -> torch.Tensor:
    """0.5.14's block-FP8 ReplicatedLinear on a bf16 input: per-token-group quant, FP8 GEMM, bf16 out."""
    x8, xs = fp8.quant_act_per_token(x)
    return P._fp8_gemm_bf16(x8, xs, _lin(mod))


def _rope_bf16(t: torch.Tensor, positions: torch.Tensor, cfg) -> torch.Tensor:
    cos, sin = rope_cos_sin(positions, cfg.qk_rope_head_dim, cfg.rope_theta)
    return apply_rope_interleaved(t, cos, sin).to(BF16)


class Indexer(F.Indexer):
    """SGLang 0.5.14's `Indexer` (class name as the real one: the adapter checks it)."""

    def __init__(self, cfg, iw):
        super().__init__(cfg, iw, fused=False)
        del self.use_dsa_indexer_fusion  # 0.5.14 has no fused indexer
        self.scale_fmt, self.block_size = "ue8m0", 128
        self.softmax_scale = self.head_dim ** -0.5

    def _get_q_k_bf16(self, q_lora, x, positions, enable_dual_stream, forward_batch):
        cfg, r = self._cfg, self.rope_head_dim
        query = _fp8_linear_bf16(q_lora, self.wq_b).view(-1, self.n_heads, self.head_dim)
        key = _fp8_linear_bf16(x, self.wk)
        key = self._k_norm(key)
        query = torch.cat([_rope_bf16(query[..., :r], positions, cfg), query[..., r:]], dim=-1)
        key = torch.cat([_rope_bf16(key[..., :r], positions, cfg), key[..., r:]], dim=-1)
        query = rotate_activation(query)
        key = rotate_activation(key)
        return query, key

    def _get_k_bf16(self, x, positions, enable_dual_stream):
        r = self.rope_head_dim
        key = self._k_norm(_fp8_linear_bf16(x, self.wk))
        key = torch.cat([_rope_bf16(key[..., :r], positions, self._cfg), key[..., r:]], dim=-1)
        key = rotate_activation(key)
        return key

    def _k_norm(self, key):
        """SGLang's LayerNorm (fp32 weight / bias) on a bf16 input: fp32 math, bf16 out."""
        kn = self.k_norm
        return torch.nn.functional.layer_norm(key.float(), (self.head_dim,), kn.weight, kn.bias,
                                              kn.variance_epsilon).to(BF16)

    def __call__(self, x, q_lora, positions, forward_batch, layer_id):
        """0.5.14's decode forward (module doc): writes the rotated key, returns the top-k in the backend's form."""
        self.calls.append(q_lora)
        cfg = self._cfg
        backend = forward_batch.attn_backend
        md = backend.get_indexer_metadata(layer_id, forward_batch)
        sl, bt = md.get_seqlens_int32(), md.get_page_table_64()
        cache = backend.token_to_kv_pool.get_index_k_with_scale_buffer(layer_id)
        query, key = self._get_q_k_bf16(q_lora, x, positions, False, forward_batch)
        q_fp8, q_scale = act_quant_ue8m0(query)
        k8, ks = fp8.quant_per_row(key)  # fused_store_index_k_cache: max(amax, 1e-4)/448, fp32
        fp8.index_k_cache_store(cache, forward_batch.out_cache_loc, k8, ks)
        weights = (x.float() @ self.weights_proj.weight.float().t()) * self.n_heads ** -0.5
        weights = weights * q_scale * self.softmax_scale
        logits = P.e1_indexer_logits(q_fp8, weights, cache, sl, bt, cfg, max_ctx=bt.shape[1] * F.PAGE)
        if getattr(backend, "use_fused_topk", True):
            return P.e2_topk(logits, sl, bt, cfg.index_topk)
        ident = torch.arange(bt.shape[1], dtype=torch.int32)[None, :].expand(bt.shape[0], -1)
        return P.e2_topk(logits, sl, ident, cfg.index_topk)


def act_quant_ue8m0(q: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """act_quant(q, 128, "ue8m0") of 0.5.14 (triton_kernel.py) for 128-wide heads: s = 2^ceil(log2(max(amax,
    1e-4) / 448)) per (token, head), q8 = fp8(clamp(q / s))."""
    qf = q.float()
    amax = qf.abs().amax(-1).clamp_min(1e-4)
    s = torch.exp2(torch.ceil(torch.log2(amax * (1.0 / 448.0))))
    return (qf / s[..., None]).clamp(-448, 448).to(torch.float8_e4m3fn), s


def attn_0514(cfg, layer_id=1, seed=0):
    """A 0.5.14 attention module (9-tuple seam) whose indexer is the rotating one above."""
    a = F.DeepseekV2AttentionMLA0514(cfg, layer_id=layer_id, seed=seed, fused_indexer=False)
    a.indexer = Indexer(cfg, a.indexer._iw)
    return a
