"""FP8 (e4m3) reference helpers, pure PyTorch, CPU and CUDA.

Conventions (spec/glm5_layer.md section 5):
- weights: W8 [N, K] e4m3 with `weight_scale_inv` S [ceil(N/128), ceil(K/128)] fp32, W = W8 * S
  (ragged last blocks allowed);
- activations: per token, per 128-column group, s = max(amax, eps) / 448, x8 = fp8(x / s);
- index-K cache page: 64 tokens, [64 x D fp8][64 x fp32 scale] (D=128 -> 8448 B per page).
"""
from __future__ import annotations

import torch

from ..config import ACT_QUANT_EPS, FP8_BLOCK, FP8_MAX, INDEX_K_PAGE_TOKENS, INDEX_QK_SCALE_FLOOR

FP8 = torch.float8_e4m3fn


def cast_fp8(x: torch.Tensor) -> torch.Tensor:
    """Round fp32 values to e4m3 (round-to-nearest-even), saturating at +-448."""
    return x.float().clamp(-FP8_MAX, FP8_MAX).to(FP8)


def scale_of(amax: torch.Tensor) -> torch.Tensor:
    """amax / 448 correctly rounded to fp32 on every device.

    PyTorch on CUDA turns `tensor / python_scalar` into a multiply by the reciprocal (1 ulp off);
    dividing in float64 and rounding once keeps CPU, CUDA and our kernels (IEEE fp32 division) equal.
    """
    return (amax.double() / FP8_MAX).float()


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _pad_to_blocks(w: torch.Tensor, bn: int, bk: int) -> torch.Tensor:
    n, k = w.shape
    pn, pk = _ceil_div(n, bn) * bn - n, _ceil_div(k, bk) * bk - k
    if pn or pk:
        w = torch.nn.functional.pad(w, (0, pk, 0, pn))
    return w


def quant_weight_block(w: torch.Tensor, block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """[N, K] float -> (W8 [N, K] e4m3, S [ceil(N/b), ceil(K/b)] fp32) with W ~= W8 * S per block."""
    if w.dim() != 2:
        raise ValueError(f"quant_weight_block: expected a 2-D [N, K] weight, got shape {tuple(w.shape)}")
    n, k = w.shape
    wp = _pad_to_blocks(w.float(), block, block)
    nb, kb = wp.shape[0] // block, wp.shape[1] // block
    blocks = wp.view(nb, block, kb, block)
    amax = blocks.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, scale_of(amax), torch.ones_like(amax))
    q = cast_fp8(blocks / scale[:, None, :, None]).view(nb * block, kb * block)[:n, :k].contiguous()
    return q, scale.contiguous()


