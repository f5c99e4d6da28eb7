"""GLM-5 model configuration: every field the layer math needs, parsed from a Hugging Face config.json.

Shape-defining fields are required (a silently defaulted hidden size would compute garbage);
behavioural knobs default to the GLM-5 values of spec/glm5_layer.md section 1.
"""
from __future__ import annotations

import dataclasses
import json
import math
import os
from dataclasses import dataclass, field
from typing import Any, Mapping

ARCHITECTURE = "GlmMoeDsaForCausalLM"
FP8_BLOCK = 128  # 128x128 weight blocks, 1x128 activation groups
INDEX_K_PAGE_TOKENS = 64  # physical page size of the index-K cache (SGLang requires 64)
INDEXER_K_NORM_EPS = 1e-6  # LayerNorm eps of indexer.k_norm (not a config field)
INDEX_QK_SCALE_FLOOR = 1e-4  # s = max(amax, 1e-4) / 448 for indexer q/k quant
ACT_QUANT_EPS = 1e-10  # s = max(amax, eps) / 448 for 1x128 activation quant
FP8_MAX = 448.0


class ConfigError(ValueError):
    """A config.json field is missing, has the wrong type, or is inconsistent."""


# Fields whose absence is an error: they define tensor shapes.
_REQUIRED_INT = (
    "hidden_size", "num_hidden_layers", "num_attention_heads", "q_lora_rank", "kv_lora_rank",
    "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "index_n_heads", "index_head_dim",
    "index_topk", "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size",
    "intermediate_size", "vocab_size",
)

# Behavioural fields with their GLM-5 defaults (spec section 1).
_DEFAULTS: dict[str, Any] = {
    "num_key_value_heads": None,  # -> num_attention_heads
    "n_shared_experts": 1,
    "routed_scaling_factor": 2.5,
    "n_group": 1,
    "topk_group": 1,
    "norm_topk_prob": True,
    "topk_method": "noaux_tc",
    "scoring_func": "sigmoid",
    "first_k_dense_replace": 3,
    "moe_layer_freq": 1,
    "hidden_act": "silu",
    "rms_norm_eps": 1e-5,
    "max_position_embeddings": 202752,
    "rope_interleave": True,
    "indexer_rope_interleave": True,
    "index_topk_freq": 1,
    "index_skip_topk_offset": 0,
    "num_nextn_predict_layers": 0,
    "tie_word_embeddings": False,
}
_DEFAULT_ROPE_THETA = 1_000_000.0


@dataclass(frozen=True)
class QuantConfig:
    """FP8 block quantization as in the checkpoint's quantization_config (None = bf16 checkpoint)."""

    fmt: str = "e4m3"
    activation_scheme: str = "dynamic"
    weight_block_size: tuple[int, int] = (FP8_BLOCK, FP8_BLOCK)
    modules_to_not_convert: tuple[str, ...] = ()


