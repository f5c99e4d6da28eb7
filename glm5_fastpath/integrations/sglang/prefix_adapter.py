"""SGLang -> glm5_fastpath views for the attention-prefix seam (docs/sglang_prefix_contract.md).

Three things, all host-side and read-only unless stated:

1. `check_layer(attn, cfg)`: may this `DeepseekV2AttentionMLA` instance take our route, and which one?
   - "full":    our ops compute everything forward_absorb_prepare returns, top-k included, and write the
                index-K cache, in the format of the layer's indexer (`layer_rotate(attn)`): SGLang 0.5.23+'s
                fused, Hadamard-free indexer (GLM-5 on CUDA), or SGLang 0.5.14's indexer, which rotates
                q and k with a 128-point Walsh-Hadamard transform (`indexer_rotates`): then our B1 / D1 run
                with rotate=True and the cache keeps 0.5.14's format;
   - "partial": our Q0/B0/D0/D2 (QKV-A, q_b, W_UK, RoPE), SGLang's own indexer for the top-k and the
                index-K write: an indexer whose format we cannot tell for sure (0.5.23 with
                SGLANG_DISABLE_DSA_INDEXER_FUSION=1 rotates through `_maybe_rotate`: not recognised), or a
                0.5.14 indexer failing a full-route requirement;
   - "shared":  a GLM-5.2 IndexShare layer: our Q0/B0/D0/D2, the previous full layer's top-k passed on;
   or a `Refusal` naming why SGLang keeps the whole prefix.
2. `build_weights(attn, cfg, kind)`: our `AttnWeights` over SGLang's parameters. Views where the layouts
   match (QKV-A, q_b, wq_b, norms, weights_proj); two repacks, both done once at install:
   - wk: SGLang's fused indexer holds it as bf16 rows [0, D_i) of `indexer.wk_weights_proj.weight`
     (dequantized from the checkpoint FP8 at load); our B1 is an FP8 GEMM, so it is re-quantized to
     128x128 block FP8: +D_i*H + 4*ceil(D_i/128)*ceil(H/128) bytes per layer (786 624 B for GLM-5,
     61 MB for 78 layers). The e4m3 values come back exactly (the bf16 rounding of w8*s is < 2^-8
     relative, far below e4m3's half-ulp); the scale differs by < 2^-9 relative. SGLang 0.5.14 keeps
     `indexer.wk` as its own block-FP8 ReplicatedLinear (and `indexer.weights_proj` bf16): views, no
     repack (a bf16 wk there is re-quantized as above).
   - w_kc: SGLang stores it [heads, nope, kv_lora] with strides of a [heads, kv_lora, nope] buffer
     (`w_kc.transpose(1, 2).contiguous().transpose(1, 2)`); our D2 reads it row-major. policy
     "relayout" (default) replaces attn.w_kc by its contiguous copy (same shape and values: SGLang's
     own bmm takes any strides), so no memory is added after install (12.6 MB per layer transient);
     policy "copy" keeps SGLang's tensor and holds a second one (+12.6 MB per layer at TP1).
3. `step_views(...)`: per call, the step tensors our ops read, taken from SGLang's forward context
   without copies: positions, out_cache_loc, seq_lens / block table (the DSA backend's indexer
   metadata: `get_seqlens_int32()`, `get_page_table_64()`), the layer's index-K buffer (SGLang's
   `DSATokenToKVPool`, 64-token pages of [64 x 128 e4m3][64 x fp32 scale], exactly our layout) and the
   top-k form the DSA backend expects (physical slots when it fuses the top-k transform, else logical
   positions).

Nothing here imports sglang at module import; SGLang-only helpers are imported lazily and every
lookup has a plain-attribute fallback, so CPU tests drive it with faithful fakes.
"""
from __future__ import annotations

import functools
import importlib
import inspect
import math
import os
import sys
from dataclasses import dataclass, field
from typing import Any

import torch

from ...config import FP8_BLOCK, INDEX_K_PAGE_TOKENS, INDEXER_K_NORM_EPS, Glm5Config
from ...ref.fp8 import index_k_page_bytes, quant_weight_block
from ...weights import AttnWeights, Fp8Linear, IndexerWeights

FP8 = torch.float8_e4m3fn
BF16 = torch.bfloat16
KINDS = ("full", "partial", "shared")
W_KC_POLICIES = ("relayout", "copy")
MAX_TOKENS = 256  # every prefix kernel's decode limit (ops: M <= 256)

