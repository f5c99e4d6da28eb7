"""Reference of one GLM-5 decode layer's attention prefix, op by op (spec/glm5_layer.md sections 3-5).

The ops have the granularity of our fused kernels (design-article names A0 ... E2). Each computes
in fp32 and rounds to bf16 exactly where SGLang's decode kernels emit bf16 (GEMM outputs, norm
outputs), so the reference is SGLang's decode path, not an idealised one. Pure PyTorch, runs on CPU
and CUDA (no host copies on the data path; validation may read small index tensors).

Tensor names used in the returned dicts match the op graph (glm5_fastpath/graph/prefix_graph.py):

    A0  hidden, residual           -> x_bf16, residual_out, x_fp8, x_scale
    B0  x_fp8, x_scale             -> q_lora, q_lora_fp8, q_lora_scale, c_kv, k_pe
    C0  x_bf16                     -> w_raw
    B1  x_fp8, x_scale (or x_bf16) -> index_k_fp8, index_k_scale, index-K cache written at out_cache_loc
    D1  q_lora_fp8/scale, w_raw    -> index_q_fp8, index_q_scale, head_w
    (B1 / D1 take rotate=True for SGLang 0.5.14's indexer: a 128-point Walsh-Hadamard rotation after RoPE,
     before the FP8 quant; see the "Hadamard rotation" note above b1_indexer_k)
    D0  q_lora_fp8/scale           -> q_nope, q_pe (roped)
    D2  q_nope, c_kv, k_pe         -> q_lat, MLA KV cache written at out_cache_loc
    E1  index_q_fp8, head_w, cache -> logits
    E2  logits                     -> topk_slots
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch

from ..config import INDEX_K_PAGE_TOKENS, INDEXER_K_NORM_EPS, INDEX_QK_SCALE_FLOOR, Glm5Config
from ..weights import AttnWeights, Fp8Linear, IndexerWeights
from . import fp8
from .hadamard import fwht
from .rope import apply_rope_interleaved, rope_cos_sin

BF16 = torch.bfloat16
FP8 = fp8.FP8
PAGE = INDEX_K_PAGE_TOKENS


class PrefixInputError(ValueError):
    """An attention-prefix op got an input of the wrong dtype/shape/range."""


# ---- validation helpers -------------------------------------------------------------------------------

def _fail(op: str, msg: str) -> PrefixInputError:
    return PrefixInputError(f"{op}: {msg}")


def _check(op: str, name: str, t, dtype=None, shape=None, dtypes=None) -> None:
    """shape: tuple of ints or None (any size) per dim."""
    if not isinstance(t, torch.Tensor):
        raise _fail(op, f"{name} must be a torch.Tensor, got {type(t).__name__}")
    allowed = dtypes if dtypes is not None else ((dtype,) if dtype is not None else None)
    if allowed is not None and t.dtype not in allowed:
        want = " or ".join(str(d).replace("torch.", "") for d in allowed)
        raise _fail(op, f"{name} must be {want}, got {str(t.dtype).replace('torch.', '')}")
    if shape is not None:
        ok = t.dim() == len(shape) and all(s is None or s == d for s, d in zip(shape, t.shape))
        if not ok:
            want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
            raise _fail(op, f"{name} must have shape {want}, got {list(t.shape)}")


def _check_fp8_linear(op: str, name: str, lin: Fp8Linear, n: int, k: int) -> None:
    _check(op, f"{name}.weight", lin.weight, FP8, (n, k))
    _check(op, f"{name}.scale_inv", lin.scale_inv, torch.float32, (-(-n // 128), -(-k // 128)))


def _check_act_fp8(op: str, name: str, x8, xs, m: int | None, k: int) -> None:
    _check(op, name, x8, FP8, (m, k))
    _check(op, f"{name} scale", xs, torch.float32, (x8.shape[0], k // 128))


_INDEX_DTYPES = (torch.int32, torch.int64)


def _check_slots(op: str, name: str, slots, m: int, num_slots: int) -> None:
    _check(op, name, slots, shape=(m,), dtypes=_INDEX_DTYPES)
    if m == 0:
        return
    lo, hi = int(slots.min()), int(slots.max())
    if lo < 0 or hi >= num_slots:
        raise _fail(op, f"{name} has slots in [{lo}, {hi}] but the cache holds {num_slots} slots")
    if torch.unique(slots).numel() != m:
        raise _fail(op, f"{name} has duplicate slots (two tokens would overwrite one cache entry)")


def _check_block_table(op: str, seq_lens, block_table, m: int, num_pages: int | None = None) -> None:
    _check(op, "seq_lens", seq_lens, shape=(m,), dtypes=_INDEX_DTYPES)
    _check(op, "block_table", block_table, shape=(m, None), dtypes=_INDEX_DTYPES)
    if m == 0:
        return
    if int(seq_lens.min()) < 0:
        raise _fail(op, f"seq_lens has a negative entry ({int(seq_lens.min())})")
    cap = block_table.shape[1] * PAGE
    longest = int(seq_lens.max())
    if longest > cap:
        row = int(seq_lens.argmax())
        raise _fail(op, f"seq_lens[{row}]={longest} exceeds the block table capacity "
                        f"{block_table.shape[1]} pages x {PAGE} = {cap} tokens")
    if num_pages is not None and longest > 0:
        used = torch.arange(block_table.shape[1], device=block_table.device)[None, :] * PAGE < seq_lens[:, None]
        pages = block_table[used]
        lo, hi = int(pages.min()), int(pages.max())
        if lo < 0 or hi >= num_pages:
            raise _fail(op, f"block_table maps live tokens to pages in [{lo}, {hi}] but the index-K cache has {num_pages} pages")


# ---- small math helpers ---------------------------------------------------------------------------------

def _rmsnorm_bf16(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """sgl_kernel.rmsnorm: fp32 math on the bf16 input, bf16 out."""
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(BF16)


def _fp8_gemm_bf16(x8: torch.Tensor, xs: torch.Tensor, w: Fp8Linear) -> torch.Tensor:
    """Block-FP8 GEMM (DeepGEMM fp8_gemm_nt math), fp32 accumulate, bf16 out."""
    return fp8.block_fp8_linear(x8, xs, w.weight, w.scale_inv).to(BF16)


def _bf16_gemm(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """bf16 x bf16 -> fp32 accumulate -> bf16 (cuBLAS bf16 GEMM). fp32 matmul: no TF32 unless the caller enabled it."""
    return (x.float() @ w.float().t()).to(BF16)


def _rope_cs(positions: torch.Tensor, cfg: Glm5Config) -> tuple[torch.Tensor, torch.Tensor]:
    return rope_cos_sin(positions, cfg.qk_rope_head_dim, cfg.rope_theta)


# ---- A0: residual add + RMSNorm + per-token FP8 quant ---------------------------------------------------

def a0_add_rmsnorm_quant(hidden: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (x_bf16 [M,H], residual_out [M,H] bf16, x_fp8 [M,H] e4m3, x_scale [M,H/128] fp32).

    r = fp32(hidden) + fp32(residual); residual_out = bf16(r); the norm uses the fp32 sum r (as
    flashinfer's fused_add_rmsnorm does), x = bf16(r * rsqrt(mean(r^2) + eps) * fp32(weight)).
    x_fp8/x_scale: per-token 1x128 quant of the bf16 x (what SGLang's separate quant kernel sees).
    """
    op = "A0 add_rmsnorm_quant"
    _check(op, "hidden", hidden, BF16, (None, None))
    m, h = hidden.shape
    _check(op, "residual", residual, BF16, (m, h))
    _check(op, "weight", weight, BF16, (h,))
    if h % 128:
        raise _fail(op, f"hidden size {h} is not a multiple of 128 (1x128 activation quant)")
    r = hidden.float() + residual.float()
    x = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(BF16)
    x_fp8, x_scale = fp8.quant_act_per_token(x)
    return x, r.to(BF16), x_fp8, x_scale


