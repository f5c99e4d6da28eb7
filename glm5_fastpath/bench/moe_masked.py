"""The DeepGEMM masked grouped-GEMM MoE pipeline, the second stock column of `bench moe` (issue #6).

This is what SGLang runs for the MoE on Hopper with DeepEP's low-latency dispatch. Tokens arrive per local
expert in a padded [E, max_m, H] FP8 buffer with a per-expert row count `masked_m`. Then:

    FC1   deep_gemm.m_grouped_fp8_gemm_nt_masked((a8, a_sf), (w13, s13), gu [E, max_m, 2I] bf16, masked_m, expected_m)
    act   SwiGLU + 1x128 FP8 requant of the masked rows: SGLang's silu_and_mul_masked_post_quant_fwd (Triton),
          or, where SGLang does not import, the PyTorch formulation (swiglu_quant_torch; the report names it)
    FC2   deep_gemm.m_grouped_fp8_gemm_nt_masked((a8', a_sf'), (w2, s2), y [E, max_m, H] bf16, masked_m, expected_m)

Timed: FC1 + act + FC2. The dispatch into the masked layout and the weighted combine are DeepEP's kernels
in that pipeline; single-GPU they would be torch scatters, so they are built outside the timed region
(`prepare` / `combine`). The column is therefore a lower bound for that path. Padding rows (past masked_m)
are never read by the GEMMs, and their outputs are never combined.

The layout helpers are pure PyTorch and tested on CPU, with a float64 stand-in for the grouped GEMM.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

import torch

from ..ref.fp8 import block_fp8_linear
from ..ref.moe import swiglu_requant

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
ROW_ALIGN = 64  # max_m rounded up to a multiple of this (the masked kernels' M block on SM90)


@dataclass
class MaskedLayout:
    experts: int
    max_m: int                  # rows per expert in the padded buffers (>= the largest count, ROW_ALIGN multiple)
    expected_m: int             # DeepGEMM's hint: the mean rows per expert that has any
    masked_m: torch.Tensor      # [E] int32 rows of each expert
    pair_token: torch.Tensor    # [P] token of each (token, slot) pair, in layout order
    pair_slot: torch.Tensor     # [P] its top-k slot
    pair_expert: torch.Tensor   # [P] its expert
    pair_row: torch.Tensor      # [P] its row in the expert's buffer


def masked_layout(ids: torch.Tensor, experts: int, align: int = ROW_ALIGN) -> MaskedLayout:
    """The masked layout of routing ids [M, k] (entries < 0 are unused slots): per expert, its pairs in
    token order. Deterministic."""
    if ids.dim() != 2:
        raise ValueError(f"masked_layout: ids must be [M, k], got {tuple(ids.shape)}")
    m, k = ids.shape
    flat = ids.long().reshape(-1)
    if flat.numel() and int(flat.max()) >= experts:
        raise ValueError(f"masked_layout: expert id {int(flat.max())} >= {experts} experts")
    tok = torch.arange(m, device=ids.device).repeat_interleave(k)
    slot = torch.arange(k, device=ids.device).repeat(m)
    keep = flat >= 0
    e, tok, slot = flat[keep], tok[keep], slot[keep]
    order = torch.argsort(e * max(1, m) + tok, stable=True)  # expert-major, then token
    e, tok, slot = e[order], tok[order], slot[order]
    counts = torch.bincount(e, minlength=experts) if e.numel() else torch.zeros(experts, dtype=torch.long,
                                                                                 device=ids.device)
    start = torch.cumsum(counts, 0) - counts
    row = torch.arange(e.numel(), device=ids.device) - start[e]
    biggest = int(counts.max()) if experts else 0
    max_m = max(align, -(-biggest // align) * align)
    active = int((counts > 0).sum())
    expected = max(1, -(-int(counts.sum()) // max(1, active)))
    return MaskedLayout(experts, max_m, expected, counts.to(torch.int32), tok, slot, e, row)


def dispatch(x8: torch.Tensor, xs: torch.Tensor, lay: MaskedLayout, a8: torch.Tensor | None = None,
             a_sf: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Token rows into the padded per-expert buffers (a8 [E, max_m, H] e4m3, a_sf [E, max_m, H/128] fp32).
    Padding rows are zero (scale 1), so a kernel that did read them would add nothing."""
    h = x8.shape[1]
    if a8 is None:
        a8 = torch.zeros(lay.experts, lay.max_m, h, dtype=FP8, device=x8.device)
        a_sf = torch.ones(lay.experts, lay.max_m, xs.shape[1], dtype=torch.float32, device=x8.device)
    a8[lay.pair_expert, lay.pair_row] = x8[lay.pair_token]
    a_sf[lay.pair_expert, lay.pair_row] = xs[lay.pair_token].float()
    return a8, a_sf


def combine(y: torch.Tensor, lay: MaskedLayout, weights: torch.Tensor, num_tokens: int) -> torch.Tensor:
    """out[t] = bf16(sum over t's pairs of fp32(weight * y)) (routed experts only, no rsf). fp32 index_add_:
    slot order on the CPU, atomics (no fixed order) on CUDA; only the same-run error figure uses it."""
    out = torch.zeros(num_tokens, y.shape[-1], dtype=torch.float32, device=y.device)
    vals = y[lay.pair_expert, lay.pair_row].float() * weights[lay.pair_token, lay.pair_slot].float()[:, None]
    order = torch.argsort(lay.pair_token * 64 + lay.pair_slot, stable=True)  # slot order per token
    out.index_add_(0, lay.pair_token[order], vals[order])
    return out.to(BF16)