@dataclass(frozen=True)
class Glm5Config:
    hidden_size: int
    num_hidden_layers: int
    num_attention_heads: int
    q_lora_rank: int
    kv_lora_rank: int
    qk_nope_head_dim: int
    qk_rope_head_dim: int
    v_head_dim: int
    index_n_heads: int
    index_head_dim: int
    index_topk: int
    n_routed_experts: int
    num_experts_per_tok: int
    moe_intermediate_size: int
    intermediate_size: int
    vocab_size: int
    num_key_value_heads: int = 64
    n_shared_experts: int = 1
    routed_scaling_factor: float = 2.5
    n_group: int = 1
    topk_group: int = 1
    norm_topk_prob: bool = True
    topk_method: str = "noaux_tc"
    scoring_func: str = "sigmoid"
    first_k_dense_replace: int = 3
    moe_layer_freq: int = 1
    hidden_act: str = "silu"
    rms_norm_eps: float = 1e-5
    max_position_embeddings: int = 202752
    rope_theta: float = _DEFAULT_ROPE_THETA
    rope_interleave: bool = True
    indexer_rope_interleave: bool = True
    index_topk_freq: int = 1
    index_skip_topk_offset: int = 0
    num_nextn_predict_layers: int = 0
    tie_word_embeddings: bool = False
    quant: QuantConfig | None = field(default_factory=QuantConfig)
    source: str = "<dict>"  # file the config came from, for error messages

    # ---- derived quantities -------------------------------------------------------------
    @property
    def qk_head_dim(self) -> int:
        return self.qk_nope_head_dim + self.qk_rope_head_dim

    @property
    def qkv_a_out(self) -> int:
        """N of the fused QKV-A GEMM: q_lora | c_kv | k_pe (2624 for GLM-5)."""
        return self.q_lora_rank + self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def kv_cache_dim(self) -> int:
        """Latent MLA KV entry per token: c_kv | k_pe (576 for GLM-5)."""
        return self.kv_lora_rank + self.qk_rope_head_dim

    @property
    def softmax_scale(self) -> float:
        return self.qk_head_dim ** -0.5

    @property
    def index_weight_scale(self) -> float:
        """Head-gate fold factor n_heads^-0.5 * head_dim^-0.5 (spec section 3, row 8)."""
        return self.index_n_heads ** -0.5 * self.index_head_dim ** -0.5

    @property
    def index_k_page_bytes(self) -> int:
        """One index-K cache page: 64 x head_dim fp8 values followed by 64 fp32 scales (8448 B)."""
        return INDEX_K_PAGE_TOKENS * (self.index_head_dim + 4)

    @property
    def num_routed_plus_shared(self) -> int:
        return self.n_routed_experts + self.n_shared_experts

    def is_moe_layer(self, layer: int) -> bool:
        return layer >= self.first_k_dense_replace and layer % self.moe_layer_freq == 0

    def is_full_indexer_layer(self, layer: int) -> bool:
        """GLM-5.2 IndexShare: 'full' layers run the indexer, the others reuse the previous top-k.

        transformers' rule: full iff max(layer - offset + 1, 0) % freq == 0. The MTP layers
        (index >= num_hidden_layers) always run it.
        """
        if layer >= self.num_hidden_layers or self.index_topk_freq <= 1:
            return True
        return max(layer - self.index_skip_topk_offset + 1, 0) % self.index_topk_freq == 0

    @property
    def full_indexer_layers(self) -> list[int]:
        return [i for i in range(self.num_hidden_layers) if self.is_full_indexer_layer(i)]

    @property
    def is_fp8(self) -> bool:
        return self.quant is not None

    def replace(self, **changes: Any) -> "Glm5Config":
        return dataclasses.replace(self, **changes)

    # ---- construction ---------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Mapping[str, Any], source: str = "<dict>") -> "Glm5Config":
        return _parse(d, source)

    @classmethod
    def from_file(cls, path: str | os.PathLike) -> "Glm5Config":
        p = os.fspath(path)
        if os.path.isdir(p):
            p = os.path.join(p, "config.json")
        try:
            with open(p, encoding="utf-8") as f:
                d = json.load(f)
        except FileNotFoundError:
            raise ConfigError(f"{p}: no such config file") from None
        except json.JSONDecodeError as e:
            raise ConfigError(f"{p}: not valid JSON ({e})") from None
        if not isinstance(d, dict):
            raise ConfigError(f"{p}: top level must be a JSON object, got {type(d).__name__}")
        return _parse(d, p)

    @classmethod
    def preset(cls, name: str) -> "Glm5Config":
        """'glm5' / 'glm5.2' (shipped configs) or 'small' (shrunk dims for CPU tests)."""
        if name == "small":
            return small_config()
        here = os.path.join(os.path.dirname(__file__), "configs", f"{name}.json")
        if not os.path.exists(here):
            raise ConfigError(f"unknown preset {name!r}; choose glm5, glm5.2 or small")
        return cls.from_file(here)

    def to_hf_dict(self) -> dict[str, Any]:
        """The HF config.json form (with the keys SGLang reads)."""
        d: dict[str, Any] = {
            "architectures": [ARCHITECTURE],
            "model_type": "glm_moe_dsa",
        }
        for f in dataclasses.fields(self):
            if f.name in ("quant", "source", "rope_theta"):
                continue
            d[f.name] = getattr(self, f.name)
        d["head_dim"] = self.qk_rope_head_dim
        d["rope_parameters"] = {"rope_theta": self.rope_theta, "rope_type": "default"}
        d["attention_bias"] = False
        d["bos_token_id"] = 0
        d["eos_token_id"] = 1
        d["torch_dtype"] = "bfloat16"
        if self.quant is not None:
            d["quantization_config"] = {
                "quant_method": "fp8",
                "fmt": self.quant.fmt,
                "activation_scheme": self.quant.activation_scheme,
                "weight_block_size": list(self.quant.weight_block_size),
                "modules_to_not_convert": list(self.quant.modules_to_not_convert),
            }
        return d