# ---- B0: QKV-A GEMM + q_a / kv_a RMSNorm ------------------------------------------------------------------

def b0_qkv_a(x_fp8: torch.Tensor, x_scale: torch.Tensor, w: AttnWeights, cfg: Glm5Config) -> dict[str, torch.Tensor]:
    """Fused q_a ‖ kv_a GEMM and its norms.

    c = bf16(x · W_qkva^T) [M, q_lora + kv_lora + rope];
    q_lora = RMSNorm(c[:, :q_lora]) bf16, c_kv = RMSNorm(c[:, q_lora:q_lora+kv_lora]) bf16,
    k_pe = c[:, -rope:] raw (not normalized, not roped). q_lora_fp8 / q_lora_scale = 1x128 quant of
    q_lora: SGLang quantizes q_lora separately for wq_b (D1) and q_b_proj (D0), identically, so once here.
    """
    op = "B0 qkv_a"
    c = cfg
    _check_act_fp8(op, "x_fp8", x_fp8, x_scale, None, c.hidden_size)
    _check_fp8_linear(op, "qkv_a", w.qkv_a, c.qkv_a_out, c.hidden_size)
    _check(op, "q_a_norm", w.q_a_norm, BF16, (c.q_lora_rank,))
    _check(op, "kv_a_norm", w.kv_a_norm, BF16, (c.kv_lora_rank,))
    return b0_row_epilogue(_fp8_gemm_bf16(x_fp8, x_scale, w.qkv_a), w, cfg)