def swiglu_quant_torch(gu: torch.Tensor, masked_m: torch.Tensor, a8: torch.Tensor, a_sf: torch.Tensor) -> None:
    """SwiGLU of gate || up rows and 1x128 FP8 requant, in place into (a8, a_sf): the PyTorch stand-in for
    SGLang's silu_and_mul_masked_post_quant_fwd. It processes ALL rows, padding included, in several kernels,
    so a time measured with it is not the pipeline's lower bound (the report names the activation used)."""
    q, s = swiglu_requant(gu)
    a8.copy_(q)
    a_sf.copy_(s)


def reference_masked_gemm(a: tuple[torch.Tensor, torch.Tensor], b: tuple[torch.Tensor, torch.Tensor],
                          d: torch.Tensor, masked_m: torch.Tensor, expected_m: int) -> None:
    """The masked grouped-GEMM contract in PyTorch: d[g, :masked_m[g]] = block_fp8(a[g], b[g]) rows (CPU tests)."""
    (a8, a_sf), (w, w_sf) = a, b
    for g in range(a8.shape[0]):
        n = int(masked_m[g])
        if n:
            d[g, :n] = block_fp8_linear(a8[g, :n], a_sf[g, :n], w[g], w_sf[g]).to(d.dtype)


class MaskedPipeline:
    """FC1 -> act -> FC2 over a fixed masked layout (module doc). `gemm` is deep_gemm's masked grouped GEMM on
    the GPU (DeepGemmMasked.create) or reference_masked_gemm; `act` fills (a8', a_sf') from gu."""

    def __init__(self, weights: tuple[torch.Tensor, ...], gemm: Callable[..., Any],
                 act: Callable[..., None] | None = None, act_name: str = "torch (all rows, padding included)",
                 input_sf: Callable[[torch.Tensor], torch.Tensor] | None = None) -> None:
        """input_sf: turns FC1's [E, max_m, H/128] fp32 input scales into the layout the GEMM wants, once in
        prepare (deep_gemm's get_mn_major_tma_aligned_tensor: DeepEP's dispatch hands SGLang MN-major
        scales, so the timed FC1 must not transpose them on every call)."""
        self.w13, self.s13, self.w2, self.s2 = weights
        self.gemm, self.act, self.act_name = gemm, act or swiglu_quant_torch, act_name
        self.input_sf = input_sf
        self.lay: MaskedLayout | None = None

    def prepare(self, x8: torch.Tensor, xs: torch.Tensor, ids: torch.Tensor) -> MaskedLayout:
        """Layout + dispatch + the static buffers (outside the timed region)."""
        e, n2, h = self.w13.shape
        lay = self.lay = masked_layout(ids, e)
        self.a8, self.a_sf = dispatch(x8, xs, lay)
        if self.input_sf is not None:
            self.a_sf = self.input_sf(self.a_sf)
        dev = x8.device
        self.gu = torch.empty(e, lay.max_m, n2, dtype=BF16, device=dev)
        self.b8 = torch.empty(e, lay.max_m, n2 // 2, dtype=FP8, device=dev)
        self.b_sf = torch.empty(e, lay.max_m, n2 // 2 // 128, dtype=torch.float32, device=dev)
        self.y = torch.empty(e, lay.max_m, h, dtype=BF16, device=dev)
        self.masked_m = lay.masked_m.to(dev)
        return lay

    def __call__(self) -> torch.Tensor:
        lay = self.lay
        self.gemm((self.a8, self.a_sf), (self.w13, self.s13), self.gu, self.masked_m, lay.expected_m)
        self.act(self.gu, self.masked_m, self.b8, self.b_sf)
        self.gemm((self.b8, self.b_sf), (self.w2, self.s2), self.y, self.masked_m, lay.expected_m)
        return self.y

    def output(self, weights: torch.Tensor, num_tokens: int) -> torch.Tensor:
        return combine(self.y, self.lay, weights, num_tokens)


def sglang_act() -> tuple[Callable[..., None] | None, str]:
    """SGLang's Triton SwiGLU + masked requant when importable, else (None, why)."""
    try:
        from sglang.srt.layers.moe.ep_moe.kernels import silu_and_mul_masked_post_quant_fwd as f
    except Exception as e:  # noqa: BLE001 - reported in the results
        return None, f"torch (sglang's silu_and_mul_masked_post_quant_fwd not importable: {type(e).__name__})"

    def act(gu, masked_m, a8, a_sf):
        f(gu, a8, a_sf, 128, masked_m)

    return act, "sglang silu_and_mul_masked_post_quant_fwd"


def deepgemm_input_sf() -> Callable[[torch.Tensor], torch.Tensor] | None:
    """deep_gemm's MN-major TMA-aligned transform of fp32 scales (deep_gemm.utils.layout), or None."""
    try:
        import deep_gemm
        f = getattr(deep_gemm, "get_mn_major_tma_aligned_tensor", None)
        if f is None:
            from deep_gemm.utils.layout import get_mn_major_tma_aligned_tensor as f
        return f
    except Exception:  # noqa: BLE001 - then the GEMM transforms them itself, inside the timed call
        return None


def deepgemm_masked_gemm() -> Callable[..., None]:
    """deep_gemm's masked grouped FP8 GEMM (sgl-deep-gemm 0.1.3: m_grouped_fp8_fp4_gemm_nt_masked, alias
    fp8_m_grouped_gemm_nt_masked). ImportError / AttributeError surface to the caller, which reports them."""
    import deep_gemm

    f = getattr(deep_gemm, "m_grouped_fp8_gemm_nt_masked", None) or getattr(deep_gemm, "fp8_m_grouped_gemm_nt_masked")

    def gemm(a, b, d, masked_m, expected_m):
        f(a, b, d, masked_m, expected_m)

    return gemm
