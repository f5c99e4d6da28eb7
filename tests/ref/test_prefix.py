"""Attention-prefix reference ops vs independent float64 formulations (spec/glm5_layer.md sections 3-5).

The float64 side takes a different code path from glm5_fastpath.ref.prefix: dequantization by
explicit scale expansion (kron), RoPE with complex numbers, norms from the formula, cache bytes
addressed by hand, top-k by a Python sort. Real GLM-5 dims and the small preset, M in (1, 3, 16, 37),
context lengths that are not multiples of 64, shuffled page tables, poisoned caches.
"""
from __future__ import annotations

import dataclasses
import os

import pytest
import torch

from glm5_fastpath.config import Glm5Config, small_config
from glm5_fastpath.ref import fp8
from glm5_fastpath.ref import prefix as P
from glm5_fastpath.testing.numerics import assert_close, assert_equal, assert_no_poison, assert_topk_sets, poison_
from glm5_fastpath.weights import AttnWeights, random_layer

BF16, F64, FP8 = torch.bfloat16, torch.float64, torch.float8_e4m3fn
PAGE = 64
MS = (1, 3, 16, 37)

# real dims cost more than 5 s only where E1 gathers long contexts or the weights get generated
CASES = [pytest.param("small", m, id=f"small-M{m}") for m in MS] + \
        [pytest.param("glm5", m, id=f"glm5-M{m}", marks=pytest.mark.slow) for m in MS]


# ---- weights: one random layer per preset per module, float64 dequantized copies made lazily ----------------

_SESSION_SEED = int(os.environ.get("GLM5_FASTPATH_TEST_SEED", torch.seed() % (2**31)))
_LAYERS: dict[str, tuple] = {}
_W64: dict[tuple[str, str], torch.Tensor] = {}


def _cfg(preset: str) -> Glm5Config:
    return small_config() if preset == "small" else Glm5Config.preset(preset)


def spiced(w: AttnWeights) -> AttnWeights:
    """Norm gains spread over [0.25, 2] and a k_norm bias of std 0.5: the checkpoint-like ~1 / ~0 values
    would let a dropped gain or bias hide inside the fp8 tolerance."""
    def gain(t):
        return (0.25 + 1.75 * torch.rand(t.shape)).to(t.dtype)
    idx = dataclasses.replace(w.indexer, k_norm_weight=gain(w.indexer.k_norm_weight),
                              k_norm_bias=0.5 * torch.randn(w.indexer.k_norm_bias.shape))
    return dataclasses.replace(w, input_norm=gain(w.input_norm), q_a_norm=gain(w.q_a_norm),
                               kv_a_norm=gain(w.kv_a_norm), indexer=idx)


def layer(preset: str):
    """(cfg, AttnWeights) of a MoE layer (experts lazy, so real dims stay cheap), norms spiced."""
    if preset not in _LAYERS:
        cfg = _cfg(preset)
        print(f"weights seed={_SESSION_SEED}")
        torch.manual_seed(_SESSION_SEED)
        _LAYERS[preset] = (cfg, spiced(random_layer(cfg, cfg.first_k_dense_replace, seed=_SESSION_SEED).attn))
    return _LAYERS[preset]


def deq_w64(preset: str, name: str, lin) -> torch.Tensor:
    """W8 * S with S expanded by a Kronecker product (not fp8.dequant_weight_block's repeat_interleave)."""
    key = (preset, name)
    if key not in _W64:
        n, k = lin.weight.shape
        s = torch.kron(lin.scale_inv.double(), torch.ones(128, 128, dtype=F64))[:n, :k]
        _W64[key] = lin.weight.double() * s
    return _W64[key]


# ---- float64 formulations --------------------------------------------------------------------------------

