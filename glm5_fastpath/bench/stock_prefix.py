"""The stock (SGLang-equivalent) attention-prefix ops, for benchmarks only (never on the user path).

What "stock" means here (shared/anchors.md, "Keeping the stock baseline honest"): SGLang's decode
kernel list (spec/glm5_layer.md section 3), each op SGLang runs as one fused kernel counted as one
kernel here too. Where SGLang's own kernel is not on the H200 machine, the same library kernel is
used (DeepGEMM for the FP8 GEMMs and the paged indexer logits, cuBLAS for the bf16 GEMM and the
W_UK bmm) and small norm / RoPE / quant / store ops are `torch.compile`d (inductor, dynamic=False)
versions of the same fused math: one function per SGLang kernel, never a chain of eager ops.

| row | what runs | SGLang kernels it stands for (spec section 3) |
|---|---|---|
| A0 | compiled add+RMSNorm; compiled 1x128 act quant (column-major TMA-aligned scales) | #1 fused_add_rmsnorm, #2 per_token_group_quant_fp8 |
| B0 | DeepGEMM fp8_gemm_nt 6144->2624; compiled q_a + kv_a RMSNorm | #3, #4, #5 |
| C0 (+B1 GEMM) | cuBLAS bf16 6144->160 (wk dequantized to bf16 ‖ weights_proj) | #6 (one GEMM for wk and weights_proj) |
| B1 (post) | compiled LayerNorm + RoPE + quant + index-K cache store | #9 fused_k_indexer_norm_rope_store |
| D1 | compiled act quant; DeepGEMM 2048->4096; compiled RoPE + per-head quant + head weights | #7, #8 |
| D0 | compiled act quant; DeepGEMM 2048->16384; compiled RoPE of q_pe | #12, q half of #14 |
| D2 | torch.bmm bf16 (cuBLAS) W_UK; compiled k_pe RoPE + MLA KV store | #13, k half of #14, #15 |
| E1 | DeepGEMM fp8_paged_mqa_logits (schedule metadata computed outside the timed region) | #10 |
| E2 | SGLang's own fused top-k + page-table transform (`sgl_kernel.fast_topk_transform_fused`, what its DSA decode runs) when sgl_kernel imports; else torch.topk + page-table translate, compiled: a labelled STAND-IN (~50 us against the fused kernel's ~3 us per anchors.md) | #11 |

Without DeepGEMM the GEMM rows fall back to a labelled bf16 cuBLAS GEMM on weights dequantized at
setup (activations dequantized by a compiled kernel), and E1 is skipped with the reason.

DeepGEMM (sgl-deep-gemm 0.1.3) API used, from its Python sources and API checks:
- `fp8_gemm_nt((x8, sfa), (w8, sfb), d)`: x8 [M, K] e4m3 K-major, sfa [M, K/128] fp32; on SM90 the
  scales must be MN-major and TMA-aligned (strides (1, align(M, 4))) or DeepGEMM launches its own
  transpose kernel first; w8 [N, K] e4m3, sfb [ceil(N/128), K/128] fp32 contiguous; d [M, N] bf16.
- `get_paged_mqa_logits_metadata(context_lens [B, 1] int32, 64, num_sms)` -> [num_sms + 1, 2] int32.
- `fp8_paged_mqa_logits(q [B, 1, H, D] e4m3, kv [pages, 64, 1, D + 4] uint8, weights [B, H] fp32,
  context_lens [B, 1] int32, block_table [B, max_pages] int32, schedule_meta, max_context_len)`
  -> logits [B, max_context_len] fp32 (a view of a 256-column-aligned buffer; columns past a row's
  context length are not written). kv is the index-K page [64 x D fp8][64 x fp32 scale] viewed as
  [pages, 64, 1, D + 4]: DeepGEMM reads only the base pointer and the page stride.
- Runtime JIT: nvcc at $CUDA_HOME/bin/nvcc (or DG_JIT_NVCC_COMPILER; NVRTC with DG_JIT_USE_NVRTC=1),
  cache in $DG_JIT_CACHE_DIR (default $HOME/.deep_gemm). `load_deep_gemm` sets CUDA_HOME from our
  nvcc discovery and DG_JIT_CACHE_DIR to /tmp/glm5_fastpath_deep_gemm when they are unset.

`python -m glm5_fastpath.bench.stock_prefix --prewarm N,K,M [...]` JIT-compiles DeepGEMM kernels
into the shared cache (the prefix benchmark runs several of these in parallel during its setup).
"""
from __future__ import annotations

import argparse
import os
import subprocess
import sys
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
import torch.nn.functional as F

from ..config import ACT_QUANT_EPS, FP8_BLOCK, FP8_MAX, INDEX_K_PAGE_TOKENS, INDEX_QK_SCALE_FLOOR, INDEXER_K_NORM_EPS
from ..ref import fp8
from ..ref.rope import apply_rope_interleaved