def b0_row_epilogue(qkv: torch.Tensor, w: AttnWeights, cfg: Glm5Config) -> dict[str, torch.Tensor]:
    """B0 after its K reduction: qkv [M, q_lora + kv_lora + rope] bf16 -> q_a/kv_a RMSNorm, q_lora quant
    (also the reduce role of a split-K B0, glm5_fastpath/attn_pre/megartp)."""
    c = cfg
    q_end, kv_end = c.q_lora_rank, c.q_lora_rank + c.kv_lora_rank
    q_lora = _rmsnorm_bf16(qkv[:, :q_end], w.q_a_norm, c.rms_norm_eps)
    c_kv = _rmsnorm_bf16(qkv[:, q_end:kv_end], w.kv_a_norm, c.rms_norm_eps)
    k_pe = qkv[:, kv_end:].contiguous()
    q_lora_fp8, q_lora_scale = fp8.quant_act_per_token(q_lora)
    return {"q_lora": q_lora, "q_lora_fp8": q_lora_fp8, "q_lora_scale": q_lora_scale, "c_kv": c_kv, "k_pe": k_pe}


# ---- C0: head gate --------------------------------------------------------------------------------------

def c0_head_gate(x_bf16: torch.Tensor, weights_proj: torch.Tensor) -> torch.Tensor:
    """w_raw [M, idx_heads] bf16 = bf16(x · weights_proj^T), bf16 operands, fp32 accumulate."""
    op = "C0 head_gate"
    _check(op, "x_bf16", x_bf16, BF16, (None, None))
    _check(op, "weights_proj", weights_proj, BF16, (None, x_bf16.shape[1]))
    return _bf16_gemm(x_bf16, weights_proj)


# ---- Hadamard rotation (SGLang 0.5.14's indexer) ----------------------------------------------------------
#
# SGLang 0.5.14 (and 0.5.23 with SGLANG_DISABLE_DSA_INDEXER_FUSION=1) rotates the indexer key and query
# with the normalised 128-point Walsh-Hadamard transform (ref/hadamard.py) after RoPE and before the FP8
# quant (dsa_indexer.py `_get_q_k_bf16` / `_get_k_bf16` -> `rotate_activation`), so its index-K cache holds
# rotated keys. rotate=True reproduces that on our side (B1 writes rotated keys, D1 emits rotated queries;
# E1 is unchanged: q.k is invariant under the orthonormal rotation, up to the FP8 rounding).
#
# Rounding of the rotated value, decided per op:
# * B1 (key): SGLang's key is bf16 going into the rotation (LayerNorm and RoPE kernels emit bf16) and its
#   Hadamard kernel returns bf16 (fp32 butterflies, fp32 scale, one bf16 rounding), which the fused store
#   kernel quantises (s = max(amax, 1e-4)/448). We do the same: the existing bf16 rounding after RoPE, the
#   fp32 butterfly `fwht` (bit-identical to SGLang's kernel on the same bf16 input), a bf16 rounding, then
#   the quant. The key is PERSISTENT: it lands in the index-K cache next to keys SGLang's own prefill /
#   stock decode wrote, so matching SGLang's bytes is what counts here. (Remaining differences: SGLang also
#   rounds the LayerNorm output to bf16 before RoPE on the 64 rope dims, and uses x * (1/s) in the store.)
# * D1 (query): kept in fp32 through RoPE, rotation and quant (no bf16 rounding), as our unrotated D1
#   already is. The query is TRANSIENT (only our E1 reads it, in the same step), SGLang's bytes cannot be
#   matched anyway (0.5.14 quantises q with UE8M0 power-of-two scales, act_quant(..., "ue8m0")), and
#   skipping the two bf16 roundings SGLang does (after RoPE, after the rotation) is strictly more accurate.