# reason code -> log text; codes are the `reason` label of glm5_fastpath_prefix_layer_total
PREFIX_REASONS: dict[str, str] = {
    "not_mla_module": "not a DeepseekV2AttentionMLA with q_lora (no fused_qkv_a_proj_with_mqa / q_b_proj)",
    "attention_backend": "attention backend is not DSA (dsa / nsa)",
    "tp_heads": "attention heads are split over ranks (num_local_heads != num_heads): TP>1 / DP attention",
    "dcp": "decode context parallelism (dcp_size > 1) or --dcp-replicate-q-proj",
    "lora": "LoRA on the attention projections",
    "weights_format": "an attention weight is not 128x128 block-FP8 (e4m3 + fp32 scale_inv) where we need it",
    "w_kc_format": "W_UK is not a bf16 [heads, nope, kv_lora] tensor (per-tensor FP8 bmm or DeepGEMM masked bmm)",
    "rope": "RoPE is not GLM-5's: needs GPT-J interleaved, no scaling (rope_interleave / indexer_rope_interleave)",
    "dims": "layer dims differ from the model config",
    "indexer_format": "indexer layout we cannot mirror (kpool / RMS k_norm / aiter / eps)",
    "output_gate": "model adds an attention output gate to the prepare tuple",
    "seam_signature": "forward_absorb_prepare / forward_absorb_core signature not recognised",
    "config": "model config not understood as GLM-5",
    # per call
    "hidden_tuple": "hidden_states is a pre-quantized tuple (fused norm+quant input)",
    "llama4_scaling": "llama_4_scaling is set",
    "rope_fused_in_core": "the backend fuses RoPE into attention (trtllm + fp8 KV): the prepare must not rope",
    "sglang_option": "an SGLang option changes the prepare contract (born-FP8 q, fused bmm+attention, ...)",
    "no_metadata": "no DSA indexer metadata / KV pool for this forward batch",
    "kv_pool": "KV pool is not a plain DSATokenToKVPool with 64-token index pages (kpool, sharding, hisparse, layer split)",
    "shapes": "step tensors disagree in rows / dtype / layout (padding we do not mirror)",
    "too_many_tokens": f"M above {MAX_TOKENS} tokens (the prefix kernels' decode limit)",
    "no_prev_topk": "IndexShare layer without the previous layer's top-k",
    "static_buffer": "static buffers missing during CUDA-graph capture (no eager warm-up ran first)",
    "error": "our executor raised; SGLang's path taken for this call",
}


@dataclass(frozen=True)
class Refusal:
    reason: str  # key of PREFIX_REASONS
    detail: str = ""

    def message(self) -> str:
        return PREFIX_REASONS[self.reason] + (f" ({self.detail})" if self.detail else "")


# ---- SGLang version facts -----------------------------------------------------------------------------

@dataclass(frozen=True)
class SeamSignature:
    """How the prepare tuple looks for this SGLang: 9 elements (0.5.14) or 10 (0.5.23: + fusion_plan)."""

    core_params: tuple[str, ...]

    @property
    def has_fusion_plan(self) -> bool:
        return "fusion_plan" in self.core_params

    @property
    def arity(self) -> int:
        return 9 + int(self.has_fusion_plan)


CORE_PARAMS_0514 = ("q_pe", "k_pe", "q_nope_out", "k_nope", "forward_batch", "zero_allocator", "positions",
                    "topk_indices", "llama_4_scaling")
PREPARE_PARAMS = ("positions", "hidden_states", "forward_batch", "zero_allocator", "llama_4_scaling",
                  "prev_topk_indices")


def seam_signature(attn: Any) -> SeamSignature | Refusal:
    core = getattr(type(attn), "forward_absorb_core", None)
    prep = getattr(type(attn), "forward_absorb_prepare", None)
    if core is None or prep is None:
        return Refusal("seam_signature", "no forward_absorb_prepare / forward_absorb_core")
    try:
        cps = tuple(p for p in inspect.signature(core).parameters if p != "self")
        pps = tuple(p for p in inspect.signature(prep).parameters if p != "self")
    except (TypeError, ValueError) as e:
        return Refusal("seam_signature", str(e))
    if cps[:9] != CORE_PARAMS_0514 or pps[:6] != PREPARE_PARAMS:
        return Refusal("seam_signature", f"core{cps} prepare{pps}")
    extra = cps[9:]
    if extra not in ((), ("fusion_plan",), ("fusion_plan", "attention_output_gate")):
        return Refusal("seam_signature", f"unknown extra core parameters {extra}")
    return SeamSignature(cps)


# ---- config -------------------------------------------------------------------------------------------

def config_from_hf(hf_config: Any) -> Glm5Config:
    """Glm5Config from SGLang's HF config object (what install passes as model.config)."""
    d = hf_config.to_dict() if hasattr(hf_config, "to_dict") else dict(vars(hf_config))
    return Glm5Config.from_dict(d, source="<sglang model.config>")