def dequant_weight_block(w8: torch.Tensor, scale_inv: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """(W8 [N, K], S [ceil(N/b), ceil(K/b)]) -> fp32 [N, K]."""
    n, k = w8.shape
    nb, kb = _ceil_div(n, block), _ceil_div(k, block)
    if tuple(scale_inv.shape) != (nb, kb):
        raise ValueError(f"dequant_weight_block: weight {tuple(w8.shape)} needs scales ({nb}, {kb}), got {tuple(scale_inv.shape)}")
    s = scale_inv.float().repeat_interleave(block, 0)[:n].repeat_interleave(block, 1)[:, :k]
    return w8.float() * s


def quant_act_per_token(x: torch.Tensor, group: int = FP8_BLOCK, eps: float = ACT_QUANT_EPS
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """[..., K] -> (x8 [..., K] e4m3, s [..., K/group] fp32); K must be a multiple of `group`."""
    k = x.shape[-1]
    if k % group:
        raise ValueError(f"quant_act_per_token: K={k} is not a multiple of the group size {group}")
    xg = x.float().reshape(*x.shape[:-1], k // group, group)
    s = scale_of(xg.abs().amax(dim=-1).clamp_min(eps))
    q = cast_fp8(xg / s[..., None]).reshape(x.shape)
    return q, s


def dequant_act(x8: torch.Tensor, s: torch.Tensor, group: int = FP8_BLOCK) -> torch.Tensor:
    k = x8.shape[-1]
    return (x8.float().reshape(*x8.shape[:-1], k // group, group) * s[..., None].float()).reshape(x8.shape)


def quant_per_row(x: torch.Tensor, floor: float = INDEX_QK_SCALE_FLOOR) -> tuple[torch.Tensor, torch.Tensor]:
    """One scale per row over the last dim: s = max(amax, floor)/448 (indexer q per (token, head), k per token)."""
    s = scale_of(x.float().abs().amax(dim=-1).clamp_min(floor))
    return cast_fp8(x.float() / s[..., None]), s


def block_fp8_linear(x8: torch.Tensor, xs: torch.Tensor, w8: torch.Tensor, ws: torch.Tensor,
                     block: int = FP8_BLOCK) -> torch.Tensor:
    """y[m,n] = sum_g xs[m,g] * ws[n/128,g] * sum_{k in g} x8[m,k] * w8[n,k]  (fp32 result).

    The exact math of a block-scaled FP8 GEMM with fp32 accumulation (spec section 5).
    """
    m, k = x8.shape
    n = w8.shape[0]
    if w8.shape[1] != k:
        raise ValueError(f"block_fp8_linear: x8 is {tuple(x8.shape)} but w8 is {tuple(w8.shape)}")
    g = k // block
    xg = x8.float().view(m, g, block)
    wg = _pad_to_blocks(w8.float(), block, block)[:, :k].view(-1, g, block)[:n]
    partial = torch.einsum("mgk,ngk->gmn", xg, wg)  # per-group dot products
    ws_rows = ws.float().repeat_interleave(block, 0)[:n]  # [N, G]
    return (partial * xs.float().t()[:, :, None] * ws_rows.t()[:, None, :]).sum(0)


# ---- index-K cache ---------------------------------------------------------------------------------

def index_k_page_bytes(head_dim: int, page: int = INDEX_K_PAGE_TOKENS) -> int:
    return page * (head_dim + 4)


def new_index_k_cache(num_pages: int, head_dim: int, device=None, page: int = INDEX_K_PAGE_TOKENS) -> torch.Tensor:
    """A paged index-K cache as raw bytes [num_pages, page*(head_dim+4)] uint8."""
    return torch.zeros(num_pages, index_k_page_bytes(head_dim, page), dtype=torch.uint8, device=device)


def index_k_cache_store(cache: torch.Tensor, slots: torch.Tensor, k8: torch.Tensor, scale: torch.Tensor,
                        page: int = INDEX_K_PAGE_TOKENS) -> None:
    """Write token rows (k8 [T, D] e4m3, scale [T] fp32) at physical slots (page = slot // 64)."""
    d = k8.shape[-1]
    if cache.shape[1] != index_k_page_bytes(d, page):
        raise ValueError(f"index_k_cache_store: page has {cache.shape[1]} B, expected {index_k_page_bytes(d, page)} for head_dim={d}")
    slots = slots.long()
    pg, off = slots // page, slots % page
    vals = k8.contiguous().view(torch.uint8)  # [T, D]
    cols = off[:, None] * d + torch.arange(d, device=cache.device)[None, :]
    cache[pg[:, None], cols] = vals
    sbytes = scale.float().contiguous().view(torch.uint8).view(-1, 4)  # [T, 4] little-endian fp32
    scols = page * d + off[:, None] * 4 + torch.arange(4, device=cache.device)[None, :]
    cache[pg[:, None], scols] = sbytes


def index_k_cache_load(cache: torch.Tensor, slots: torch.Tensor, head_dim: int,
                       page: int = INDEX_K_PAGE_TOKENS) -> tuple[torch.Tensor, torch.Tensor]:
    """Read (k8 [T, D] e4m3, scale [T] fp32) of physical slots."""
    d = head_dim
    slots = slots.long()
    pg, off = slots // page, slots % page
    cols = off[:, None] * d + torch.arange(d, device=cache.device)[None, :]
    k8 = cache[pg[:, None], cols].contiguous().view(FP8)
    scols = page * d + off[:, None] * 4 + torch.arange(4, device=cache.device)[None, :]
    s = cache[pg[:, None], scols].contiguous().view(torch.float32).view(-1)
    return k8, s


def index_k_cache_views(cache: torch.Tensor, head_dim: int, page: int = INDEX_K_PAGE_TOKENS
                        ) -> tuple[torch.Tensor, torch.Tensor]:
    """Whole-cache views: k8 [pages, 64, D] e4m3 and scale [pages, 64] fp32 (no copies)."""
    n = cache.shape[0]
    k8 = cache[:, : page * head_dim].view(FP8).view(n, page, head_dim)
    s = cache[:, page * head_dim:].view(torch.float32)  # last dim contiguous: a dtype view, no copy
    return k8, s


def kv_b_rows_fp8(kv_b8: torch.Tensor, kv_b_scale: torch.Tensor, heads: int, first: int, count: int,
                  block: int = FP8_BLOCK, who: str = "kv_b_rows_fp8") -> tuple[torch.Tensor, torch.Tensor]:
    """Rows [first, first + count) of every head of the checkpoint's FP8 kv_b_proj [heads * (nope + v), kv_lora] e4m3
    (+ its [rows/128, kv_lora/128] scales) -> (w8 [heads, count, kv_lora] e4m3, scale [heads, count, kv_lora/128] fp32),
    the scale of every row expanded per 128 columns (a head's rows start at row (nope + v) * h of kv_b, so its scale
    block boundaries fall at different rows per head; one scale per row keeps a kernel's lookup the same for every
    head). dequant_w_kc(w8, scale) is then bitwise SGLang's bf16 dequantisation of those rows."""
    rows, kvl = kv_b8.shape
    if rows % heads or kvl % block:
        raise ValueError(f"{who}: kv_b {tuple(kv_b8.shape)} does not split into {heads} heads / "
                         f"{block}-column blocks")
    per_head = rows // heads
    if not (0 <= first and 0 < count and first + count <= per_head):
        raise ValueError(f"{who}: rows [{first}, {first + count}) outside a head's {per_head} rows")
    if tuple(kv_b_scale.shape) != (_ceil_div(rows, block), kvl // block):
        raise ValueError(f"{who}: scales {tuple(kv_b_scale.shape)} do not match kv_b {tuple(kv_b8.shape)}")
    row = (torch.arange(heads, device=kv_b8.device)[:, None] * per_head + first
           + torch.arange(count, device=kv_b8.device)[None, :])  # [heads, count] kv_b row of (h, i)
    w8 = kv_b8.view(heads, per_head, kvl)[:, first:first + count, :].contiguous()
    scale = kv_b_scale.float()[row // block].contiguous()  # [heads, count, kvl / block]
    return w8, scale


def w_kc_fp8_from_kv_b(kv_b8: torch.Tensor, kv_b_scale: torch.Tensor, heads: int, nope: int,
                       block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UK in FP8 form from kv_b_proj (kv_b_rows_fp8 of each head's first nope rows): (w_kc8 [heads, nope, kv_lora]
    e4m3, w_kc_scale [heads, nope, kv_lora/128] fp32). Lossless: dequant_w_kc(...) is bitwise the bf16 w_kc SGLang (and
    weights.assemble_layer) dequantize at load, bf16_rn(fp32(e4m3) * s) (0.2 MB of scales next to 6.3 MB of weights at
    GLM-5 dims)."""
    per_head = kv_b8.shape[0] // heads if heads else 0
    if not 0 < nope <= per_head:
        raise ValueError(f"w_kc_fp8_from_kv_b: nope={nope} outside (0, {per_head}]")
    return kv_b_rows_fp8(kv_b8, kv_b_scale, heads, 0, nope, block, who="w_kc_fp8_from_kv_b")


def w_vc_fp8_from_kv_b(kv_b8: torch.Tensor, kv_b_scale: torch.Tensor, heads: int, nope: int,
                       block: int = FP8_BLOCK) -> tuple[torch.Tensor, torch.Tensor]:
    """W_UV in FP8 form from kv_b_proj (kv_b_rows_fp8 of each head's rows after its nope W_UK rows): (w_vc8 [heads, v,
    kv_lora] e4m3, scale [heads, v, kv_lora/128] fp32); dequant_w_kc(...) is SGLang's bf16 w_vc transposed ([H, V, L])."""
    return kv_b_rows_fp8(kv_b8, kv_b_scale, heads, nope, kv_b8.shape[0] // heads - nope, block,
                         who="w_vc_fp8_from_kv_b")


def dequant_w_kc(w_kc8: torch.Tensor, w_kc_scale: torch.Tensor, block: int = FP8_BLOCK) -> torch.Tensor:
    """(w_kc8 [heads, nope, kv_lora] e4m3, w_kc_scale [heads, nope, kv_lora/128] fp32) -> bf16 w_kc,
    bf16_rn(fp32(e4m3) * s) (the D2 W8 kernel rebuilds the same bits in registers). Any kv_b_rows_fp8 output works
    (w_vc_fp8_from_kv_b's: SGLang's w_vc, [H, V, L])."""
    h, k, n = w_kc8.shape
    if tuple(w_kc_scale.shape) != (h, k, _ceil_div(n, block)):
        raise ValueError(f"dequant_w_kc: scales {tuple(w_kc_scale.shape)} do not match w_kc8 {tuple(w_kc8.shape)}")
    s = w_kc_scale.float().repeat_interleave(block, -1)[..., :n]
    return (w_kc8.float() * s).to(torch.bfloat16)