def b1_indexer_k(x_bf16: torch.Tensor | None, x_fp8: torch.Tensor | None, x_scale: torch.Tensor | None,
                 idx: IndexerWeights, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                 index_k_cache: torch.Tensor, cfg: Glm5Config, gemm: str = "fp8", rotate: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (index_k_fp8 [M, D_i] e4m3, index_k_scale [M] fp32); writes index_k_cache IN PLACE.

    key = bf16(GEMM): gemm="fp8" is our path (x_fp8 block-scaled x wk FP8, only x_fp8/x_scale read);
    gemm="bf16" is SGLang's (bf16 x times wk dequantized to bf16 at load, only x_bf16 read).
    k = LayerNorm_1e-6(fp32 key) with fp32 weight/bias; interleaved RoPE on the LEADING
    qk_rope_head_dim dims (fp32); round to bf16; rotate=True: k = bf16(fwht(k)) (normalised
    Walsh-Hadamard, SGLang 0.5.14's indexer; see the note above); s = max(amax, 1e-4)/448, k8 = fp8(k/s).
    Token m is stored at physical slot out_cache_loc[m] (page slot//64, row slot%64); no other
    cache byte changes.
    """
    op = "B1 indexer_k"
    c = cfg
    d = c.index_head_dim
    if gemm == "fp8":
        _check_act_fp8(op, "x_fp8", x_fp8, x_scale, None, c.hidden_size)
        m = x_fp8.shape[0]
    elif gemm == "bf16":
        _check(op, "x_bf16", x_bf16, BF16, (None, c.hidden_size))
        m = x_bf16.shape[0]
    else:
        raise _fail(op, f"gemm must be 'fp8' or 'bf16', got {gemm!r}")
    _check_fp8_linear(op, "wk", idx.wk, d, c.hidden_size)
    _check(op, "k_norm_weight", idx.k_norm_weight, torch.float32, (d,))
    _check(op, "k_norm_bias", idx.k_norm_bias, torch.float32, (d,))
    _check(op, "positions", positions, shape=(m,), dtypes=_INDEX_DTYPES)
    _check(op, "index_k_cache", index_k_cache, torch.uint8, (None, fp8.index_k_page_bytes(d)))
    _check_slots(op, "out_cache_loc", out_cache_loc, m, index_k_cache.shape[0] * PAGE)

    _check_rotate(op, rotate, d)
    if gemm == "fp8":
        key = _fp8_gemm_bf16(x_fp8, x_scale, idx.wk)
    else:
        key = _bf16_gemm(x_bf16, idx.wk.dequant().to(BF16))
    return b1_key_epilogue(key, idx, positions, out_cache_loc, index_k_cache, cfg, rotate=rotate)


def _check_rotate(op: str, rotate: object, d: int) -> None:
    if not isinstance(rotate, bool):
        raise _fail(op, f"rotate must be a bool, got {type(rotate).__name__}")
    if rotate and (d < 1 or d & (d - 1)):
        raise _fail(op, f"rotate=True needs a power-of-two index head dim (Walsh-Hadamard), got {d}")


def b1_key_epilogue(key: torch.Tensor, idx: IndexerWeights, positions: torch.Tensor, out_cache_loc: torch.Tensor,
                    index_k_cache: torch.Tensor, cfg: Glm5Config, rotate: bool = False
                    ) -> tuple[torch.Tensor, torch.Tensor]:
    """B1 after its K reduction: key [M, D_i] bf16 -> LayerNorm, RoPE, [rotation,] quant, index-K cache store
    (in place)."""
    kf = key.float()
    mean = kf.mean(-1, keepdim=True)
    var = (kf - mean).pow(2).mean(-1, keepdim=True)
    k = (kf - mean) * torch.rsqrt(var + INDEXER_K_NORM_EPS) * idx.k_norm_weight + idx.k_norm_bias
    r = cfg.qk_rope_head_dim
    cos, sin = _rope_cs(positions, cfg)
    k = torch.cat([apply_rope_interleaved(k[:, :r], cos, sin), k[:, r:]], dim=-1).to(BF16)
    if rotate:  # bf16 in, fp32 butterflies, bf16 out: SGLang 0.5.14's rotate_activation (note above b1_indexer_k)
        k = fwht(k).to(BF16)
    k8, s = fp8.quant_per_row(k, INDEX_QK_SCALE_FLOOR)
    fp8.index_k_cache_store(index_k_cache, out_cache_loc, k8, s)
    return k8, s


# ---- D1: indexer Q (GEMM + RoPE + per-head quant + head weights) -----------------------------------------

def d1_indexer_q(q_lora_fp8: torch.Tensor, q_lora_scale: torch.Tensor, w_raw: torch.Tensor, idx: IndexerWeights,
                 positions: torch.Tensor, cfg: Glm5Config, rotate: bool = False
                 ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """-> (index_q_fp8 [M, H_i, D_i] e4m3, index_q_scale [M, H_i] fp32, head_w [M, H_i] fp32).

    q = bf16(q_lora · wq_b^T) viewed [M, H_i, D_i]; interleaved RoPE on the leading rope dims in
    fp32 (kept in fp32: the fused kernel quantizes from registers, spec row 8 has no bf16 round);
    rotate=True: q = fwht(q) per (token, head) in fp32, no rounding (SGLang 0.5.14's rotation; see the
    note above b1_indexer_k); per (token, head) s_q = max(amax, 1e-4)/448, q8 = fp8(q/s_q);
    head_w = fp32(w_raw) * H_i^-0.5 * D_i^-0.5 * s_q. rotate=False: no Hadamard (SGLang 0.5.23's fused
    CUDA path).
    """
    op = "D1 indexer_q"
    c = cfg
    hi, d = c.index_n_heads, c.index_head_dim
    _check_act_fp8(op, "q_lora_fp8", q_lora_fp8, q_lora_scale, None, c.q_lora_rank)
    m = q_lora_fp8.shape[0]
    _check(op, "w_raw", w_raw, BF16, (m, hi))
    _check_fp8_linear(op, "wq_b", idx.wq_b, hi * d, c.q_lora_rank)
    _check(op, "positions", positions, shape=(m,), dtypes=_INDEX_DTYPES)
    _check_rotate(op, rotate, d)
    q = _fp8_gemm_bf16(q_lora_fp8, q_lora_scale, idx.wq_b).view(m, hi, d)
    return d1_head_epilogue(q, w_raw, positions, cfg, rotate=rotate)


def d1_head_epilogue(q: torch.Tensor, w_raw: torch.Tensor, positions: torch.Tensor, cfg: Glm5Config,
                     rotate: bool = False) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """D1 after its K reduction, per (token, head): q [M, h, D_i] bf16 (any subset of heads, w_raw [M, h]
    the same heads) -> RoPE, [rotation,] per-head quant, head weights."""
    r = cfg.qk_rope_head_dim
    cos, sin = _rope_cs(positions, cfg)
    qf = torch.cat([apply_rope_interleaved(q[..., :r], cos, sin), q[..., r:].float()], dim=-1)
    if rotate:  # fp32 in and out (note above b1_indexer_k)
        qf = fwht(qf)
    q8, s_q = fp8.quant_per_row(qf, INDEX_QK_SCALE_FLOOR)
    head_w = w_raw.float() * cfg.index_weight_scale * s_q
    return q8, s_q, head_w


# ---- D0: q_b_proj + MLA q RoPE ----------------------------------------------------------------------------

def d0_q_b(q_lora_fp8: torch.Tensor, q_lora_scale: torch.Tensor, w: AttnWeights, positions: torch.Tensor,
           cfg: Glm5Config) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (q_nope [M, H, nope] bf16, q_pe [M, H, rope] bf16, roped).

    q = bf16(q_lora · W_qb^T) viewed [M, H, nope + rope]; interleaved RoPE on the trailing rope dims
    of every head (fp32 math, bf16 out, as the in-place MLA rope kernel).
    """
    op = "D0 q_b"
    c = cfg
    h, nope = c.num_attention_heads, c.qk_nope_head_dim
    _check_act_fp8(op, "q_lora_fp8", q_lora_fp8, q_lora_scale, None, c.q_lora_rank)
    m = q_lora_fp8.shape[0]
    _check_fp8_linear(op, "q_b", w.q_b, h * c.qk_head_dim, c.q_lora_rank)
    _check(op, "positions", positions, shape=(m,), dtypes=_INDEX_DTYPES)
    q = _fp8_gemm_bf16(q_lora_fp8, q_lora_scale, w.q_b).view(m, h, c.qk_head_dim)
    cos, sin = _rope_cs(positions, c)
    q_pe = apply_rope_interleaved(q[..., nope:], cos, sin).to(BF16)
    return q[..., :nope].contiguous(), q_pe


# ---- D2: W_UK absorption + k_pe RoPE + MLA KV store ------------------------------------------------------

def d2_absorb_and_kv_store(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w: AttnWeights,
                           positions: torch.Tensor, out_cache_loc: torch.Tensor, kv_cache: torch.Tensor,
                           cfg: Glm5Config) -> torch.Tensor:
    """-> q_lat [M, H, kv_lora] bf16; writes kv_cache IN PLACE.

    q_lat[m, h] = bf16(q_nope[m, h] · w_kc[h]) (bf16 bmm, fp32 accumulate);
    kv_cache[out_cache_loc[m]] = [c_kv[m] ‖ bf16(rope(k_pe[m]))] (kv_cache is [num_slots, kv_lora + rope]
    bf16, the H200 default bf16 MLA pool). Rows not in out_cache_loc are untouched.
    """
    op = "D2 absorb_and_kv_store"
    c = cfg
    h, nope, r, kvl = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim, c.kv_lora_rank
    _check(op, "q_nope", q_nope, BF16, (None, h, nope))
    m = q_nope.shape[0]
    _check(op, "c_kv", c_kv, BF16, (m, kvl))
    _check(op, "k_pe", k_pe, BF16, (m, r))
    w_kc = w.w_kc
    if w_kc is None and getattr(w, "w_kc_fp8", None) is not None:  # the FP8 form (ref.fp8.w_kc_fp8_from_kv_b)
        _check(op, "w_kc_fp8", w.w_kc_fp8, torch.float8_e4m3fn, (h, nope, kvl))
        _check(op, "w_kc_scale", w.w_kc_scale, torch.float32, (h, nope, -(-kvl // 128)))
        w_kc = fp8.dequant_w_kc(w.w_kc_fp8, w.w_kc_scale)  # bitwise the bf16 w_kc of the same checkpoint
    _check(op, "w_kc", w_kc, BF16, (h, nope, kvl))
    _check(op, "positions", positions, shape=(m,), dtypes=_INDEX_DTYPES)
    _check(op, "kv_cache", kv_cache, BF16, (None, c.kv_cache_dim))
    _check_slots(op, "out_cache_loc", out_cache_loc, m, kv_cache.shape[0])
    q_lat = torch.einsum("mhn,hnl->mhl", q_nope.float(), w_kc.float()).to(BF16)
    cos, sin = _rope_cs(positions, c)
    k_pe_roped = apply_rope_interleaved(k_pe, cos, sin).to(BF16)
    kv_cache[out_cache_loc.long()] = torch.cat([c_kv, k_pe_roped], dim=-1)
    return q_lat


def d2_absorb_qcat(q_nope: torch.Tensor, c_kv: torch.Tensor, k_pe: torch.Tensor, w: AttnWeights,
                   positions: torch.Tensor, out_cache_loc: torch.Tensor, kv_cache: torch.Tensor, q_pe: torch.Tensor,
                   pool_loc: torch.Tensor, kv_pool: torch.Tensor, cfg: Glm5Config) -> torch.Tensor:
    """-> q_cat [M, H, kv_lora + rope] = [q_lat | q_pe] bf16; writes the latent-KV rows IN PLACE into kv_cache at
    out_cache_loc and into kv_pool at pool_loc (the same rows: d2_absorb_and_kv_store's)."""
    op = "D2 absorb_qcat"
    c = cfg
    h, r, kvl = c.num_attention_heads, c.qk_rope_head_dim, c.kv_lora_rank
    m = q_nope.shape[0]
    _check(op, "q_pe", q_pe, BF16, (m, h, r))
    _check(op, "kv_pool", kv_pool, BF16, (None, c.kv_cache_dim))
    _check_slots(op, "pool_loc", pool_loc, m, kv_pool.shape[0])
    q_lat = d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, positions, out_cache_loc, kv_cache, cfg)
    kv_pool[pool_loc.long()] = kv_cache[out_cache_loc.long()]
    return torch.cat([q_lat, q_pe], dim=-1)


# ---- E1: paged MQA indexer logits -------------------------------------------------------------------------

def _logical_to_pages(seq_lens: torch.Tensor, block_table: torch.Tensor, ctx: int
                      ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """For logical positions t < ctx of every row: (valid [M,ctx], page [M,ctx] (0 where invalid), t % 64 [ctx])."""
    t = torch.arange(ctx, device=block_table.device)
    valid = t[None, :] < seq_lens[:, None].long()
    col = (t // PAGE).clamp(max=max(block_table.shape[1] - 1, 0))
    page = block_table.long()[:, col] if block_table.shape[1] else torch.zeros_like(valid, dtype=torch.long)
    return valid, torch.where(valid, page, torch.zeros_like(page)), t % PAGE


def e1_indexer_logits(q_fp8: torch.Tensor, head_w: torch.Tensor, index_k_cache: torch.Tensor,
                      seq_lens: torch.Tensor, block_table: torch.Tensor, cfg: Glm5Config, *,
                      max_ctx: int | None = None) -> torch.Tensor:
    """-> logits [M, max_ctx] fp32, max_ctx = max(seq_lens) unless given (a fixed width, as a CUDA-graph
    caller passes it; it must cover every row); no 256-alignment padding, unlike DeepGEMM.

    logits[m, t] = s_k[t] * sum_h head_w[m, h] * ReLU(sum_d q8[m, h, d] * k8[t, d]) for t < seq_lens[m],
    where logical token t of row m lives at physical slot block_table[m, t // 64] * 64 + t % 64;
    -inf for t >= seq_lens[m]. fp8 products accumulate in fp32.
    """
    op = "E1 indexer_logits"
    c = cfg
    hi, d = c.index_n_heads, c.index_head_dim
    _check(op, "q_fp8", q_fp8, FP8, (None, hi, d))
    m = q_fp8.shape[0]
    _check(op, "head_w", head_w, torch.float32, (m, hi))
    _check(op, "index_k_cache", index_k_cache, torch.uint8, (None, fp8.index_k_page_bytes(d)))
    _check_block_table(op, seq_lens, block_table, m, index_k_cache.shape[0])
    longest = int(seq_lens.max()) if m else 0
    if max_ctx is not None and max_ctx < longest:
        raise _fail(op, f"max_ctx={max_ctx} is shorter than the longest row ({longest})")
    ctx = longest if max_ctx is None else max_ctx
    valid, page, row = _logical_to_pages(seq_lens, block_table, ctx)
    k8_pages, s_pages = fp8.index_k_cache_views(index_k_cache, d)
    # gather as bytes (fp8 advanced indexing is not supported on every backend), then reinterpret
    k = k8_pages.view(torch.uint8)[page, row[None, :]].view(FP8).float()  # [M, ctx, D]
    s_k = s_pages[page, row[None, :]]  # [M, ctx]
    dots = torch.einsum("mhd,mtd->mht", q_fp8.float(), k)
    logits = (dots.clamp_min(0) * head_w[:, :, None]).sum(1) * s_k
    return logits.masked_fill(~valid, float("-inf"))


# ---- E2: top-k + page-table transform ---------------------------------------------------------------------

def e2_topk(logits: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor, topk: int) -> torch.Tensor:
    """-> topk_slots [M, topk] int32: physical KV slots of the top-k logical positions, -1 padded.

    Row m selects among t < seq_lens[m] (every position when seq_lens[m] <= topk). Order, and the
    deterministic tie rule: entries sorted by descending logit, equal logits by ascending logical
    position (so on a tie the earlier token wins the last top-k place); -1 padding at the end.
    Slot of position t: block_table[m, t // 64] * 64 + t % 64.
    """
    op = "E2 topk"
    _check(op, "logits", logits, torch.float32, (None, None))
    m, ctx = logits.shape
    _check_block_table(op, seq_lens, block_table, m)
    if topk < 1:
        raise _fail(op, f"topk must be >= 1, got {topk}")
    if m and ctx < int(seq_lens.max()):
        raise _fail(op, f"logits has {ctx} columns but max(seq_lens) = {int(seq_lens.max())}")
    valid, page, row = _logical_to_pages(seq_lens, block_table, ctx)
    if bool(torch.isnan(logits[valid]).any()):
        raise _fail(op, "logits has NaN at a live position (unwritten or corrupted E1 output?)")
    # masked positions sort last; stable sort keeps ascending position among equal keys
    keyed = logits.masked_fill(~valid, float("-inf"))
    order = torch.sort(keyed, dim=1, descending=True, stable=True).indices[:, :topk]
    taken = torch.gather(valid, 1, order)
    slots = torch.gather(page, 1, order) * PAGE + order % PAGE
    slots = torch.where(taken, slots, torch.full_like(slots, -1)).to(torch.int32)
    if slots.shape[1] < topk:
        slots = torch.cat([slots, slots.new_full((m, topk - slots.shape[1]), -1)], dim=1)
    return slots


# ---- the whole prefix --------------------------------------------------------------------------------------

@dataclass
class PrefixOutputs:
    """What the sparse MLA core consumes, plus every named intermediate (graph tensor names)."""

    q_lat: torch.Tensor  # [M, H, kv_lora] bf16
    q_pe: torch.Tensor  # [M, H, rope] bf16, roped
    topk_slots: torch.Tensor  # [M, topk] int32 physical KV slots, -1 padded
    residual_out: torch.Tensor  # [M, hidden] bf16 (the residual for the rest of the layer)
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def attention_prefix(hidden: torch.Tensor, residual: torch.Tensor, positions: torch.Tensor,
                     out_cache_loc: torch.Tensor, seq_lens: torch.Tensor, block_table: torch.Tensor,
                     w: AttnWeights, cfg: Glm5Config, kv_cache: torch.Tensor,
                     index_k_cache: torch.Tensor | None = None, *, prev_topk: torch.Tensor | None = None,
                     layer: int | None = None, indexer_k_gemm: str = "fp8",
                     indexer_rotate: bool = False) -> PrefixOutputs:
    """One decode layer's attention prefix, op by op (A0, B0, C0, B1, D1, D0, D2, E1, E2).

    Inputs: hidden/residual [M, hidden] bf16 (the previous layer's output and residual), positions [M]
    (absolute), out_cache_loc [M] (physical slot of each new token, used by both caches), seq_lens [M]
    (KV length incl. the new token) and block_table [M, pages] (64-token pages) for the indexer.
    Caches updated in place: kv_cache [num_slots, kv_lora + rope] bf16 (D2) and, on full-indexer
    layers, index_k_cache [num_pages, 64 * (D_i + 4)] uint8 (B1, before E1 reads it).

    GLM-5.2 shared layers (w.indexer is None): C0/B1/D1/E1/E2 are skipped, index_k_cache is not
    touched, and prev_topk (the last full layer's top-k slots) is returned as topk_slots.
    indexer_rotate: B1 / D1 with rotate=True (SGLang 0.5.14's Hadamard-rotated index-K cache format).
    """
    op = "attention_prefix"
    full = w.indexer is not None
    if layer is not None and cfg.is_full_indexer_layer(layer) != full:
        raise _fail(op, f"layer {layer} is a {'full' if cfg.is_full_indexer_layer(layer) else 'shared'}-indexer "
                        f"layer per cfg, but the weights {'have' if full else 'lack'} indexer weights")
    if not full and prev_topk is None:
        raise _fail(op, "shared-indexer layer (no indexer weights) needs prev_topk from the last full layer")
    if full and index_k_cache is None:
        raise _fail(op, "full-indexer layer needs index_k_cache")

    t: dict[str, torch.Tensor] = {}
    t["x_bf16"], t["residual_out"], t["x_fp8"], t["x_scale"] = a0_add_rmsnorm_quant(
        hidden, residual, w.input_norm, cfg.rms_norm_eps)
    t.update(b0_qkv_a(t["x_fp8"], t["x_scale"], w, cfg))
    if full:
        idx = w.indexer
        t["w_raw"] = c0_head_gate(t["x_bf16"], idx.weights_proj)
        t["index_k_fp8"], t["index_k_scale"] = b1_indexer_k(
            t["x_bf16"], t["x_fp8"], t["x_scale"], idx, positions, out_cache_loc, index_k_cache, cfg, gemm=indexer_k_gemm,
            rotate=indexer_rotate)
        t["index_q_fp8"], t["index_q_scale"], t["head_w"] = d1_indexer_q(
            t["q_lora_fp8"], t["q_lora_scale"], t["w_raw"], idx, positions, cfg, rotate=indexer_rotate)
    t["q_nope"], t["q_pe"] = d0_q_b(t["q_lora_fp8"], t["q_lora_scale"], w, positions, cfg)
    t["q_lat"] = d2_absorb_and_kv_store(t["q_nope"], t["c_kv"], t["k_pe"], w, positions, out_cache_loc, kv_cache, cfg)
    if full:
        t["logits"] = e1_indexer_logits(t["index_q_fp8"], t["head_w"], index_k_cache, seq_lens, block_table, cfg)
        t["topk_slots"] = e2_topk(t["logits"], seq_lens, block_table, cfg.index_topk)
    else:
        _check(op, "prev_topk", prev_topk, torch.int32, (hidden.shape[0], cfg.index_topk))
        t["topk_slots"] = prev_topk
    return PrefixOutputs(q_lat=t["q_lat"], q_pe=t["q_pe"], topk_slots=t["topk_slots"],
                         residual_out=t["residual_out"], tensors=t)