def _err(source: str, key: str, msg: str) -> ConfigError:
    return ConfigError(f"{source}: field '{key}' {msg}")


def _get_int(d: Mapping[str, Any], key: str, source: str, *, minimum: int = 1) -> int:
    v = d[key]
    if isinstance(v, bool) or not isinstance(v, int):
        raise _err(source, key, f"must be an integer, got {v!r}")
    if v < minimum:
        raise _err(source, key, f"must be >= {minimum}, got {v}")
    return v


def _get_typed(d: Mapping[str, Any], key: str, source: str, default: Any) -> Any:
    if key not in d or d[key] is None:
        return default
    v = d[key]
    if isinstance(default, bool):
        if not isinstance(v, bool):
            raise _err(source, key, f"must be true/false, got {v!r}")
    elif isinstance(default, int):
        if isinstance(v, bool) or not isinstance(v, int):
            raise _err(source, key, f"must be an integer, got {v!r}")
    elif isinstance(default, float):
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise _err(source, key, f"must be a number, got {v!r}")
        v = float(v)
    elif isinstance(default, str):
        if not isinstance(v, str):
            raise _err(source, key, f"must be a string, got {v!r}")
    return v


def _rope_theta(d: Mapping[str, Any], source: str) -> float:
    # transformers >= 4.56 uses rope_parameters; older configs carry rope_theta / rope_scaling.
    rp = d.get("rope_parameters")
    if rp is not None:
        if not isinstance(rp, dict):
            raise _err(source, "rope_parameters", f"must be an object, got {rp!r}")
        rtype = rp.get("rope_type", "default")
        if rtype != "default":
            raise _err(source, "rope_parameters.rope_type",
                       f"is {rtype!r}; only 'default' RoPE (no YaRN) is supported for GLM-5")
        theta = rp.get("rope_theta", d.get("rope_theta", _DEFAULT_ROPE_THETA))
    else:
        rs = d.get("rope_scaling")
        if rs not in (None, {}) and (not isinstance(rs, dict) or rs.get("rope_type", rs.get("type")) not in (None, "default")):
            raise _err(source, "rope_scaling", f"is {rs!r}; only default RoPE is supported for GLM-5")
        theta = d.get("rope_theta", _DEFAULT_ROPE_THETA)
    if isinstance(theta, bool) or not isinstance(theta, (int, float)) or theta <= 0:
        raise _err(source, "rope_theta", f"must be a positive number, got {theta!r}")
    return float(theta)


def _quant(d: Mapping[str, Any], source: str) -> QuantConfig | None:
    qc = d.get("quantization_config")
    if qc is None:
        return None
    if not isinstance(qc, dict):
        raise _err(source, "quantization_config", f"must be an object, got {qc!r}")
    method = qc.get("quant_method")
    if method != "fp8":
        raise _err(source, "quantization_config.quant_method", f"is {method!r}; only 'fp8' is supported")
    fmt = qc.get("fmt", "e4m3")
    if fmt != "e4m3":
        raise _err(source, "quantization_config.fmt", f"is {fmt!r}; only 'e4m3' is supported")
    scheme = qc.get("activation_scheme", "dynamic")
    if scheme != "dynamic":
        raise _err(source, "quantization_config.activation_scheme", f"is {scheme!r}; only 'dynamic' is supported")
    bs = qc.get("weight_block_size")
    if bs is None:
        raise _err(source, "quantization_config.weight_block_size", "is missing (block-FP8 128x128 expected)")
    if list(bs) != [FP8_BLOCK, FP8_BLOCK]:
        raise _err(source, "quantization_config.weight_block_size", f"is {bs!r}; only [128, 128] is supported")
    skip = qc.get("modules_to_not_convert") or []
    return QuantConfig(fmt=fmt, activation_scheme=scheme, weight_block_size=(FP8_BLOCK, FP8_BLOCK),
                       modules_to_not_convert=tuple(skip))


def _parse(d: Mapping[str, Any], source: str) -> Glm5Config:
    archs = d.get("architectures")
    if archs is None:
        raise _err(source, "architectures", f"is missing (expected [\"{ARCHITECTURE}\"])")
    if not isinstance(archs, list) or ARCHITECTURE not in archs:
        raise _err(source, "architectures", f"is {archs!r}; glm5_fastpath supports only {ARCHITECTURE}")
    kw: dict[str, Any] = {}
    for key in _REQUIRED_INT:
        if key not in d or d[key] is None:
            raise _err(source, key, "is missing (required: it defines tensor shapes)")
        kw[key] = _get_int(d, key, source)
    for key, default in _DEFAULTS.items():
        if key == "num_key_value_heads":
            kw[key] = _get_typed(d, key, source, kw["num_attention_heads"])
            continue
        kw[key] = _get_typed(d, key, source, default)
    kw["rope_theta"] = _rope_theta(d, source)
    kw["quant"] = _quant(d, source)
    cfg = Glm5Config(source=source, **kw)
    _validate(cfg)
    return cfg