# ---- per-layer support --------------------------------------------------------------------------------

def _fp8_linear(mod: Any, n: int, k: int, name: str) -> Fp8Linear | Refusal:
    w = getattr(mod, "weight", None)
    s = getattr(mod, "weight_scale_inv", None)
    want = (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))
    if not isinstance(w, torch.Tensor) or w.dtype != FP8 or tuple(w.shape) != (n, k) or not w.is_contiguous():
        return Refusal("weights_format", f"{name}.weight is {getattr(w, 'dtype', None)} {tuple(getattr(w, 'shape', ()))}, "
                                         f"need contiguous e4m3 {(n, k)}")
    if (not isinstance(s, torch.Tensor) or s.dtype != torch.float32 or tuple(s.shape) != want or not s.is_contiguous()
            or getattr(s, "format_ue8m0", False)):
        return Refusal("weights_format", f"{name}.weight_scale_inv is {getattr(s, 'dtype', None)} "
                                         f"{tuple(getattr(s, 'shape', ()))}, need contiguous fp32 {want}")
    return Fp8Linear(w.detach(), s.detach())


def _vec(t: Any, n: int, dtype: torch.dtype) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == dtype and tuple(t.shape) == (n,) and t.is_contiguous()


def _rope_ok(rope: Any, cfg: Glm5Config, name: str) -> Refusal | None:
    if rope is None:
        return Refusal("rope", f"{name} has no rotary_emb")
    if getattr(rope, "is_neox_style", True):
        return Refusal("rope", f"{name}.is_neox_style is True (half-split RoPE)")
    if type(rope).__name__ not in ("RotaryEmbedding",):
        return Refusal("rope", f"{name} is {type(rope).__name__} (scaled RoPE)")
    base = getattr(rope, "base", None)
    dim = getattr(rope, "rotary_dim", getattr(rope, "head_size", None))
    if base is not None and not math.isclose(float(base), float(cfg.rope_theta), rel_tol=1e-9):
        return Refusal("rope", f"{name}.base={base} but rope_theta={cfg.rope_theta}")
    if dim is not None and int(dim) != cfg.qk_rope_head_dim:
        return Refusal("rope", f"{name}.rotary_dim={dim} but qk_rope_head_dim={cfg.qk_rope_head_dim}")
    return None


def indexer_is_fused(indexer: Any) -> bool:
    """True when SGLang writes the index-K cache without a Hadamard rotation (0.5.23's fused CUDA indexer,
    `use_dsa_indexer_fusion`): the format our B1/D1/E1 produce and read."""
    return bool(getattr(indexer, "use_dsa_indexer_fusion", False)) and hasattr(indexer, "wk_weights_proj")


def _src(obj: Any) -> str | None:
    try:
        return inspect.getsource(obj)
    except (OSError, TypeError):
        return None


def _squash(src: str) -> str:
    return "".join(src.split())


def indexer_rotates(indexer: Any) -> bool:
    """True only when `indexer` is SGLang 0.5.14's DSA indexer, whose index-K cache holds Walsh-Hadamard-rotated
    keys: read from the source of its class and module (docs/sglang_prefix_contract.md section 4):
    - the module defines `rotate_activation(x)` = `hadamard_transform(x, scale=hidden_size**-0.5)` with
      hidden_size = x.size(-1) (the normalised transform over the 128-dim head; ref/hadamard.py);
    - `_get_q_k_bf16` (decode / extend) calls rotate_activation(query) and rotate_activation(key) directly, and
      `_get_k_bf16` (the k-only prefill path) rotate_activation(key): every writer and every query rotates;
    - nothing conditional: no `use_dsa_indexer_fusion` / `_maybe_rotate` (0.5.23's switch) in those methods,
      and not the fused layout (no `wk_weights_proj`).
    False whenever any of it cannot be read or does not match (the caller then keeps the "partial" route)."""
    if indexer is None or indexer_is_fused(indexer) or hasattr(indexer, "wk_weights_proj") \
            or getattr(indexer, "use_dsa_indexer_fusion", False):
        return False
    return _class_rotates(type(indexer))


