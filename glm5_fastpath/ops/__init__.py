"""glm5_fastpath custom ops (torch.library namespace `glm5_fastpath`) backed by the JIT kernels.

Importing this package registers the ops and their fake (meta) implementations; it needs
neither a GPU nor cuda-python. The first call on a GPU compiles (or takes from the disk cache)
and loads the kernel; `precompile()` does that ahead of time, e.g. when the SGLang plugin loads.
Missing cuda-python raises ImportError with: pip install 'glm5-fastpath[kernels]'.

Each prefix op has the signature of its reference in glm5_fastpath.ref.prefix, so tests and
benchmarks swap one for the other.

| Python | torch.ops | kernel source |
|---|---|---|
| add_rmsnorm_quant (A0) | glm5_fastpath.add_rmsnorm_quant, glm5_fastpath.add_rmsnorm_quant_out | csrc/attn_pre/a0_add_rmsnorm_quant.{cuh,cu} |
| c0_head_gate (C0) | glm5_fastpath.c0_head_gate | csrc/attn_pre/c0_head_gate.{cuh,cu} |
| d2_absorb_and_kv_store (D2) | glm5_fastpath.d2_absorb_kv_store | csrc/attn_pre/d2_absorb_kv_store.{cuh,cu} |
| fp8_gemm_skinny, b0_qkv_a (B0), d0_q_b (D0), d1_indexer_q (D1), b1_indexer_k (B1) | glm5_fastpath.fp8_gemm_skinny, fp8_qkv_a, fp8_q_b_rope, fp8_indexer_q, fp8_indexer_k | csrc/attn_pre/fp8_gemm_skinny.{cuh,cu} |
| b0_qkv_a(..., mode="split") (B0 split: plain GEMM + row kernel) | glm5_fastpath.fp8_gemm_skinny, b0_row_norms | csrc/attn_pre/fp8_gemm_skinny.{cuh,cu}, csrc/attn_pre/b0_row_norms.{cuh,cu} |
| moe_route, moe_route_scaled (MoE router) | glm5_fastpath.moe_router | csrc/moe/router.{cuh,cu} |
| act_quant_fp8 (bf16 -> 1x128 FP8 before MegaMoE) | glm5_fastpath.act_quant_fp8, glm5_fastpath.act_quant_fp8_out | csrc/moe/act_quant.{cuh,cu} |
| e1_indexer_logits (E1) | glm5_fastpath.e1_indexer_logits, glm5_fastpath.e1_indexer_logits_out | csrc/attn_pre/e1_indexer_logits.{cuh,cu} |
| e2_topk (E2) | glm5_fastpath.e2_topk, glm5_fastpath.e2_topk_out | csrc/attn_pre/e2_topk.{cuh,cu} |
| sparse_mla_decode (split-KV sparse MLA decode, the DSA attention core) | glm5_fastpath.sparse_mla_decode | csrc/attn_core/sparse_mla_decode.{cuh,cu} |
| mla_v_up_quant (W_UV per head + o_proj's 1x128 FP8 quant, after the attention core) | glm5_fastpath.mla_v_up_quant, glm5_fastpath.mla_v_up_quant_out | csrc/attn_core/mla_v_up.{cuh,cu} |
| dsa_decode_metadata (the DSA backend's per-step decode metadata in one launch) | glm5_fastpath.dsa_decode_metadata | csrc/attn_core/dsa_decode_metadata.{cuh,cu} |
"""
from __future__ import annotations

# Submodules first: the re-exported functions below shadow some submodule names.
from . import act_quant as _act_quant
from . import add_rmsnorm_quant as _a0
from . import c0_head_gate as _c0
from . import d2_absorb as _d2
from . import dsa_metadata as _dsa_metadata
from . import e1_indexer_logits as _e1
from . import e2_topk as _e2
from . import fp8_gemm as _fp8
from . import fp8_gemm_chain as _fp8_chain
from . import mla_v_up as _mla_v_up
from . import prefetch as _l2_prefetch
from . import moe_router as _moe_router
from . import sparse_mla as _sparse_mla
from .act_quant import ActQuantResult, act_quant_fp8
from .add_rmsnorm_quant import A0Result, add_rmsnorm_quant
from .c0_head_gate import c0_head_gate
from .d2_absorb import d2_absorb_and_kv_store, d2_absorb_qcat
from .dsa_metadata import dsa_decode_metadata
from .e1_indexer_logits import e1_indexer_logits
from .e2_topk import e2_topk
from .fp8_gemm import b0_qkv_a, b1_indexer_k, d0_q_b, d1_indexer_q, fp8_gemm_skinny
from .prefetch import l2_prefetch
from .mla_v_up import VUpResult, mla_v_up_quant
from .moe_router import moe_route, moe_route_scaled
from .sparse_mla import sparse_mla_decode