BF16 = torch.bfloat16
FP8 = torch.float8_e4m3fn
PAGE = INDEX_K_PAGE_TOKENS
DG_CACHE_DEFAULT = "/tmp/glm5_fastpath_deep_gemm"
E2_STANDIN = "torch.topk stand-in (SGLang uses a fused JIT top-k; anchors.md: ~3 us expected)"
E2_SGLANG = "sgl_kernel.fast_topk_transform_fused (SGLang's DSA decode top-k + page-table transform)"


def sglang_fused_topk() -> tuple[Callable | None, str]:
    """(sgl_kernel's fused decode top-k + transform, "") when it imports, else (None, why)."""
    try:
        from sgl_kernel.top_k import fast_topk_transform_fused
    except Exception as e:  # noqa: BLE001 - reported as the reason for the stand-in
        return None, f"{type(e).__name__}: {str(e)[:160]}"
    return fast_topk_transform_fused, ""


def stock_topk(cfg) -> tuple[Callable | None, str]:
    """The stock E2 for config `cfg`: (SGLang's fused decode top-k + transform, its label) when sgl_kernel has it and
    the size is the kernel's only one (2048), else (None, the stand-in's label with the reason)."""
    fused, why = sglang_fused_topk()
    if fused is not None and cfg.index_topk != 2048:  # the kernel asserts topk == 2048 (DeepSeek V3.2 / GLM-5)
        fused, why = None, f"index_topk {cfg.index_topk} != 2048 (the fused kernel's only size)"
    return fused, (E2_SGLANG if fused is not None else f"{E2_STANDIN} (sgl_kernel: {why})")