@functools.lru_cache(maxsize=None)
def _class_rotates(cls: type) -> bool:
    """indexer_rotates' source checks, once per class (install prepares every layer)."""
    mod = sys.modules.get(getattr(cls, "__module__", ""), None)
    rot = getattr(mod, "rotate_activation", None)
    qk, k = getattr(cls, "_get_q_k_bf16", None), getattr(cls, "_get_k_bf16", None)
    if not (callable(rot) and callable(qk) and callable(k)):
        return False
    srcs = [_src(f) for f in (rot, qk, k)]
    if any(x is None for x in srcs):
        return False
    rot_s, qk_s, k_s = (_squash(x) for x in srcs)
    if "hadamard_transform(x,scale=hidden_size**-0.5)" not in rot_s or "hidden_size=x.size(-1)" not in rot_s:
        return False
    if "rotate_activation(query)" not in qk_s or "rotate_activation(key)" not in qk_s \
            or "rotate_activation(key)" not in k_s:
        return False
    return not any(w in x for x in (qk_s, k_s) for w in ("use_dsa_indexer_fusion", "_maybe_rotate"))


def layer_rotate(attn: Any) -> bool:
    """Does this layer's index-K cache hold Hadamard-rotated keys (the "full" route's B1 / D1 rotate)?"""
    return indexer_rotates(getattr(attn, "indexer", None))


def _full_indexer_refusal(idx: Any, cfg: Glm5Config) -> Refusal | None:
    """The indexer requirements of the "full" route beyond the cache format."""
    c = cfg
    if type(idx).__name__ != "Indexer":
        return Refusal("indexer_format", f"{type(idx).__name__} (kpool indexer)")
    kn = getattr(idx, "k_norm", None)
    if type(kn).__name__ != "LayerNorm" or not math.isclose(float(getattr(kn, "variance_epsilon", -1)),
                                                             INDEXER_K_NORM_EPS, rel_tol=1e-6):
        return Refusal("indexer_format", f"k_norm {type(kn).__name__} eps={getattr(kn, 'variance_epsilon', None)}")
    if getattr(idx, "num_init_tokens", 0) or getattr(idx, "num_local_tokens", 0):
        return Refusal("indexer_format", "index_init_tokens / index_local_tokens")
    want = {"n_heads": c.index_n_heads, "head_dim": c.index_head_dim, "index_topk": c.index_topk}
    bad = {k: getattr(idx, k, None) for k, v in want.items() if getattr(idx, k, v) != v}
    if bad:
        return Refusal("dims", f"indexer {bad} vs config {want}")
    return _rope_ok(getattr(idx, "rotary_emb", None), cfg, "indexer.rotary_emb")


DSA_BACKENDS = ("dsa", "nsa")


def check_layer(attn: Any, cfg: Glm5Config) -> tuple[str, Refusal | None]:
    """-> (kind, None) when the layer can be routed ("full" | "partial" | "shared"), else ("", Refusal)."""
    if not (hasattr(attn, "fused_qkv_a_proj_with_mqa") and hasattr(attn, "q_b_proj")
            and getattr(attn, "q_lora_rank", None)):
        return "", Refusal("not_mla_module", type(attn).__name__)
    sig = seam_signature(attn)
    if isinstance(sig, Refusal):
        return "", sig
    if hasattr(attn, "prepare_attention_output_gate"):
        return "", Refusal("output_gate")
    # SGLang stamps the backend on the module at each forward (dispatch_attn_forward_method); at install it is
    # still None, so None defers the check to each call (PrefixExecutor.call_refusal).
    backend = getattr(attn, "current_attention_backend", None)
    if backend is not None and backend not in DSA_BACKENDS:
        return "", Refusal("attention_backend", str(backend))
    c = cfg
    dims = {"num_heads": c.num_attention_heads, "qk_nope_head_dim": c.qk_nope_head_dim,
            "qk_rope_head_dim": c.qk_rope_head_dim, "kv_lora_rank": c.kv_lora_rank, "q_lora_rank": c.q_lora_rank}
    bad = {k: getattr(attn, k, None) for k, v in dims.items() if getattr(attn, k, v) != v}
    if bad:
        return "", Refusal("dims", f"{bad} vs config {dims}")
    if getattr(attn, "num_local_heads", c.num_attention_heads) != c.num_attention_heads:
        return "", Refusal("tp_heads", f"num_local_heads={attn.num_local_heads} of {c.num_attention_heads}")
    if int(getattr(attn, "dcp_size", 1) or 1) != 1 or getattr(attn, "w_kc_qrep", None) is not None:
        return "", Refusal("dcp", f"dcp_size={getattr(attn, 'dcp_size', 1)}")
    for m in ("kv_b_proj", "q_b_proj", "fused_qkv_a_proj_with_mqa"):
        if getattr(getattr(attn, m, None), "set_lora", False):
            return "", Refusal("lora", m)
    if getattr(attn, "use_deep_gemm_bmm", False):
        return "", Refusal("w_kc_format", "use_deep_gemm_bmm (SGLANG_USE_DEEPGEMM_BMM=1)")
    w_kc = getattr(attn, "w_kc", None)
    if not isinstance(w_kc, torch.Tensor) or w_kc.dtype != BF16 or \
            tuple(w_kc.shape) != (c.num_attention_heads, c.qk_nope_head_dim, c.kv_lora_rank):
        return "", Refusal("w_kc_format", f"w_kc {getattr(w_kc, 'dtype', None)} {tuple(getattr(w_kc, 'shape', ()))}")
    r = _rope_ok(getattr(attn, "rotary_emb", None), cfg, "self_attn.rotary_emb")
    if r is not None:
        return "", r
    if getattr(attn, "skip_topk", False) and not getattr(attn, "is_nextn", False):
        return "shared", None
    idx = getattr(attn, "indexer", None)
    if idx is None:
        return "", Refusal("indexer_format", "DSA layer without an indexer module")
    if indexer_is_fused(idx):
        r = _full_indexer_refusal(idx, cfg)
        return ("", r) if r is not None else ("full", None)
    # 0.5.14: the full route with rotate=True, else SGLang's indexer as before. GLM5_FASTPATH_ROTATED_INDEXER=0
    # keeps the partial route (the rotated B1 / D1 have not run inside SGLang on a GPU yet: a kill switch).
    if indexer_rotates(idx) and os.environ.get("GLM5_FASTPATH_ROTATED_INDEXER", "1") != "0":
        if _full_indexer_refusal(idx, cfg) is None and _indexer_weights_0514(idx, cfg)[1] is None:
            return "full", None
    return "partial", None