# The reference's name for A0 (same signature), so `ops` can stand in for `ref.prefix` as a namespace.
a0_add_rmsnorm_quant = add_rmsnorm_quant

_MODULES = (_a0, _c0, _d2, _e1, _e2, _fp8, _fp8_chain, _moe_router, _act_quant, _sparse_mla, _l2_prefetch, _mla_v_up,
            _dsa_metadata)


def precompile(cfg=None, device: object = None, indexer_rotate: bool = False,
               pdl_waits: tuple[str | None, ...] = (None,), d2_qcat: bool = False) -> None:
    """Compile and load every kernel the ops need for `cfg` (default GLM-5) on `device` (default: current),
    and allocate their workspaces / RoPE tables: call before CUDA-graph capture, never inside it.
    indexer_rotate: also D1 / B1 with the Hadamard rotation (rotate=True: SGLang 0.5.14's indexer format).
    pdl_waits: the PDL wait points to build every kernel for (None = native; "entry" / "after_prologue" are
    separate cubins, launched by the CMP modes that wait early: attn_pre/cmp/modes.py).
    d2_qcat: also D2's q_cat form (d2_absorb_qcat; the SGLang seam's GLM5_FASTPATH_QCAT route)."""
    from ._device import pdl_wait_code
    from ..config import Glm5Config

    c = cfg or Glm5Config.preset("glm5")
    w = tuple(dict.fromkeys(pdl_wait_code("precompile", p) for p in (pdl_waits or (None,))))
    _a0.precompile((c.hidden_size,), device, wait_ats=w)
    _c0.precompile(device, ((c.hidden_size, c.index_n_heads),), wait_ats=w)
    _d2.precompile(device, ((c.qk_nope_head_dim, c.kv_lora_rank, c.qk_rope_head_dim, c.rope_theta),), wait_ats=w,
                   qcat=(False, True) if d2_qcat else (False,))
    _e1.precompile(device, ((c.index_n_heads, c.index_head_dim),), wait_ats=w)
    _e2.precompile(device, wait_ats=w)
    _fp8.precompile(device, c, rotate=indexer_rotate, wait_ats=w)
    _moe_router.precompile(device, ((c.hidden_size, c.n_routed_experts, c.num_experts_per_tok),))


def compile_check_specs() -> list:
    """Every KernelSpec variant the ops launch, for scripts/compile_check.py, plus the first variant of
    each kernel source with each early PDL wait point (pdl_wait= "entry" / "after_prologue")."""
    import dataclasses

    specs = [s for m in _MODULES for s in m.compile_check_specs()]
    first: dict[str, object] = {}
    for s in specs:
        if s.source is not None and s.source.startswith("attn_pre/"):
            first.setdefault(s.source, s)
    early = [dataclasses.replace(s, defines=tuple(s.defines) + (("GLM5_PDL_WAIT_AT", str(w)),))
             for s in first.values() for w in (0, 1)]
    return specs + early


__all__ = ["A0Result", "ActQuantResult", "a0_add_rmsnorm_quant", "act_quant_fp8", "add_rmsnorm_quant", "b0_qkv_a", "b1_indexer_k", "c0_head_gate", "d0_q_b", "d1_indexer_q",
           "fp8_gemm_skinny", "l2_prefetch", "mla_v_up_quant", "VUpResult", "moe_route", "moe_route_scaled", "compile_check_specs", "d2_absorb_and_kv_store", "d2_absorb_qcat", "dsa_decode_metadata", "e1_indexer_logits",
           "e2_topk",
           "precompile", "sparse_mla_decode"]