def deq_act64(x8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x8.double() * torch.kron(s.double(), torch.ones(1, 128, dtype=F64))


def rms64(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    return x / torch.sqrt((x * x).sum(-1, keepdim=True) / x.shape[-1] + eps) * w.double()


def layernorm64(x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, eps: float) -> torch.Tensor:
    x = x.double()
    mu = x.sum(-1, keepdim=True) / x.shape[-1]
    var = ((x - mu) ** 2).sum(-1, keepdim=True) / x.shape[-1]
    return (x - mu) / torch.sqrt(var + eps) * w.double() + b.double()


def rope64(x: torch.Tensor, positions: torch.Tensor, theta: float) -> torch.Tensor:
    """GPT-J RoPE as a complex rotation: pair (2i, 2i+1) = a + ib times exp(i * pos * theta^(-2i/d))."""
    x = x.double()
    d = x.shape[-1]
    z = torch.complex(x[..., 0::2], x[..., 1::2])
    freq = torch.tensor([theta ** (-2.0 * i / d) for i in range(d // 2)], dtype=F64)
    ang = positions.double()[:, None] * freq[None, :]
    rot = torch.polar(torch.ones_like(ang), ang).reshape(ang.shape[0], *([1] * (x.dim() - 2)), d // 2)
    zr = z * rot
    return torch.stack([zr.real, zr.imag], dim=-1).reshape(x.shape)


def fp8_row_deq(x8: torch.Tensor, s: torch.Tensor) -> torch.Tensor:
    return x8.double() * s.double()[..., None]


# ---- decode batch / cache builders ------------------------------------------------------------------------

def ctx_range(cfg: Glm5Config) -> tuple[int, int]:
    """Context lengths straddling index_topk (some rows take every token, others select)."""
    return (max(2, cfg.index_topk // 2), cfg.index_topk * 2 if cfg.index_topk <= 64 else cfg.index_topk + 1500)


def make_batch(cfg: Glm5Config, m: int, shared_kv: bool = False, lens: list[int] | None = None):
    """seq_lens (never multiples of 64), a shuffled block table (non-contiguous pages, unused entries
    point far outside the cache), positions = seq_len - 1 and out_cache_loc = that token's slot."""
    lo, hi = ctx_range(cfg)
    if lens is None:
        if shared_kv:  # consecutive tokens of one sequence; its KV length is not a multiple of 64
            end = int(torch.randint(lo + m, hi, ()))
            end += end % PAGE == 0
            lens = [end - m + 1 + i for i in range(m)]
        else:
            lens = [s + 1 if s % PAGE == 0 else s for s in torch.randint(lo, hi, (m,)).tolist()]
    n_rows = 1 if shared_kv else m
    row_lens = [max(lens)] if shared_kv else lens
    pages_per_row = [-(-s // PAGE) for s in row_lens]
    width = max(pages_per_row) + 2
    num_pages = sum(pages_per_row) + 5
    perm = torch.randperm(num_pages).tolist()
    table = torch.full((n_rows, width), 10**6, dtype=torch.int32)  # never-valid page ids past the live pages
    nxt = 0
    for r, n in enumerate(pages_per_row):
        table[r, :n] = torch.tensor(perm[nxt:nxt + n], dtype=torch.int32)
        nxt += n
    if shared_kv:
        table = table.expand(m, width).contiguous()
    seq_lens = torch.tensor(lens, dtype=torch.int32)
    positions = (seq_lens - 1).long()
    slots = [int(table[i, (s - 1) // PAGE]) * PAGE + (s - 1) % PAGE for i, s in enumerate(lens)]
    return dict(seq_lens=seq_lens, block_table=table, positions=positions,
                out_cache_loc=torch.tensor(slots, dtype=torch.int64), num_pages=num_pages)


def random_index_k_cache(cfg: Glm5Config, num_pages: int) -> torch.Tensor:
    """A cache whose every slot holds a valid quantized key (varied scales)."""
    d = cfg.index_head_dim
    cache = fp8.new_index_k_cache(num_pages, d)
    k = torch.randn(num_pages * PAGE, d) * torch.rand(num_pages * PAGE, 1) * 3
    k8, s = fp8.quant_per_row(k.to(BF16))
    fp8.index_k_cache_store(cache, torch.arange(num_pages * PAGE), k8, s)
    return cache


def index_k_bytes_of_slot(cfg: Glm5Config, slot: int) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
    """(page, first byte, end byte) of the fp8 row and of the fp32 scale of one slot, by the page layout."""
    d, page, off = cfg.index_head_dim, slot // PAGE, slot % PAGE
    return (page, off * d, off * d + d), (page, PAGE * d + off * 4, PAGE * d + off * 4 + 4)


def read_index_k64(cfg: Glm5Config, cache: torch.Tensor, slots: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """Keys and scales of slots in float64, addressed by flat byte offsets."""
    d, pb = cfg.index_head_dim, cache.shape[1]
    sl = torch.tensor(slots, dtype=torch.int64)
    base = (sl // PAGE) * pb
    kidx = base[:, None] + (sl % PAGE)[:, None] * d + torch.arange(d)[None, :]
    sidx = base[:, None] + PAGE * d + (sl % PAGE)[:, None] * 4 + torch.arange(4)[None, :]
    flat = cache.reshape(-1)
    k = flat[kidx].contiguous().view(FP8).double()
    s = flat[sidx].contiguous().view(torch.float32).reshape(-1).double()
    return k, s


def logical_slots(table_row: list[int], n: int) -> list[int]:
    return [table_row[t // PAGE] * PAGE + t % PAGE for t in range(n)]


def q_lora_inputs(cfg: Glm5Config, m: int):
    q_lora = (torch.randn(m, cfg.q_lora_rank) * (1 + torch.rand(m, 1))).to(BF16)
    return fp8.quant_act_per_token(q_lora)


def x_inputs(cfg: Glm5Config, m: int):
    x = (torch.randn(m, cfg.hidden_size) * (0.5 + torch.rand(m, 1))).to(BF16)
    x8, xs = fp8.quant_act_per_token(x)
    return x, x8, xs


# ---- A0 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_a0_add_rmsnorm_quant(preset, m, seed):
    cfg, w = layer(preset)
    h = cfg.hidden_size
    hidden = (torch.randn(m, h) * 2).to(BF16)
    residual = (torch.randn(m, h) * 5).to(BF16)
    x, r, x8, xs = P.a0_add_rmsnorm_quant(hidden, residual, w.input_norm, cfg.rms_norm_eps)
    r64 = hidden.double() + residual.double()
    x64 = rms64(r64, w.input_norm, cfg.rms_norm_eps)
    assert x.dtype == BF16 and r.dtype == BF16 and x8.dtype == FP8 and xs.shape == (m, h // 128)
    assert_close("A0 residual_out", r, r64, kind="bf16")
    assert_close("A0 x_bf16", x, x64, kind="bf16")
    assert_close("A0 x_fp8 (dequant)", deq_act64(x8, xs), x64, kind="fp8_vs_exact")
    amax = x.double().reshape(m, -1, 128).abs().amax(-1)
    assert_close("A0 x_scale", xs, amax / 448.0, kind="fp32")


# ---- B0 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_b0_qkv_a(preset, m, seed):
    cfg, w = layer(preset)
    _, x8, xs = x_inputs(cfg, m)
    out = P.b0_qkv_a(x8, xs, w, cfg)
    qe, kve = cfg.q_lora_rank, cfg.q_lora_rank + cfg.kv_lora_rank
    c64 = deq_act64(x8, xs) @ deq_w64(preset, "qkv_a", w.qkv_a).t()
    q64 = rms64(c64[:, :qe], w.q_a_norm, cfg.rms_norm_eps)
    ckv64 = rms64(c64[:, qe:kve], w.kv_a_norm, cfg.rms_norm_eps)
    assert_close("B0 q_lora", out["q_lora"], q64, kind="bf16_chain")
    assert_close("B0 c_kv", out["c_kv"], ckv64, kind="bf16_chain")
    assert_close("B0 k_pe (raw, not normalized)", out["k_pe"], c64[:, kve:], kind="bf16")
    assert_close("B0 q_lora_fp8 (dequant)", deq_act64(out["q_lora_fp8"], out["q_lora_scale"]), q64, kind="fp8_vs_exact")
    amax = out["q_lora"].double().reshape(m, -1, 128).abs().amax(-1)
    assert_close("B0 q_lora_scale", out["q_lora_scale"], amax / 448.0, kind="fp32")
    assert all(out[k].dtype == BF16 for k in ("q_lora", "c_kv", "k_pe"))


# ---- C0 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_c0_head_gate(preset, m, seed):
    cfg, w = layer(preset)
    x, _, _ = x_inputs(cfg, m)
    w_raw = P.c0_head_gate(x, w.indexer.weights_proj)
    assert w_raw.dtype == BF16 and w_raw.shape == (m, cfg.index_n_heads)
    assert_close("C0 w_raw", w_raw, x.double() @ w.indexer.weights_proj.double().t(), kind="bf16")


# ---- B1 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("gemm", ["fp8", "bf16"])
@pytest.mark.parametrize("preset,m", CASES)
def test_b1_indexer_k(preset, m, gemm, seed):
    cfg, w = layer(preset)
    idx, d = w.indexer, cfg.index_head_dim
    x, x8, xs = x_inputs(cfg, m)
    b = make_batch(cfg, m)
    cache = poison_(fp8.new_index_k_cache(b["num_pages"], d))
    before = cache.clone()
    k8, s = P.b1_indexer_k(x, x8, xs, idx, b["positions"], b["out_cache_loc"], cache, cfg, gemm=gemm)

    wk64 = deq_w64(preset, "wk", idx.wk)
    if gemm == "fp8":
        key64 = deq_act64(x8, xs) @ wk64.t()
    else:  # SGLang: bf16 x times wk dequantized to bf16 at load
        key64 = x.double() @ wk64.to(BF16).double().t()
    k64 = layernorm64(key64, idx.k_norm_weight, idx.k_norm_bias, 1e-6)
    r = cfg.qk_rope_head_dim
    k64 = torch.cat([rope64(k64[:, :r], b["positions"], cfg.rope_theta), k64[:, r:]], dim=-1)
    assert k8.dtype == FP8 and k8.shape == (m, d) and s.shape == (m,)
    assert_close("B1 k (dequant)", fp8_row_deq(k8, s), k64, kind="fp8_vs_exact")
    assert_close("B1 k_scale", s, k64.abs().amax(-1).clamp_min(1e-4) / 448.0, kind="bf16")

    # exactly the slot bytes of the new tokens changed, holding k8 / s; all other bytes still poison
    written = torch.zeros_like(cache, dtype=torch.bool)
    for i, slot in enumerate(b["out_cache_loc"].tolist()):
        (pg, a, e), (pg2, sa, se) = index_k_bytes_of_slot(cfg, slot)
        assert_equal("B1 cache fp8 row", cache[pg, a:e], k8[i].view(torch.uint8), context=f"slot {slot}")
        assert_equal("B1 cache scale", cache[pg2, sa:se], s[i:i + 1].view(torch.uint8), context=f"slot {slot}")
        written[pg, a:e] = True
        written[pg2, sa:se] = True
    assert_equal("B1 untouched cache bytes", cache[~written], before[~written])


# ---- D1 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_d1_indexer_q(preset, m, seed):
    cfg, w = layer(preset)
    idx, hi, d, r = w.indexer, cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    ql8, qls = q_lora_inputs(cfg, m)
    w_raw = torch.randn(m, hi).to(BF16)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,))
    q8, s_q, head_w = P.d1_indexer_q(ql8, qls, w_raw, idx, positions, cfg)

    q64 = (deq_act64(ql8, qls) @ deq_w64(preset, "wq_b", idx.wq_b).t()).view(m, hi, d)
    q64 = torch.cat([rope64(q64[..., :r], positions, cfg.rope_theta), q64[..., r:]], dim=-1)
    s64 = q64.abs().amax(-1).clamp_min(1e-4) / 448.0
    assert q8.dtype == FP8 and q8.shape == (m, hi, d) and head_w.dtype == torch.float32
    assert_close("D1 q (dequant)", fp8_row_deq(q8, s_q), q64, kind="fp8_vs_exact")
    assert_close("D1 q_scale", s_q, s64, kind="bf16")
    assert_close("D1 head_w", head_w, w_raw.double() * hi ** -0.5 * d ** -0.5 * s64, kind="bf16")


# ---- B1 / D1 with the Hadamard rotation (SGLang 0.5.14's indexer) -------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_b1_indexer_k_rotated(preset, m, seed):
    """rotate=True: the stored key is bf16(fwht(k)) of the unrotated path's bf16 k (after RoPE), then quantised:
    exactly, given the same bf16 k (reconstructed here from the float64 reference), and the cache bytes
    change only at the new tokens' slots."""
    from glm5_fastpath.ref.hadamard import fwht, hadamard_matrix

    cfg, w = layer(preset)
    idx, d = w.indexer, cfg.index_head_dim
    x, x8, xs = x_inputs(cfg, m)
    b = make_batch(cfg, m)
    cache = poison_(fp8.new_index_k_cache(b["num_pages"], d))
    cache0 = poison_(fp8.new_index_k_cache(b["num_pages"], d))
    before = cache.clone()
    k8, s = P.b1_indexer_k(x, x8, xs, idx, b["positions"], b["out_cache_loc"], cache, cfg, rotate=True)
    k8u, su = P.b1_indexer_k(x, x8, xs, idx, b["positions"], b["out_cache_loc"], cache0, cfg)
    # the same bf16 k the epilogue rotates: recompute it as the reference does, then rotate / quantise
    key = P._fp8_gemm_bf16(x8, xs, idx.wk)
    kf = key.float()
    mean = kf.mean(-1, keepdim=True)
    k = (kf - mean) * torch.rsqrt((kf - mean).pow(2).mean(-1, keepdim=True) + 1e-6) * idx.k_norm_weight + idx.k_norm_bias
    r = cfg.qk_rope_head_dim
    from glm5_fastpath.ref.rope import apply_rope_interleaved, rope_cos_sin
    cos, sin = rope_cos_sin(b["positions"], r, cfg.rope_theta)
    k = torch.cat([apply_rope_interleaved(k[:, :r], cos, sin), k[:, r:]], -1).to(BF16)
    want8, want_s = fp8.quant_per_row(fwht(k).to(BF16))
    assert_equal("B1 rotated k8", k8.view(torch.uint8), want8.view(torch.uint8))
    assert_equal("B1 rotated scale", s, want_s)
    # the rotation is orthonormal: un-rotating the stored key gives the unrotated key (FP8 noise)
    h = hadamard_matrix(d)
    assert_close("B1 rotated k un-rotated", fp8_row_deq(k8, s) @ h, fp8_row_deq(k8u, su), kind="fp8_vs_exact")
    written = torch.zeros_like(cache, dtype=torch.bool)
    for i, slot in enumerate(b["out_cache_loc"].tolist()):
        (pg, a, e), (pg2, sa, se) = index_k_bytes_of_slot(cfg, slot)
        assert_equal("B1 rotated cache row", cache[pg, a:e], k8[i].view(torch.uint8), context=f"slot {slot}")
        assert_equal("B1 rotated cache scale", cache[pg2, sa:se], s[i:i + 1].view(torch.uint8))
        written[pg, a:e] = True
        written[pg2, sa:se] = True
    assert_equal("B1 rotated untouched cache bytes", cache[~written], before[~written])


@pytest.mark.parametrize("preset,m", CASES)
def test_d1_indexer_q_rotated(preset, m, seed):
    """rotate=True: per (token, head) the fp32 q after RoPE is rotated (no bf16 rounding) and quantised; head_w
    carries the rotated q's scale."""
    from glm5_fastpath.ref.hadamard import fwht, hadamard_matrix

    cfg, w = layer(preset)
    idx, hi, d, r = w.indexer, cfg.index_n_heads, cfg.index_head_dim, cfg.qk_rope_head_dim
    ql8, qls = q_lora_inputs(cfg, m)
    w_raw = torch.randn(m, hi).to(BF16)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,))
    q8, s_q, head_w = P.d1_indexer_q(ql8, qls, w_raw, idx, positions, cfg, rotate=True)
    q = P._fp8_gemm_bf16(ql8, qls, idx.wq_b).view(m, hi, d)
    from glm5_fastpath.ref.rope import apply_rope_interleaved, rope_cos_sin
    cos, sin = rope_cos_sin(positions, r, cfg.rope_theta)
    qf = torch.cat([apply_rope_interleaved(q[..., :r], cos, sin), q[..., r:].float()], -1)
    want8, want_s = fp8.quant_per_row(fwht(qf))
    assert_equal("D1 rotated q8", q8.view(torch.uint8), want8.view(torch.uint8))
    assert_equal("D1 rotated scale", s_q, want_s)
    assert_equal("D1 rotated head_w", head_w, w_raw.float() * cfg.index_weight_scale * s_q)
    q64 = (deq_act64(ql8, qls) @ deq_w64(preset, "wq_b", idx.wq_b).t()).view(m, hi, d)
    q64 = torch.cat([rope64(q64[..., :r], positions, cfg.rope_theta), q64[..., r:]], dim=-1)
    assert_close("D1 rotated q (dequant)", fp8_row_deq(q8, s_q), q64 @ hadamard_matrix(d), kind="fp8_vs_exact")


def test_rotation_preserves_indexer_logits_and_topk(seed):
    """E1 needs no change: logits of (rotated q, rotated k cache) equal those of (q, k) up to FP8 noise, so the
    top-k sets agree but at the selection boundary."""
    cfg, w = layer("small")
    m = 16
    case = prefix_case(cfg, m)
    case_r = {k: (v.clone() if isinstance(v, torch.Tensor) else v) for k, v in case.items()}
    out = P.attention_prefix(**case, w=w, cfg=cfg, layer=cfg.first_k_dense_replace)
    out_r = P.attention_prefix(**case_r, w=w, cfg=cfg, layer=cfg.first_k_dense_replace, indexer_rotate=True)
    for name in ("q_lat", "q_pe", "residual_out"):  # the indexer's format touches nothing else
        assert_equal(f"rotated prefix {name}", getattr(out_r, name), getattr(out, name))
    assert_equal("rotated prefix kv_cache", case_r["kv_cache"], case["kv_cache"])
    assert not torch.equal(out_r.tensors["index_q_fp8"].view(torch.uint8), out.tensors["index_q_fp8"].view(torch.uint8))
    # old cache entries were written unrotated by prefix_case: compare on the new tokens' own keys only,
    # plus a fully rotated cache below
    lg, lgr = out.tensors["logits"], out_r.tensors["logits"]
    own = (case["seq_lens"].long() - 1)[:, None]
    # 16 single-key logits, each side quantized differently (rotated vs plain q and k): two-sided FP8 noise
    # (worst of 60 seeds: 0.113; it failed 7 of 30 seeds against the one-sided fp8_vs_exact bound)
    assert_close("logit at own position", lgr.gather(1, own), lg.gather(1, own), kind="fp8_vs_fp8")
    # a cache that is rotated everywhere (what SGLang 0.5.14's prefill writes): the whole logits row
    from glm5_fastpath.ref.hadamard import fwht
    d = cfg.index_head_dim
    npg = case["index_k_cache"].shape[0]
    k8, ks = fp8.index_k_cache_load(case["index_k_cache"], torch.arange(npg * PAGE), d)
    rk8, rks = fp8.quant_per_row(fwht(k8.float() * ks[:, None]).to(BF16))
    rot_cache = fp8.new_index_k_cache(npg, d)
    fp8.index_k_cache_store(rot_cache, torch.arange(npg * PAGE), rk8, rks)
    lg_all = P.e1_indexer_logits(out_r.tensors["index_q_fp8"], out_r.tensors["head_w"], rot_cache,
                                 case["seq_lens"], case["block_table"], cfg)
    valid = torch.isfinite(lg)
    assert torch.equal(valid, torch.isfinite(lg_all))
    assert_close("rotated logits", lg_all[valid], lg[valid], kind="fp8_vs_exact")
    topk_r = P.e2_topk(lg_all, case["seq_lens"], case["block_table"], cfg.index_topk)
    assert_topk_sets("rotated topk", topk_r, out.topk_slots, min_overlap=0.9)


def test_rotate_argument_validation(seed):
    cfg, w = layer("small")
    _, x8, xs = x_inputs(cfg, 2)
    b = make_batch(cfg, 2)
    cache = fp8.new_index_k_cache(b["num_pages"], cfg.index_head_dim)
    with pytest.raises(P.PrefixInputError, match="rotate must be a bool"):
        P.b1_indexer_k(None, x8, xs, w.indexer, b["positions"], b["out_cache_loc"], cache, cfg, rotate=1)
    ql8, qls = q_lora_inputs(cfg, 2)
    with pytest.raises(P.PrefixInputError, match="rotate must be a bool"):
        P.d1_indexer_q(ql8, qls, torch.zeros(2, cfg.index_n_heads, dtype=BF16), w.indexer, b["positions"], cfg,
                       rotate="yes")


# ---- D0 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_d0_q_b(preset, m, seed):
    cfg, w = layer(preset)
    nh, nope = cfg.num_attention_heads, cfg.qk_nope_head_dim
    ql8, qls = q_lora_inputs(cfg, m)
    positions = torch.randint(0, cfg.max_position_embeddings, (m,))
    q_nope, q_pe = P.d0_q_b(ql8, qls, w, positions, cfg)
    q64 = (deq_act64(ql8, qls) @ deq_w64(preset, "q_b", w.q_b).t()).view(m, nh, cfg.qk_head_dim)
    assert q_nope.dtype == BF16 and q_pe.dtype == BF16
    assert_close("D0 q_nope", q_nope, q64[..., :nope], kind="bf16")
    assert_close("D0 q_pe (roped, trailing dims)", q_pe, rope64(q64[..., nope:], positions, cfg.rope_theta), kind="bf16_chain")


# ---- D2 -------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("preset,m", CASES)
def test_d2_absorb_and_kv_store(preset, m, seed):
    cfg, w = layer(preset)
    nh, nope, kvl, r = cfg.num_attention_heads, cfg.qk_nope_head_dim, cfg.kv_lora_rank, cfg.qk_rope_head_dim
    q_nope = torch.randn(m, nh, nope).to(BF16)
    c_kv = torch.randn(m, kvl).to(BF16)
    k_pe = (torch.randn(m, r) * 3).to(BF16)
    b = make_batch(cfg, m)
    kv = poison_(torch.empty(b["num_pages"] * PAGE, cfg.kv_cache_dim, dtype=BF16))
    before = kv.clone()
    q_lat = P.d2_absorb_and_kv_store(q_nope, c_kv, k_pe, w, b["positions"], b["out_cache_loc"], kv, cfg)

    q_lat64 = torch.stack([q_nope[:, h].double() @ w.w_kc[h].double() for h in range(nh)], dim=1)
    assert q_lat.dtype == BF16 and q_lat.shape == (m, nh, kvl)
    assert_close("D2 q_lat", q_lat, q_lat64, kind="bf16")
    slots = b["out_cache_loc"]
    rows = kv[slots]
    assert_no_poison("D2 kv rows", rows)
    assert_equal("D2 kv c_kv part", rows[:, :kvl], c_kv)
    assert_close("D2 kv k_pe part (roped)", rows[:, kvl:], rope64(k_pe, b["positions"], cfg.rope_theta), kind="bf16")
    untouched = torch.ones(kv.shape[0], dtype=torch.bool)
    untouched[slots] = False
    assert_equal("D2 untouched kv rows", kv[untouched].view(torch.int16), before[untouched].view(torch.int16))


# ---- E1 -------------------------------------------------------------------------------------------------

def e1_inputs(cfg: Glm5Config, m: int, shared_kv: bool):
    hi, d = cfg.index_n_heads, cfg.index_head_dim
    b = make_batch(cfg, m, shared_kv=shared_kv)
    cache = random_index_k_cache(cfg, b["num_pages"])
    q8, _ = fp8.quant_per_row((torch.randn(m, hi, d) * 2).to(BF16))
    head_w = torch.randn(m, hi) * 0.01
    return b, cache, q8, head_w


def e1_ref64(cfg, q8, head_w, cache, seq_lens, table) -> tuple[torch.Tensor, torch.Tensor]:
    m, ctx = q8.shape[0], int(seq_lens.max())
    out = torch.zeros(m, ctx, dtype=F64)
    valid = torch.zeros(m, ctx, dtype=torch.bool)
    for i in range(m):
        n = int(seq_lens[i])
        k64, s64 = read_index_k64(cfg, cache, logical_slots(table[i].tolist(), n))
        dots = q8[i].double() @ k64.t()  # [H, n]
        out[i, :n] = s64 * (head_w[i].double()[:, None] * dots.clamp_min(0)).sum(0)
        valid[i, :n] = True
    return out, valid


@pytest.mark.parametrize("shared_kv", [False, True], ids=["indep", "shared_kv"])
@pytest.mark.parametrize("preset,m", CASES)
def test_e1_indexer_logits(preset, m, shared_kv, seed):
    cfg, _ = layer(preset)
    b, cache, q8, head_w = e1_inputs(cfg, m, shared_kv)
    logits = P.e1_indexer_logits(q8, head_w, cache, b["seq_lens"], b["block_table"], cfg)
    ref, valid = e1_ref64(cfg, q8, head_w, cache, b["seq_lens"], b["block_table"])
    assert logits.dtype == torch.float32 and logits.shape == ref.shape == (m, int(b["seq_lens"].max()))
    assert_close("E1 logits", logits[valid], ref[valid], kind="fp32")
    assert_equal("E1 -inf beyond seq_len", torch.isneginf(logits), ~valid)


# ---- E2 -------------------------------------------------------------------------------------------------

def e2_ref(logits: torch.Tensor, seq_lens: torch.Tensor, table: torch.Tensor, topk: int) -> torch.Tensor:
    """Python sort by (descending logit, ascending position), then page translation, -1 padded."""
    out = torch.full((logits.shape[0], topk), -1, dtype=torch.int32)
    for i in range(logits.shape[0]):
        n = int(seq_lens[i])
        row = logits[i, :n].tolist()
        best = sorted(range(n), key=lambda t: (-row[t], t))[:topk]
        slots = logical_slots(table[i].tolist(), n)
        out[i, :len(best)] = torch.tensor([slots[t] for t in best], dtype=torch.int32)
    return out


def masked_logits(values: torch.Tensor, seq_lens: torch.Tensor) -> torch.Tensor:
    t = torch.arange(values.shape[1])
    return values.float().masked_fill(t[None, :] >= seq_lens[:, None], float("-inf"))


@pytest.mark.parametrize("preset,m", CASES)
def test_e2_topk(preset, m, seed):
    cfg, _ = layer(preset)
    b = make_batch(cfg, m)
    logits = masked_logits(torch.randn(m, int(b["seq_lens"].max())), b["seq_lens"])
    out = P.e2_topk(logits, b["seq_lens"], b["block_table"], cfg.index_topk)
    ref = e2_ref(logits, b["seq_lens"], b["block_table"], cfg.index_topk)
    assert out.dtype == torch.int32 and out.shape == (m, cfg.index_topk)
    assert_topk_sets("E2 topk_slots", out, ref, min_overlap=1.0)
    assert_equal("E2 topk_slots (documented order)", out, ref)


@pytest.mark.parametrize("preset", ["small", pytest.param("glm5", marks=pytest.mark.slow)])
def test_e2_ties_and_short_contexts(preset, seed):
    """Few distinct logit values (many ties at the cut) and rows with ctx <= topk (every token, -1 padding)."""
    cfg, _ = layer(preset)
    k = cfg.index_topk
    lens = [k + 37, 2 * k + 5, k, k - 1, 1, 5]
    b = make_batch(cfg, len(lens), lens=lens)
    logits = masked_logits(torch.randint(0, 3, (len(lens), max(lens))), b["seq_lens"])
    out = P.e2_topk(logits, b["seq_lens"], b["block_table"], k)
    ref = e2_ref(logits, b["seq_lens"], b["block_table"], k)
    assert_equal("E2 ties / short ctx", out, ref)
    assert_topk_sets("E2 ties / short ctx", out, ref, min_overlap=1.0)
    for i, n in enumerate(lens):
        taken = int((out[i] >= 0).sum())
        assert taken == min(n, k), f"row {i}: seq_len {n} took {taken} tokens"
        assert bool((out[i, taken:] == -1).all()), f"row {i}: padding is not -1"
        if n <= k:  # every live token, each exactly once
            want = sorted(logical_slots(b["block_table"][i].tolist(), n))
            assert sorted(out[i, :taken].tolist()) == want, f"row {i}: not every token taken"


# ---- the whole prefix ------------------------------------------------------------------------------------

def prefix_case(cfg: Glm5Config, m: int, shared_kv: bool = False):
    b = make_batch(cfg, m, shared_kv=shared_kv)
    idx_cache = random_index_k_cache(cfg, b["num_pages"])
    for slot in b["out_cache_loc"].tolist():  # the new tokens' slots hold garbage until B1 writes them
        (pg, a, e), (pg2, sa, se) = index_k_bytes_of_slot(cfg, slot)
        idx_cache[pg, a:e] = 0xFF
        idx_cache[pg2, sa:se] = 0xFF
    kv = torch.randn(b["num_pages"] * PAGE, cfg.kv_cache_dim).to(BF16)
    h = cfg.hidden_size
    return dict(hidden=torch.randn(m, h).to(BF16), residual=(torch.randn(m, h) * 4).to(BF16),
                positions=b["positions"], out_cache_loc=b["out_cache_loc"], seq_lens=b["seq_lens"],
                block_table=b["block_table"], kv_cache=kv, index_k_cache=idx_cache)


@pytest.mark.parametrize("preset,m", [pytest.param("small", 3), pytest.param("small", 16),
                                      pytest.param("glm5", 16, marks=pytest.mark.slow)])
def test_attention_prefix_is_the_ops_in_order(preset, m, seed):
    cfg, w = layer(preset)
    case = prefix_case(cfg, m, shared_kv=(m == 16))
    manual_kv, manual_idx = case["kv_cache"].clone(), case["index_k_cache"].clone()
    out = P.attention_prefix(**case, w=w, cfg=cfg, layer=cfg.first_k_dense_replace)

    x, r, x8, xs = P.a0_add_rmsnorm_quant(case["hidden"], case["residual"], w.input_norm, cfg.rms_norm_eps)
    b0 = P.b0_qkv_a(x8, xs, w, cfg)
    w_raw = P.c0_head_gate(x, w.indexer.weights_proj)
    P.b1_indexer_k(x, x8, xs, w.indexer, case["positions"], case["out_cache_loc"], manual_idx, cfg)
    q8, _, head_w = P.d1_indexer_q(b0["q_lora_fp8"], b0["q_lora_scale"], w_raw, w.indexer, case["positions"], cfg)
    q_nope, q_pe = P.d0_q_b(b0["q_lora_fp8"], b0["q_lora_scale"], w, case["positions"], cfg)
    q_lat = P.d2_absorb_and_kv_store(q_nope, b0["c_kv"], b0["k_pe"], w, case["positions"], case["out_cache_loc"], manual_kv, cfg)
    logits = P.e1_indexer_logits(q8, head_w, manual_idx, case["seq_lens"], case["block_table"], cfg)
    topk = P.e2_topk(logits, case["seq_lens"], case["block_table"], cfg.index_topk)

    for name, got, want in (("q_lat", out.q_lat, q_lat), ("q_pe", out.q_pe, q_pe), ("topk_slots", out.topk_slots, topk),
                            ("residual_out", out.residual_out, r), ("kv_cache", case["kv_cache"], manual_kv),
                            ("index_k_cache", case["index_k_cache"], manual_idx), ("logits", out.tensors["logits"], logits)):
        assert_equal(f"attention_prefix {name}", got, want)
    # E1 ran after B1: the new tokens' own keys (poisoned before) are finite in the logits
    assert_close("attention_prefix logits at own position",
                 out.tensors["logits"].gather(1, (case["seq_lens"].long() - 1)[:, None]),
                 logits.gather(1, (case["seq_lens"].long() - 1)[:, None]), kind="fp32")
    # every row selects min(seq_len, topk) slots; the newest token's slot is a candidate
    assert_equal("attention_prefix topk counts", (out.topk_slots >= 0).sum(1),
                 case["seq_lens"].long().clamp(max=cfg.index_topk))


def test_attention_prefix_shared_layer(seed):
    cfg = small_config(index_topk_freq=4, index_skip_topk_offset=3)
    shared = 3
    assert not cfg.is_full_indexer_layer(shared) and cfg.is_full_indexer_layer(2)
    w = random_layer(cfg, shared, seed=seed).attn
    assert w.indexer is None
    case = prefix_case(cfg, 5)
    idx_before = case["index_k_cache"].clone()
    prev = torch.randint(0, 100, (5, cfg.index_topk), dtype=torch.int32)
    out = P.attention_prefix(**case, w=w, cfg=cfg, prev_topk=prev, layer=shared)
    assert out.topk_slots is prev
    assert_equal("shared layer leaves the index-K cache alone", case["index_k_cache"], idx_before)
    assert not {"w_raw", "logits", "index_q_fp8", "index_k_fp8"} & set(out.tensors)
    with pytest.raises(P.PrefixInputError, match="prev_topk"):
        P.attention_prefix(**case, w=w, cfg=cfg)
    full_w = layer("small")[1]
    with pytest.raises(P.PrefixInputError, match="shared-indexer layer per cfg"):
        P.attention_prefix(**case, w=full_w, cfg=cfg, layer=shared)


# ---- input validation --------------------------------------------------------------------------------------

def test_validation_errors_name_op_and_problem(seed):
    cfg, w = layer("small")
    h = cfg.hidden_size
    good = torch.randn(2, h).to(BF16)
    with pytest.raises(P.PrefixInputError, match=r"A0 .*hidden must be bfloat16"):
        P.a0_add_rmsnorm_quant(good.float(), good, w.input_norm, 1e-5)
    with pytest.raises(P.PrefixInputError, match=r"A0 .*residual must have shape \[2, 512\]"):
        P.a0_add_rmsnorm_quant(good, good[:1], w.input_norm, 1e-5)
    _, x8, xs = x_inputs(cfg, 2)
    with pytest.raises(P.PrefixInputError, match=r"B0 .*x_fp8 scale must have shape"):
        P.b0_qkv_a(x8, xs[:, :-1], w, cfg)
    b = make_batch(cfg, 2)
    cache = fp8.new_index_k_cache(b["num_pages"], cfg.index_head_dim)
    with pytest.raises(P.PrefixInputError, match="duplicate slots"):
        P.b1_indexer_k(None, x8, xs, w.indexer, b["positions"], b["out_cache_loc"][[0, 0]], cache, cfg)
    with pytest.raises(P.PrefixInputError, match=r"slots in \[.*\] but the cache holds"):
        P.b1_indexer_k(None, x8, xs, w.indexer, b["positions"], b["out_cache_loc"] + 10**6, cache, cfg)
    with pytest.raises(P.PrefixInputError, match="gemm must be"):
        P.b1_indexer_k(None, x8, xs, w.indexer, b["positions"], b["out_cache_loc"], cache, cfg, gemm="int8")
    q8, _ = fp8.quant_per_row(torch.randn(2, cfg.index_n_heads, cfg.index_head_dim))
    hw = torch.rand(2, cfg.index_n_heads)
    too_long = b["seq_lens"].clone()
    too_long[1] = b["block_table"].shape[1] * PAGE + 1
    with pytest.raises(P.PrefixInputError, match=r"E1 .*seq_lens\[1\]=.* exceeds the block table capacity"):
        P.e1_indexer_logits(q8, hw, cache, too_long, b["block_table"], cfg)
    with pytest.raises(P.PrefixInputError, match=r"E1 .*head_w must be float32"):
        P.e1_indexer_logits(q8, hw.double(), cache, b["seq_lens"], b["block_table"], cfg)
    bad_table = b["block_table"].clone()
    bad_table[0, 0] = b["num_pages"]
    with pytest.raises(P.PrefixInputError, match="block_table maps live tokens to pages"):
        P.e1_indexer_logits(q8, hw, cache, b["seq_lens"], bad_table, cfg)
    logits = torch.full((2, int(b["seq_lens"].max())), float("nan"))
    with pytest.raises(P.PrefixInputError, match="E2 .*NaN"):
        P.e2_topk(logits, b["seq_lens"], b["block_table"], cfg.index_topk)


def test_e1_fixed_width_max_ctx(seed):
    """A fixed logits width (what a CUDA-graph caller passes) pads with -inf and must cover every row."""
    from glm5_fastpath.ref.prefix import PrefixInputError, e1_indexer_logits
    from glm5_fastpath.testing.decode_step import make_decode_step

    cfg = Glm5Config.preset("small")
    step = make_decode_step(cfg, [70, 130], seed=seed)
    q8 = (torch.randn(2, cfg.index_n_heads, cfg.index_head_dim)).to(torch.float8_e4m3fn)
    hw = torch.rand(2, cfg.index_n_heads)
    base = e1_indexer_logits(q8, hw, step.index_k_cache, step.seq_lens, step.block_table, cfg)
    wide = e1_indexer_logits(q8, hw, step.index_k_cache, step.seq_lens, step.block_table, cfg, max_ctx=150)
    assert wide.shape == (2, 150) and base.shape == (2, 130)
    assert torch.equal(wide[:, :130], base) and torch.isneginf(wide[:, 130:]).all()
    with pytest.raises(PrefixInputError, match="max_ctx=100"):
        e1_indexer_logits(q8, hw, step.index_k_cache, step.seq_lens, step.block_table, cfg, max_ctx=100)