# ---- weights ------------------------------------------------------------------------------------------

@dataclass
class WeightReport:
    """What building the weight views cost: bytes added for good, bytes replaced in SGLang's module."""

    views: list[str] = field(default_factory=list)
    repacked: dict[str, int] = field(default_factory=dict)  # name -> bytes added (held by us)
    relayout: dict[str, int] = field(default_factory=dict)  # name -> bytes replaced in place (net 0)
    notes: dict[str, str] = field(default_factory=dict)  # e.g. why the FP8 form of W_UK was not built

    @property
    def added_bytes(self) -> int:
        return sum(self.repacked.values())


def requant_bf16_fp8(w: torch.Tensor) -> Fp8Linear:
    """128x128 block-FP8 of a bf16 weight that SGLang dequantized from a block-FP8 checkpoint (see module doc)."""
    w8, s = quant_weight_block(w.float())
    return Fp8Linear(w8.contiguous(), s.contiguous())


def _indexer_weights_0514(idx: Any, cfg: Glm5Config) -> tuple[tuple[Any, Any] | None, Refusal | None]:
    """SGLang 0.5.14's separate indexer projections: ((wk, weights_proj), None) where wk is the block-FP8
    `indexer.wk` (an Fp8Linear view) or a bf16 [D_i, H] weight (to re-quantize), weights_proj the bf16
    [H_i, H] `indexer.weights_proj.weight`; or (None, Refusal)."""
    c = cfg
    d, h = c.index_head_dim, c.hidden_size
    wk_mod = getattr(idx, "wk", None)
    w = getattr(wk_mod, "weight", None)
    if isinstance(w, torch.Tensor) and w.dtype == BF16 and tuple(w.shape) == (d, h) and w.is_contiguous():
        wk: Any = w
    else:
        wk = _fp8_linear(wk_mod, d, h, "indexer.wk")
        if isinstance(wk, Refusal):
            return None, wk
    wp = getattr(getattr(idx, "weights_proj", None), "weight", None)
    if not _is_mat(wp, (c.index_n_heads, h), BF16):
        return None, Refusal("weights_format", f"indexer.weights_proj.weight {getattr(wp, 'dtype', None)} "
                                               f"{tuple(getattr(wp, 'shape', ()))}, need bf16 {(c.index_n_heads, h)}")
    return (wk, wp), None


def _is_mat(t: Any, shape: tuple[int, ...], dtype: torch.dtype) -> bool:
    return isinstance(t, torch.Tensor) and t.dtype == dtype and tuple(t.shape) == shape and t.is_contiguous()