def _validate(c: Glm5Config) -> None:
    s = c.source

    def bad(key: str, msg: str) -> ConfigError:
        return _err(s, key, msg)

    if c.hidden_act != "silu":
        raise bad("hidden_act", f"is {c.hidden_act!r}; only 'silu' is supported")
    if c.scoring_func != "sigmoid":
        raise bad("scoring_func", f"is {c.scoring_func!r}; only 'sigmoid' is supported")
    if c.topk_method != "noaux_tc":
        raise bad("topk_method", f"is {c.topk_method!r}; only 'noaux_tc' is supported")
    if c.n_group != 1 or c.topk_group != 1:
        raise bad("n_group", f"n_group={c.n_group}, topk_group={c.topk_group}; only 1/1 (no grouped routing) is supported")
    if c.num_key_value_heads != c.num_attention_heads:
        raise bad("num_key_value_heads", f"is {c.num_key_value_heads}; MLA needs it equal to num_attention_heads={c.num_attention_heads}")
    if c.qk_rope_head_dim % 2:
        raise bad("qk_rope_head_dim", f"must be even for RoPE, got {c.qk_rope_head_dim}")
    if c.index_head_dim < c.qk_rope_head_dim:
        raise bad("index_head_dim", f"({c.index_head_dim}) must be >= qk_rope_head_dim ({c.qk_rope_head_dim}): the indexer ropes its leading qk_rope_head_dim dims")
    if c.num_experts_per_tok > c.n_routed_experts:
        raise bad("num_experts_per_tok", f"({c.num_experts_per_tok}) exceeds n_routed_experts ({c.n_routed_experts})")
    if c.n_shared_experts not in (0, 1):
        raise bad("n_shared_experts", f"is {c.n_shared_experts}; only 0 or 1 is supported")
    if c.first_k_dense_replace < 0:
        raise bad("first_k_dense_replace", f"must be >= 0, got {c.first_k_dense_replace}")
    if c.moe_layer_freq < 1:
        raise bad("moe_layer_freq", f"must be >= 1, got {c.moe_layer_freq}")
    if c.index_topk_freq < 1:
        raise bad("index_topk_freq", f"must be >= 1, got {c.index_topk_freq}")
    if c.index_skip_topk_offset < 0:
        raise bad("index_skip_topk_offset", f"must be >= 0, got {c.index_skip_topk_offset}")
    if c.rms_norm_eps <= 0:
        raise bad("rms_norm_eps", f"must be > 0, got {c.rms_norm_eps}")
    if not (c.rope_interleave and c.indexer_rope_interleave):
        raise bad("rope_interleave", "GLM-5 uses interleaved (GPT-J) RoPE for MLA and the indexer; "
                  f"got rope_interleave={c.rope_interleave}, indexer_rope_interleave={c.indexer_rope_interleave}")
    if c.quant is not None:
        for key in ("hidden_size", "q_lora_rank", "moe_intermediate_size", "intermediate_size"):
            v = getattr(c, key)
            if v % FP8_BLOCK:
                raise bad(key, f"is {v}; block-FP8 GEMMs need K to be a multiple of {FP8_BLOCK}")


def small_config(**overrides: Any) -> Glm5Config:
    """A GLM-5-shaped config with shrunk dims for fast CPU tests (same structure, same ratios where cheap).

    K dims stay multiples of 128 so block-FP8 works unchanged; some N dims are deliberately not.
    """
    base = dict(
        hidden_size=512, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=4,
        q_lora_rank=256, kv_lora_rank=128, qk_nope_head_dim=64, qk_rope_head_dim=32, v_head_dim=64,
        index_n_heads=4, index_head_dim=64, index_topk=64, n_routed_experts=16, num_experts_per_tok=4,
        moe_intermediate_size=128, intermediate_size=384, vocab_size=1024, first_k_dense_replace=1,
        max_position_embeddings=4096, source="<preset small>",
    )
    base.update(overrides)
    cfg = Glm5Config(**base)
    _validate(cfg)
    return cfg