def page_table_1(block_table: torch.Tensor, width: int) -> torch.Tensor:
    """Token position -> physical KV slot [B, width] int32 (SGLang's page_table_1, page size 1) from the
    64-token block table: slot = block_table[b, t // 64] * 64 + t % 64 (-1 where the page is -1)."""
    t = torch.arange(width, device=block_table.device)
    pages = block_table.long()[:, t // PAGE]
    return torch.where(pages >= 0, pages * PAGE + t % PAGE, torch.full_like(pages, -1)).to(torch.int32)

# ---- DeepGEMM loading ----------------------------------------------------------------------------------

_DG: dict[str, Any] = {}


def deep_gemm_env() -> dict[str, str]:
    """Set (only if unset) what DeepGEMM's runtime JIT needs; return the values in effect."""
    if not (os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")):
        try:
            from ..jit import find_nvcc

            nvcc = os.path.realpath(find_nvcc())
            os.environ["CUDA_HOME"] = os.path.dirname(os.path.dirname(nvcc))
        except Exception:  # noqa: BLE001 - deep_gemm then falls back to `which nvcc` / /usr/local/cuda
            pass
    os.environ.setdefault("DG_JIT_CACHE_DIR", DG_CACHE_DEFAULT)
    keys = ("CUDA_HOME", "CUDA_PATH", "DG_JIT_CACHE_DIR", "DG_JIT_USE_NVRTC", "DG_JIT_NVCC_COMPILER")
    return {k: os.environ[k] for k in keys if os.environ.get(k)}


def load_deep_gemm():
    """(deep_gemm module or None, reason it is not usable). Imported once per process."""
    if "mod" in _DG or "err" in _DG:
        return _DG.get("mod"), _DG.get("err", "")
    deep_gemm_env()
    try:
        import deep_gemm  # noqa: PLC0415

        missing = [n for n in ("fp8_gemm_nt", "fp8_paged_mqa_logits", "get_paged_mqa_logits_metadata", "get_num_sms")
                   if not hasattr(deep_gemm, n)]
        if missing:
            raise ImportError(f"deep_gemm {getattr(deep_gemm, '__version__', '?')} lacks {missing}")
        _DG["mod"] = deep_gemm
    except BaseException as e:  # noqa: BLE001 - ImportError, OSError (ABI), AssertionError (no CUDA_HOME) ...
        if isinstance(e, KeyboardInterrupt):
            raise
        _DG["err"] = f"deep_gemm not importable: {type(e).__name__}: {str(e)[:300]}"
    return _DG.get("mod"), _DG.get("err", "")


def deep_gemm_info() -> dict[str, Any]:
    mod, err = load_deep_gemm()
    return {"available": mod is not None, "version": getattr(mod, "__version__", None) if mod else None,
            "reason": err, "env": deep_gemm_env()}


# ---- torch.compile with a labelled eager fallback --------------------------------------------------------


def raise_recompile_limit(n: int = 64) -> None:
    """One compiled function serves several shapes (5 M values x up to 2 widths): keep dynamo from
    silently falling back to eager after its default 8 recompiles."""
    import torch._dynamo

    for name in ("recompile_limit", "cache_size_limit"):
        if hasattr(torch._dynamo.config, name):
            setattr(torch._dynamo.config, name, max(n, getattr(torch._dynamo.config, name)))


class Compiled:
    """torch.compile(fn, dynamic=False) on CUDA; eager on CPU or when compilation fails (noted)."""

    def __init__(self, fn: Callable, name: str, enable: bool):
        if enable:
            raise_recompile_limit()
        self.fn, self.name = fn, name
        self.note = "" if enable else "eager (no torch.compile on this device)"
        self._impl = fn
        self._tried = not enable
        if enable:
            self._impl = torch.compile(fn, dynamic=False)

    def __call__(self, *args, **kwargs):
        if self._tried:
            return self._impl(*args, **kwargs)
        try:
            out = self._impl(*args, **kwargs)
            self._tried = True
            return out
        except Exception as e:  # noqa: BLE001 - compilation failure: run the same math eagerly, say so
            if "CUDA error" in str(e) or "illegal" in str(e).lower():
                raise
            self.note = f"torch.compile failed ({type(e).__name__}: {str(e)[:200]}); EAGER torch ops"
            self._impl, self._tried = self.fn, True
            return self._impl(*args, **kwargs)


# ---- the fused math each compiled kernel computes ----------------------------------------------------------


def _rope_cs(cos_sin: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    cs = cos_sin[positions.long()]
    h = cs.shape[-1] // 2
    return cs[:, :h], cs[:, h:]


def add_rmsnorm(hidden, residual, weight, eps: float):
    """fused_add_rmsnorm: (x bf16, residual_out bf16), the norm on the fp32 sum."""
    r = hidden.float() + residual.float()
    x = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return x.to(BF16), r.to(BF16)


def act_quant_t(x, m_pad: int):
    """1x128 FP8 quant of [M, K] rows padded to m_pad rows: (q [m_pad, K] e4m3, s^T [K/128, m_pad] fp32).

    The scales come out transposed, so `s_t.t()[:M]` is the MN-major TMA-aligned [M, K/128] layout
    DeepGEMM's SM90 GEMM reads without a transpose kernel (as SGLang's quant kernel writes it).
    """
    m, k = x.shape
    if m_pad > m:
        x = F.pad(x, (0, 0, 0, m_pad - m))
    g = x.float().view(m_pad, k // FP8_BLOCK, FP8_BLOCK)
    s = g.abs().amax(-1).clamp_min(ACT_QUANT_EPS) / FP8_MAX
    q = (g / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8).view(m_pad, k)
    return q, s.t().contiguous()


def dequant_act(x8, xs):
    """Fallback path only: fp8 activation with [M, K/128] scales back to bf16."""
    m, k = x8.shape
    return (x8.float().view(m, -1, FP8_BLOCK) * xs.float()[..., None]).view(m, k).to(BF16)


def qkv_a_norms(qkv, q_a_w, kv_a_w, q_end: int, kv_end: int, eps: float):
    """q_a_layernorm and kv_a_layernorm (RMSNorm, fp32 math, bf16 out) on slices of the QKV-A output."""
    def rms(x, w):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w.float()).to(BF16)
    return rms(qkv[:, :q_end], q_a_w), rms(qkv[:, q_end:kv_end], kv_a_w)


def indexer_k_post_store(key, ln_w, ln_b, cos_sin, positions, loc, cache, rope: int) -> None:
    """LayerNorm(1e-6) + interleaved RoPE on the leading `rope` dims + bf16 round + per-token FP8 quant,
    stored in place at physical slots `loc` of the index-K cache `cache` [P, 64 * (D + 4)] uint8
    (page = [64 x D fp8][64 x fp32 scale]). The cache is the only mutated input (no aliasing views), so
    inductor can scatter into it in place instead of copying it."""
    kf = key.float()
    mean = kf.mean(-1, keepdim=True)
    var = (kf - mean).pow(2).mean(-1, keepdim=True)
    k = (kf - mean) * torch.rsqrt(var + INDEXER_K_NORM_EPS) * ln_w + ln_b
    cos, sin = _rope_cs(cos_sin, positions)
    k = torch.cat([apply_rope_interleaved(k[:, :rope], cos, sin), k[:, rope:]], dim=-1).to(BF16).float()
    s = k.abs().amax(-1).clamp_min(INDEX_QK_SCALE_FLOOR) / FP8_MAX
    k8 = (k / s[:, None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    d = k8.shape[1]
    loc = loc.long()
    pg, row = (loc // PAGE)[:, None], (loc % PAGE)[:, None]
    cache.index_put_((pg, row * d + torch.arange(d, device=cache.device)[None, :]), k8.view(torch.uint8))
    bits = s.view(torch.int32)
    sb = torch.stack([(bits >> (8 * i)) & 0xFF for i in range(4)], dim=-1).to(torch.uint8)  # little-endian fp32
    cache.index_put_((pg, PAGE * d + row * 4 + torch.arange(4, device=cache.device)[None, :]), sb)


def indexer_q_post(q, w_raw, cos_sin, positions, rope: int, weight_scale: float):
    """Indexer q: interleaved RoPE on the leading dims of every head (fp32), per-(token, head) FP8 quant,
    head weights w_raw * scale * s_q (fused_q_indexer_rope_first_quant)."""
    cos, sin = _rope_cs(cos_sin, positions)
    qf = torch.cat([apply_rope_interleaved(q[..., :rope], cos, sin), q[..., rope:].float()], dim=-1)
    s = qf.abs().amax(-1).clamp_min(INDEX_QK_SCALE_FLOOR) / FP8_MAX
    q8 = (qf / s[..., None]).clamp(-FP8_MAX, FP8_MAX).to(FP8)
    return q8, w_raw.float() * weight_scale * s


def rope_q_pe(q_pe, cos_sin, positions):
    """MLA RoPE of q_pe [M, H, rope] (interleaved, fp32 math, bf16 out)."""
    cos, sin = _rope_cs(cos_sin, positions)
    return apply_rope_interleaved(q_pe, cos, sin).to(BF16)


def kv_rope_store(c_kv, k_pe, cos_sin, positions, kv_cache, loc) -> None:
    """MLA RoPE of k_pe + latent KV store: kv_cache[loc] = [c_kv ‖ rope(k_pe)] (bf16)."""
    cos, sin = _rope_cs(cos_sin, positions)
    kv_cache.index_put_((loc.long(),), torch.cat([c_kv, apply_rope_interleaved(k_pe, cos, sin).to(BF16)], dim=-1))


def topk_translate(logits, seq_lens, block_table, topk: int):
    """torch.topk over live positions + page-table translation to physical slots (int32, -1 padded)."""
    m, w = logits.shape
    t = torch.arange(w, device=logits.device)
    valid = t[None, :] < seq_lens[:, None].long()
    keyed = logits.masked_fill(~valid, float("-inf"))
    idx = torch.topk(keyed, min(topk, w), dim=1, sorted=False).indices
    slots = torch.gather(block_table.long(), 1, idx // PAGE) * PAGE + idx % PAGE
    slots = torch.where(torch.gather(valid, 1, idx), slots, torch.full_like(slots, -1)).to(torch.int32)
    if slots.shape[1] < topk:
        slots = torch.cat([slots, slots.new_full((m, topk - slots.shape[1]), -1)], dim=1)
    return slots


# ---- stock implementations ------------------------------------------------------------------------------------


@dataclass
class Impl:
    """One implementation of one op (a stock row here; bench/prefix_ops.py builds ours the same way).

    `run(*make_set(M, j))` launches it on input set j; `results(args, out)` gives comparable tensors
    (after a sync); `expected(M, rows)` the reference values, name -> (tensor, THRESHOLDS kind or
    "topk"); `poison(args)` overwrites what it must write (cache slots) before the check run;
    `available_sets(M)` caps the rotation (distinct KV pages); `skip_reason` non-empty: not run.
    """

    op: str
    label: str
    uses: list[str]
    make_set: Callable[[int, int], tuple]
    run: Callable[..., Any]
    results: Callable[[tuple, Any], dict[str, torch.Tensor]]
    expected: Callable[[int, tuple[int, int]], dict[str, tuple[torch.Tensor, str]]]
    poison: Callable[[tuple], None] | None = None
    available_sets: Callable[[int], int | None] = lambda M: None
    compiled: list[Compiled] = field(default_factory=list)
    skip_reason: str = ""

    def notes(self) -> list[str]:
        return [f"{c.name}: {c.note}" for c in self.compiled if c.note]


class StockPrefix:
    """Builds the stock rows over a prefix data set (duck-typed: cfg, device, w, t, step, cos_sin,
    rows(M, j), take(name, M, j), copy_of(key, j, factory), poison_* helpers; see bench/prefix_ops.py)."""

    def __init__(self, data, *, compile: bool | None = None, use_deep_gemm: bool = True):
        self.d = data
        cuda = torch.device(data.device).type == "cuda"
        self.compile = cuda if compile is None else compile
        self.dg, self.dg_reason = load_deep_gemm() if (use_deep_gemm and cuda) else (
            None, "deep_gemm not used on a CPU device" if not cuda else "deep_gemm disabled")
        c = data.cfg
        self._c = {name: Compiled(fn, name, self.compile) for name, fn in (
            ("add_rmsnorm", add_rmsnorm), ("act_quant", act_quant_t), ("qkv_a_norms", qkv_a_norms),
            ("indexer_k_post_store", indexer_k_post_store), ("indexer_q_post", indexer_q_post),
            ("rope_q_pe", rope_q_pe), ("kv_rope_store", kv_rope_store), ("topk_translate", topk_translate),
            ("dequant_act", dequant_act))}
        self.num_sms = None
        if self.dg is not None:
            try:
                self.num_sms = int(self.dg.get_num_sms())
            except Exception as e:  # noqa: BLE001
                self.dg, self.dg_reason = None, f"deep_gemm.get_num_sms failed: {e}"
        self._cfg = c

    # -- building blocks --------------------------------------------------------------------------------

    def _quant(self, x: torch.Tensor):
        """Compiled act quant -> (x8 [M, K], sfa [M, K/128] MN-major TMA-aligned view)."""
        m = x.shape[0]
        m_pad = -(-m // 4) * 4
        q, s_t = self._c["act_quant"](x, m_pad)
        return q[:m], s_t.t()[:m]

    def _gemm_label(self, n: int, k: int) -> str:
        if self.dg is not None:
            return f"DeepGEMM fp8_gemm_nt {k}->{n} (1x128 act scales, 128x128 weight scales)"
        return f"FALLBACK bf16 cuBLAS {k}->{n} on dequantized weights ({self.dg_reason})"

    def _fp8_weight(self, key: str, lin, j: int):
        """(w8, sfb) copy j for DeepGEMM, or the bf16 dequantized copy j for the fallback."""
        if self.dg is not None:
            return self.d.copy_of(key, j, lambda: (lin.weight.clone(), lin.scale_inv.float().contiguous().clone()))
        return self.d.copy_of(key + ".bf16", j, lambda: lin.dequant().to(BF16).contiguous())

    def _gemm(self, x8, xs, w, n: int):
        if self.dg is not None:
            out = torch.empty(x8.shape[0], n, dtype=BF16, device=x8.device)
            self.dg.fp8_gemm_nt((x8, xs), w, out)
            return out
        return F.linear(self._c["dequant_act"](x8, xs), w)

    def _cols(self, x8, xs):
        """A ref-layout (row-major scales) fp8 activation in the layout the stock GEMM reads."""
        m = x8.shape[0]
        m_pad = -(-m // 4) * 4
        s_t = torch.zeros(xs.shape[1], m_pad, dtype=torch.float32, device=xs.device)
        s_t[:, :m] = xs.t()
        return x8.contiguous(), s_t.t()[:m]

    def _impl(self, op, label, uses, make_set, run, results, expected, compiled=(), **kw) -> Impl:
        return Impl(op, label, uses, make_set, run, results, expected,
                         compiled=[self._c[n] for n in compiled], **kw)

    # -- rows ------------------------------------------------------------------------------------------------

    def build(self, op: str) -> Impl:
        return getattr(self, f"_{op.lower()}")()

    def _a0(self) -> Impl:
        d, c = self.d, self._cfg

        def make_set(M, j):
            return (d.take("hidden", M, j), d.take("residual", M, j),
                    d.copy_of("input_norm", j, lambda: d.w.input_norm.clone()))

        def run(h, r, w):
            x, res = self._c["add_rmsnorm"](h, r, w, c.rms_norm_eps)
            x8, xs = self._quant(x)
            return x, res, x8, xs

        def results(args, out):
            x, res, x8, xs = out
            return {"x": x, "residual_out": res, "x_fp8": x8.float(), "x_scale": xs}

        def expected(M, rows):
            a, b = rows
            t = d.t
            return {"x": (t["x_bf16"][a:b], "bf16"), "residual_out": (t["residual_out"][a:b], "bf16"),
                    "x_fp8": (t["x_fp8"][a:b].float(), "fp8_same_quant"), "x_scale": (t["x_scale"][a:b], "bf16")}

        return self._impl("A0", "compiled fused_add_rmsnorm + compiled per_token_group_quant_fp8 (2 kernels)",
                          ["torch.compile add+RMSNorm", "torch.compile 1x128 FP8 act quant (col-major TMA scales)"],
                          make_set, run, results, expected, compiled=("add_rmsnorm", "act_quant"))

    def _b0(self) -> Impl:
        d, c = self.d, self._cfg
        n = c.qkv_a_out
        q_end, kv_end = c.q_lora_rank, c.q_lora_rank + c.kv_lora_rank

        def make_set(M, j):
            x8, xs = self._cols(d.take("x_fp8", M, j), d.take("x_scale", M, j))
            return (x8, xs, self._fp8_weight("qkv_a", d.w.qkv_a, j),
                    d.copy_of("q_a_norm", j, lambda: d.w.q_a_norm.clone()),
                    d.copy_of("kv_a_norm", j, lambda: d.w.kv_a_norm.clone()))

        def run(x8, xs, w, qa, kva):
            qkv = self._gemm(x8, xs, w, n)
            q_lora, c_kv = self._c["qkv_a_norms"](qkv, qa, kva, q_end, kv_end, c.rms_norm_eps)
            return q_lora, c_kv, qkv[:, kv_end:]

        def results(args, out):
            return {"q_lora": out[0], "c_kv": out[1], "k_pe": out[2]}

        def expected(M, rows):
            a, b = rows
            return {k: (d.t[k][a:b], "bf16") for k in ("q_lora", "c_kv", "k_pe")}

        return self._impl("B0", f"{self._gemm_label(n, c.hidden_size)} + compiled q_a/kv_a RMSNorm",
                          [self._gemm_label(n, c.hidden_size), "torch.compile q_a_layernorm + kv_a_layernorm"],
                          make_set, run, results, expected, compiled=("qkv_a_norms",) + (
                              ("dequant_act",) if self.dg is None else ()))

    def _c0(self) -> Impl:
        d, c = self.d, self._cfg
        idx = d.w.indexer
        di, hi = c.index_head_dim, c.index_n_heads

        def make_w():
            return torch.cat([idx.wk.dequant().to(BF16), idx.weights_proj]).contiguous()

        def make_set(M, j):
            return d.take("x_bf16", M, j), d.copy_of("wk_weights_proj", j, make_w)

        def run(x, w):
            return F.linear(x, w)

        def results(args, out):
            return {"key": out[:, :di], "w_raw": out[:, di:]}

        def expected(M, rows):
            a, b = rows
            return {"key": (d.t["key_bf16"][a:b], "bf16"), "w_raw": (d.t["w_raw"][a:b], "bf16")}

        label = f"cuBLAS bf16 {c.hidden_size}->{di + hi} (SGLang's fused wk_weights_proj: C0 + the B1 GEMM in one)"
        return self._impl("C0", label, [label], make_set, run, results, expected)

    def _b1(self) -> Impl:
        d, c = self.d, self._cfg
        idx = d.w.indexer
        di, r = c.index_head_dim, c.qk_rope_head_dim
        def make_set(M, j):
            a, b = d.rows(M, j)
            kw = torch.cat([d.t["key_bf16"][a:b], d.t["w_raw"][a:b]], dim=1)  # the [M, 160] GEMM output
            return (kw[:, :di], d.copy_of("k_norm_w", j, lambda: idx.k_norm_weight.clone()),
                    d.copy_of("k_norm_b", j, lambda: idx.k_norm_bias.clone()), d.cos_sin,
                    d.step.positions[a:b].clone(), d.step.out_cache_loc[a:b].clone())

        def run(key, w, b, cs, pos, loc):
            self._c["indexer_k_post_store"](key, w, b, cs, pos, loc, d.step.index_k_cache, r)

        def results(args, out):
            k8, s = fp8.index_k_cache_load(d.step.index_k_cache, args[5], di)
            return {"index_k_fp8": k8.float(), "index_k_scale": s}

        def expected(M, rows):
            a, b = rows
            return {"index_k_fp8": (d.t["index_k_fp8_bf16path"][a:b].float(), "fp8_same_quant"),
                    "index_k_scale": (d.t["index_k_scale_bf16path"][a:b], "bf16")}

        return self._impl("B1", "compiled fused_k_indexer_norm_rope_store (LN + RoPE + quant + index-K store); "
                          "its GEMM is in the C0 row", ["torch.compile LayerNorm+RoPE+FP8 quant+index-K store"],
                          make_set, run, results, expected, compiled=("indexer_k_post_store",),
                          poison=lambda args: d.poison_index_k(args[5]))

    def _d1(self) -> Impl:
        d, c = self.d, self._cfg
        idx = d.w.indexer
        hi, di, r = c.index_n_heads, c.index_head_dim, c.qk_rope_head_dim

        def make_set(M, j):
            a, b = d.rows(M, j)
            return (d.take("q_lora", M, j), d.take("w_raw", M, j), self._fp8_weight("wq_b", idx.wq_b, j), d.cos_sin,
                    d.step.positions[a:b].clone())

        def run(q_lora, w_raw, w, cs, pos):
            x8, xs = self._quant(q_lora)
            q = self._gemm(x8, xs, w, hi * di).view(-1, hi, di)
            return self._c["indexer_q_post"](q, w_raw, cs, pos, r, c.index_weight_scale)

        def results(args, out):
            return {"index_q_fp8": out[0].float(), "head_w": out[1]}

        def expected(M, rows):
            a, b = rows
            return {"index_q_fp8": (d.t["index_q_fp8"][a:b].float(), "fp8_same_quant"),
                    "head_w": (d.t["head_w"][a:b], "bf16_chain")}

        g = self._gemm_label(hi * di, c.q_lora_rank)
        return self._impl("D1", f"compiled act quant + {g} + compiled fused_q_indexer_rope_first_quant",
                          ["torch.compile 1x128 FP8 act quant", g, "torch.compile RoPE+per-head quant+head weights"],
                          make_set, run, results, expected, compiled=("act_quant", "indexer_q_post") + (
                              ("dequant_act",) if self.dg is None else ()))

    def _d0(self) -> Impl:
        d, c = self.d, self._cfg
        h, nope, r = c.num_attention_heads, c.qk_nope_head_dim, c.qk_rope_head_dim
        n = h * c.qk_head_dim

        def make_set(M, j):
            a, b = d.rows(M, j)
            return (d.take("q_lora", M, j), self._fp8_weight("q_b", d.w.q_b, j), d.cos_sin,
                    d.step.positions[a:b].clone())

        def run(q_lora, w, cs, pos):
            x8, xs = self._quant(q_lora)
            q = self._gemm(x8, xs, w, n).view(-1, h, c.qk_head_dim)
            return q[..., :nope], self._c["rope_q_pe"](q[..., nope:], cs, pos)

        def results(args, out):
            return {"q_nope": out[0], "q_pe": out[1]}

        def expected(M, rows):
            a, b = rows
            return {"q_nope": (d.t["q_nope"][a:b], "bf16"), "q_pe": (d.t["q_pe"][a:b], "bf16")}

        g = self._gemm_label(n, c.q_lora_rank)
        return self._impl("D0", f"compiled act quant + {g} + compiled RoPE(q_pe)",
                          ["torch.compile 1x128 FP8 act quant", g, "torch.compile MLA RoPE of q_pe"],
                          make_set, run, results, expected, compiled=("act_quant", "rope_q_pe") + (
                              ("dequant_act",) if self.dg is None else ()))

    def _d2(self) -> Impl:
        d, c = self.d, self._cfg
        h, nope = c.num_attention_heads, c.qk_nope_head_dim

        def make_set(M, j):
            a, b = d.rows(M, j)
            q = torch.cat([d.t["q_nope"][a:b], d.t["q_pe"][a:b]], dim=-1)  # the [M, H, nope + rope] q_b output
            return (q[..., :nope], d.take("c_kv", M, j), d.take("k_pe", M, j),
                    d.copy_of("w_kc", j, lambda: d.w.w_kc.clone()), d.cos_sin, d.step.positions[a:b].clone(),
                    d.step.out_cache_loc[a:b].clone())

        def run(q_nope, c_kv, k_pe, w_kc, cs, pos, loc):
            q_lat = torch.bmm(q_nope.transpose(0, 1), w_kc).transpose(0, 1)
            self._c["kv_rope_store"](c_kv, k_pe, cs, pos, d.step.kv_cache, loc)
            return q_lat

        def results(args, out):
            return {"q_lat": out, "kv_new": d.step.kv_cache[args[6].long()]}

        def expected(M, rows):
            a, b = rows
            return {"q_lat": (d.t["q_lat"][a:b], "bf16"), "kv_new": (d.t["kv_new"][a:b], "bf16")}

        return self._impl("D2", "torch.bmm bf16 W_UK (cuBLAS) + compiled k_pe RoPE + MLA KV store",
                          ["torch.bmm bf16 (cuBLAS) on q_nope.transpose(0, 1)", "torch.compile RoPE(k_pe)+KV store"],
                          make_set, run, results, expected, compiled=("kv_rope_store",),
                          poison=lambda args: d.poison_kv(args[6]))

    def _e1(self) -> Impl:
        d, c = self.d, self._cfg
        hi, di = c.index_n_heads, c.index_head_dim
        label = "DeepGEMM fp8_paged_mqa_logits (metadata from get_paged_mqa_logits_metadata, outside the timed region)"
        cache = d.step.index_k_cache
        skip = ""
        if self.dg is None:
            skip = f"{self.dg_reason}: no fair stand-in for the paged MQA logits kernel"
        kv4 = cache.view(cache.shape[0], PAGE, 1, di + 4)

        def make_set(M, j):
            a, b = d.rows(M, j)
            ctx = d.step.seq_lens[a:b].to(torch.int32).view(-1, 1).contiguous()
            meta = self.dg.get_paged_mqa_logits_metadata(ctx, PAGE, self.num_sms)
            return (d.take("index_q_fp8", M, j).view(-1, 1, hi, di), kv4, d.take("head_w", M, j), ctx,
                    d.step.block_table[a:b].to(torch.int32).contiguous(), meta, int(d.step.seq_lens[a:b].max()))

        def run(q, kv, w, ctx, bt, meta, max_ctx):
            return self.dg.fp8_paged_mqa_logits(q, kv, w, ctx, bt, meta, max_ctx, False)

        def results(args, out):
            return {"logits": d.mask_logits(out, args[3].view(-1))}

        def expected(M, rows):
            a, b = rows
            return {"logits": (d.mask_logits(d.t["logits"][a:b], d.step.seq_lens[a:b]), "fp8_same_quant")}

        return self._impl("E1", label, [label], make_set, run, results, expected, skip_reason=skip,
                          available_sets=d.distinct_sets)

    def _e2(self) -> Impl:
        d, c = self.d, self._cfg
        fused, label = stock_topk(c)

        def make_set(M, j):
            a, b = d.rows(M, j)
            logits = d.take("logits", M, j)
            bt = d.step.block_table[a:b].contiguous().clone()
            sl = d.step.seq_lens[a:b].clone()
            if fused is None:
                return (logits, sl, bt)
            # what SGLang's metadata already holds before the indexer runs: not part of the timed op
            return (logits.contiguous(), sl.to(torch.int32).contiguous(), page_table_1(bt, logits.shape[1]),
                    torch.arange(M + 1, dtype=torch.int32, device=logits.device))

        def run(*args):
            if fused is None:
                return self._c["topk_translate"](*args, c.index_topk)
            logits, sl, pt1, cu = args
            return fused(logits, sl, pt1, cu, c.index_topk)

        def results(args, out):
            return {"topk_slots": out}

        def expected(M, rows):
            a, b = rows
            return {"topk_slots": (d.t["topk_slots"][a:b], "topk")}

        if fused is not None:
            return self._impl("E2", E2_SGLANG, [E2_SGLANG], make_set, run, results, expected)
        return self._impl("E2", E2_STANDIN, [f"torch.compile mask + torch.topk(sorted=False) + page-table translate: "
                                              f"{label}"], make_set, run, results, expected,
                          compiled=("topk_translate",))


# ---- JIT prewarm (parallel processes filling DeepGEMM's kernel cache) -------------------------------------


def prewarm_jobs(cfg, ms, kv_len: int) -> list[str]:
    """One job spec per DeepGEMM kernel the prefix benchmark will call: 'gemm:N,K,M' and 'e1:M,kv'."""
    shapes = [(cfg.qkv_a_out, cfg.hidden_size), (cfg.index_n_heads * cfg.index_head_dim, cfg.q_lora_rank),
              (cfg.num_attention_heads * cfg.qk_head_dim, cfg.q_lora_rank)]
    jobs = [f"gemm:{n},{k},{m}" for m in ms for (n, k) in shapes]
    # the metadata kernel is specialised on align(M, 32); the logits kernel on neither M nor KV
    seen: set[int] = set()
    for m in ms:
        a = -(-m // 32) * 32
        if a not in seen:
            seen.add(a)
            jobs.append(f"e1:{m},{kv_len},{cfg.index_n_heads},{cfg.index_head_dim}")
    return jobs


def start_prewarm(jobs: list[str], procs: int, log: Callable[[str], None] = print) -> list[subprocess.Popen]:
    """Start up to `procs` background processes that JIT-compile the jobs (errors are theirs, never ours)."""
    if not jobs or procs < 1:
        return []
    buckets = [jobs[i::procs] for i in range(min(procs, len(jobs)))]
    deep_gemm_env()
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = root + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    out = []
    for b in buckets:
        try:
            out.append(subprocess.Popen([sys.executable, "-m", "glm5_fastpath.bench.stock_prefix", "--prewarm", *b],
                                        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        except OSError as e:
            log(f"prewarm: could not start a process: {e}")
    return out


def wait_prewarm(ps: list[subprocess.Popen], timeout_s: float) -> dict[str, Any]:
    import time

    t0 = time.monotonic()
    codes = []
    for p in ps:
        left = max(0.0, timeout_s - (time.monotonic() - t0))
        try:
            codes.append(p.wait(timeout=left))
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            codes.append("killed (timeout)")
    return {"processes": len(ps), "exit_codes": codes, "seconds": time.monotonic() - t0}


def _prewarm_main(jobs: list[str]) -> int:
    dg, err = load_deep_gemm()
    if dg is None:
        print(err, file=sys.stderr)
        return 1
    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    rc = 0
    for job in jobs:
        kind, _, spec = job.partition(":")
        try:
            if kind == "gemm":
                n, k, m = (int(x) for x in spec.split(","))
                x = torch.randn(m, k, device=dev, generator=g).to(BF16)
                m_pad = -(-m // 4) * 4
                q, s_t = act_quant_t(x, m_pad)
                w = torch.randn(n, k, device=dev, generator=g).clamp(-4, 4).to(FP8)
                ws = torch.rand(-(-n // 128), k // 128, device=dev, generator=g) + 0.5
                out = torch.empty(m, n, dtype=BF16, device=dev)
                dg.fp8_gemm_nt((q[:m], s_t.t()[:m]), (w, ws), out)
            elif kind == "e1":
                m, kv, hi, di = (int(x) for x in spec.split(","))
                pages = -(-kv // PAGE)
                cache = torch.randint(0, 100, (m * pages, PAGE * (di + 4)), dtype=torch.uint8, device=dev)
                bt = torch.arange(m * pages, dtype=torch.int32, device=dev).view(m, pages)
                ctx = torch.full((m, 1), kv, dtype=torch.int32, device=dev)
                meta = dg.get_paged_mqa_logits_metadata(ctx, PAGE, dg.get_num_sms())
                q = torch.randn(m, 1, hi, di, device=dev, generator=g).to(FP8)
                w = torch.rand(m, hi, device=dev, generator=g)
                dg.fp8_paged_mqa_logits(q, cache.view(-1, PAGE, 1, di + 4), w, ctx, bt, meta, kv, False)
            torch.cuda.synchronize()
        except Exception as e:  # noqa: BLE001
            print(f"prewarm {job}: {type(e).__name__}: {e}", file=sys.stderr)
            rc = 1
    return rc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description="JIT-compile DeepGEMM kernels into the shared cache")
    ap.add_argument("--prewarm", nargs="+", required=True, help="jobs: gemm:N,K,M or e1:M,KV,H,D")
    return _prewarm_main(ap.parse_args(argv).prewarm)


if __name__ == "__main__":
    sys.exit(main())