def build_weights(attn: Any, cfg: Glm5Config, kind: str, w_kc_policy: str = "relayout", w_kc_fp8: bool = False
                  ) -> tuple[AttnWeights | None, WeightReport, Refusal | None]:
    """Our AttnWeights for this layer (indexer=None unless kind == "full"); see the module doc for costs.
    w_kc_fp8: also W_UK in the checkpoint's FP8 form (AttnWeights.w_kc_fp8 / w_kc_scale, for D2's W8 build) from
    kv_b_proj's block-FP8 weight, when it is one ([heads * (nope + v), kv_lora] e4m3 with 128 x 128 scales; else
    report.notes["w_kc_fp8"] says why not). SGLang keeps kv_b_proj for its prefill, so this is a copy of the k_nope
    rows (~6.5 MB per layer at GLM-5 dims), bitwise the bf16 w_kc once dequantized."""
    if kind not in KINDS:
        raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
    if w_kc_policy not in W_KC_POLICIES:
        raise ValueError(f"w_kc_policy must be one of {W_KC_POLICIES}, got {w_kc_policy!r}")
    c, rep = cfg, WeightReport()
    qkv = _fp8_linear(attn.fused_qkv_a_proj_with_mqa, c.qkv_a_out, c.hidden_size, "fused_qkv_a_proj_with_mqa")
    q_b = _fp8_linear(attn.q_b_proj, c.num_attention_heads * c.qk_head_dim, c.q_lora_rank, "q_b_proj")
    for r in (qkv, q_b):
        if isinstance(r, Refusal):
            return None, rep, r
    qn = getattr(getattr(attn, "q_a_layernorm", None), "weight", None)
    kvn = getattr(getattr(attn, "kv_a_layernorm", None), "weight", None)
    if not (_vec(qn, c.q_lora_rank, BF16) and _vec(kvn, c.kv_lora_rank, BF16)):
        return None, rep, Refusal("weights_format", "q_a_layernorm / kv_a_layernorm weight is not bf16")
    for norm in (attn.q_a_layernorm, attn.kv_a_layernorm):
        eps = getattr(norm, "variance_epsilon", c.rms_norm_eps)
        if not math.isclose(float(eps), float(c.rms_norm_eps), rel_tol=1e-6):
            return None, rep, Refusal("dims", f"RMSNorm eps {eps} but rms_norm_eps={c.rms_norm_eps}")
    rep.views += ["fused_qkv_a_proj_with_mqa", "q_b_proj", "q_a_layernorm", "kv_a_layernorm"]
    w_kc = attn.w_kc
    if not w_kc.is_contiguous():
        nbytes = w_kc.numel() * w_kc.element_size()
        if w_kc_policy == "relayout":
            attn.w_kc = w_kc = w_kc.contiguous()
            rep.relayout["w_kc"] = nbytes
        else:
            w_kc = w_kc.contiguous()
            rep.repacked["w_kc"] = nbytes
    else:
        rep.views.append("w_kc")
    indexer = None
    if kind == "full":
        idx = attn.indexer
        d, h = c.index_head_dim, c.hidden_size
        wq_b = _fp8_linear(idx.wq_b, c.index_n_heads * d, c.q_lora_rank, "indexer.wq_b")
        if isinstance(wq_b, Refusal):
            return None, rep, wq_b
        if hasattr(idx, "wk_weights_proj"):  # 0.5.23's fused layout
            kw = getattr(idx.wk_weights_proj, "weight", None)
            if not _is_mat(kw, (d + c.index_n_heads, h), BF16):
                return None, rep, Refusal("weights_format", f"indexer.wk_weights_proj.weight {getattr(kw, 'dtype', None)} "
                                                            f"{tuple(getattr(kw, 'shape', ()))}, need bf16 {(d + c.index_n_heads, h)}")
            wk = requant_bf16_fp8(kw.detach()[:d])
            rep.repacked["indexer.wk (fp8 re-quantized from wk_weights_proj)"] = wk.nbytes
            wp = kw.detach()[d:]  # rows [D_i, D_i + H_i): a contiguous view
            rep.views.append("indexer.weights_proj (rows of wk_weights_proj)")
        else:  # 0.5.14: indexer.wk (block FP8) and indexer.weights_proj (bf16)
            got, r = _indexer_weights_0514(idx, cfg)
            if r is not None:
                return None, rep, r
            wk, wp = got
            if isinstance(wk, torch.Tensor):
                wk = requant_bf16_fp8(wk.detach())
                rep.repacked["indexer.wk (fp8 re-quantized from bf16)"] = wk.nbytes
            else:
                rep.views.append("indexer.wk")
            wp = wp.detach()
            rep.views.append("indexer.weights_proj")
        kn = idx.k_norm
        if not (_vec(kn.weight, d, torch.float32) and _vec(kn.bias, d, torch.float32)):
            return None, rep, Refusal("indexer_format", "k_norm weight/bias is not fp32 [index_head_dim]")
        indexer = IndexerWeights(wq_b=wq_b, wk=wk, k_norm_weight=kn.weight.detach(), k_norm_bias=kn.bias.detach(),
                                 weights_proj=wp)
        rep.views += ["indexer.wq_b", "indexer.k_norm"]
    w8 = w8s = None
    if w_kc_fp8:
        got = _w_kc_fp8(attn, c)
        if isinstance(got, str):
            rep.notes["w_kc_fp8"] = got
        else:
            w8, w8s = got
            rep.repacked["w_kc_fp8 (k_nope rows of kv_b_proj, + scales)"] = w8.nbytes + w8s.nbytes
    w = AttnWeights(input_norm=None, qkv_a=qkv, q_a_norm=qn.detach(), kv_a_norm=kvn.detach(), q_b=q_b, w_kc=w_kc,
                    w_vc=None, o_proj=None, indexer=indexer, w_kc_fp8=w8, w_kc_scale=w8s)
    return w, rep, None


def _w_kc_fp8(attn: Any, cfg: Glm5Config) -> tuple[torch.Tensor, torch.Tensor] | str:
    """(w_kc8, w_kc_scale) from kv_b_proj's block-FP8 weight, or why not (a message)."""
    from ...ref.fp8 import w_kc_fp8_from_kv_b

    c = cfg
    lin = getattr(attn, "kv_b_proj", None)
    w = getattr(lin, "weight", None)
    s = getattr(lin, "weight_scale_inv", None)
    rows = c.num_attention_heads * (c.qk_nope_head_dim + c.v_head_dim)
    if not _is_mat(w, (rows, c.kv_lora_rank), torch.float8_e4m3fn):
        return f"kv_b_proj.weight {getattr(w, 'dtype', None)} {tuple(getattr(w, 'shape', ()))}, need e4m3 {(rows, c.kv_lora_rank)}"
    if not _is_mat(s, (-(-rows // 128), c.kv_lora_rank // 128), torch.float32):
        return f"kv_b_proj.weight_scale_inv {getattr(s, 'dtype', None)} {tuple(getattr(s, 'shape', ()))}, need fp32 128x128 blocks"
    return w_kc_fp8_from_kv_b(w.detach(), s.detach(), c.num_attention_heads, c.qk_nope_head_dim)


# ---- per-call step views --------------------------------------------------------------------------------

@dataclass
class StepViews:
    m: int
    positions: torch.Tensor  # [M] int64
    out_cache_loc: torch.Tensor  # [M] int64 / int32: physical slot (MLA pool and index-K pool)
    seq_lens: torch.Tensor | None = None  # [M] int32, including the new token (full only)
    block_table: torch.Tensor | None = None  # [M, P] int32, 64-token pages (full only)
    index_k_cache: torch.Tensor | None = None  # [pages, 64 * 132] uint8 (full only)
    topk_physical: bool = True  # the DSA backend wants physical slots (fused top-k) or logical positions


def sglang_module(name: str) -> Any:
    """An SGLang module only if this process already imported SGLang (a serving process): never pay the
    import (seconds, and it fails on CPU boxes without SGLang's import chain) from a lookup."""
    mod = sys.modules.get(name)
    if mod is not None or "sglang.srt" not in sys.modules:
        return mod
    try:
        return importlib.import_module(name)
    except Exception:  # noqa: BLE001 - another release's layout
        return None


def attn_backend(forward_batch: Any) -> Any:
    fc = sglang_module("sglang.srt.model_executor.forward_context")
    if fc is not None:
        try:
            return fc.get_attn_backend()
        except Exception:  # noqa: BLE001 - no forward context set: the batch's own
            pass
    return getattr(forward_batch, "attn_backend", None)


def topk_physical(backend: Any) -> bool:
    """Does the DSA backend consume physical KV slots (top-k fused with the page-table transform)?
    0.5.23: `backend.use_fused_topk`; 0.5.14: the env flag SGLANG_DSA_FUSE_TOPK (default on)."""
    v = getattr(backend, "use_fused_topk", None)
    if v is not None:
        return bool(v)
    env = sglang_module("sglang.srt.environ")
    if env is not None and hasattr(getattr(env, "envs", None), "SGLANG_DSA_FUSE_TOPK"):
        return bool(env.envs.SGLANG_DSA_FUSE_TOPK.get())
    return os.environ.get("SGLANG_DSA_FUSE_TOPK", "1").lower() not in ("0", "false", "no")


def check_pool(pool: Any, cfg: Glm5Config) -> Refusal | None:
    """A plain DSATokenToKVPool (not a subclass that shards / splits / swaps pages) with 64-token index pages."""
    if pool is None:
        return Refusal("no_metadata", "no token_to_kv_pool")
    if type(pool).__name__ != "DSATokenToKVPool":
        return Refusal("kv_pool", type(pool).__name__)
    page = getattr(pool, "index_page_size", getattr(pool, "page_size", None))
    if page != INDEX_K_PAGE_TOKENS or int(getattr(pool, "index_kpool", 1) or 1) != 1:
        return Refusal("kv_pool", f"index page size {page}, index_kpool {getattr(pool, 'index_kpool', 1)}")
    if getattr(pool, "index_head_dim", cfg.index_head_dim) != cfg.index_head_dim or \
            getattr(pool, "quant_block_size", cfg.index_head_dim) != cfg.index_head_dim:
        return Refusal("kv_pool", "index head dim / quant block is not the indexer head dim (one scale per token)")
    return None


def step_views(attn: Any, cfg: Glm5Config, kind: str, positions: Any, hidden: Any, forward_batch: Any
               ) -> StepViews | Refusal:
    if isinstance(hidden, (tuple, list)):
        return Refusal("hidden_tuple")
    if not isinstance(hidden, torch.Tensor) or hidden.dtype != BF16 or hidden.dim() != 2 or \
            hidden.shape[1] != cfg.hidden_size or not hidden.is_contiguous():
        return Refusal("shapes", f"hidden_states {getattr(hidden, 'dtype', None)} {tuple(getattr(hidden, 'shape', ()))}")
    m = int(hidden.shape[0])
    if m > MAX_TOKENS:
        return Refusal("too_many_tokens", f"M={m}")
    loc = getattr(forward_batch, "out_cache_loc", None)
    if not isinstance(positions, torch.Tensor) or positions.dtype != torch.int64 or tuple(positions.shape) != (m,):
        return Refusal("shapes", f"positions {getattr(positions, 'dtype', None)} {tuple(getattr(positions, 'shape', ()))}")
    if not isinstance(loc, torch.Tensor) or loc.dtype not in (torch.int64, torch.int32) or tuple(loc.shape) != (m,) \
            or not loc.is_contiguous():
        return Refusal("shapes", f"out_cache_loc {getattr(loc, 'dtype', None)} {tuple(getattr(loc, 'shape', ()))} for M={m}")
    v = StepViews(m, positions.contiguous(), loc)
    if kind != "full":
        return v
    backend = attn_backend(forward_batch)
    if backend is None:
        return Refusal("no_metadata", "no attention backend")
    if getattr(backend, "hisparse_coordinator", None) is not None:
        return Refusal("kv_pool", "hisparse")
    if int(getattr(backend, "dsa_index_kpool", 1) or 1) > 1:
        return Refusal("kv_pool", "dsa_index_kpool > 1")
    pool = getattr(backend, "token_to_kv_pool", None) or getattr(forward_batch, "token_to_kv_pool", None)
    r = check_pool(pool, cfg)
    if r is not None:
        return r
    md = backend.get_indexer_metadata(attn.layer_id, forward_batch)
    if md is None:
        return Refusal("no_metadata", "get_indexer_metadata returned None")
    sl, bt = md.get_seqlens_int32(), md.get_page_table_64()
    if not isinstance(sl, torch.Tensor) or sl.dtype != torch.int32 or sl.dim() != 1 or sl.shape[0] != m \
            or not sl.is_contiguous():
        return Refusal("shapes", f"seq_lens {getattr(sl, 'dtype', None)} {tuple(getattr(sl, 'shape', ()))} for M={m}")
    if not isinstance(bt, torch.Tensor) or bt.dtype != torch.int32 or bt.dim() != 2 or bt.shape[0] != m \
            or (bt.shape[1] > 1 and bt.stride(1) != 1) or bt.shape[1] == 0:
        return Refusal("shapes", f"page_table_64 {getattr(bt, 'dtype', None)} {tuple(getattr(bt, 'shape', ()))} for M={m}")
    buf = pool.get_index_k_with_scale_buffer(attn.layer_id)
    if not isinstance(buf, torch.Tensor) or buf.dtype != torch.uint8 or buf.dim() != 2 or \
            buf.shape[1] != index_k_page_bytes(cfg.index_head_dim) or not buf.is_contiguous():
        return Refusal("kv_pool", f"index-K buffer {getattr(buf, 'dtype', None)} {tuple(getattr(buf, 'shape', ()))}")
    v.seq_lens, v.block_table, v.index_k_cache = sl, bt, buf
    v.topk_physical = topk_physical(backend)
    return v


def core_extras(sig: SeamSignature) -> tuple:
    """The tuple tail after llama_4_scaling: () on 0.5.14, (fusion_plan=None,) on 0.5.23."""
    return (None,) if sig.has_fusion_plan else ()
