"""Per-layer weights of GLM-5 in the runtime form the reference and the kernels consume.

One table (`layer_tensor_specs`) names every checkpoint tensor of a layer with its HF name, shape,
dtype and init scale. The synthetic-checkpoint writer, the in-memory generator and the loader all
go through it, so "generated in memory" and "written then loaded" are the same weights.

Runtime form (what SGLang holds at TP=1, spec section 2):
- q_a_proj and kv_a_proj_with_mqa fused into one FP8 QKV-A weight [q_lora + kv_lora + rope, H];
- kv_b_proj dequantized to bf16 and split into w_kc [heads, nope, kv_lora] (W_UK, used by D2)
  and w_vc [heads, kv_lora, v] (W_UV, attention core);
- the indexer's wk kept FP8 (our B1 path) and weights_proj bf16 (C0); k_norm in fp32;
- the shared expert stacked as expert index n_routed_experts (SGLang's fused shared expert).
"""
from __future__ import annotations

import zlib
from dataclasses import dataclass
from typing import Callable, Iterator

import torch

from .config import FP8_BLOCK, Glm5Config
from .ref.fp8 import dequant_weight_block, quant_weight_block, w_kc_fp8_from_kv_b

BF16 = torch.bfloat16


@dataclass
class Fp8Linear:
    """Block-FP8 weight [N, K] e4m3 with weight_scale_inv [ceil(N/128), ceil(K/128)] fp32."""

    weight: torch.Tensor
    scale_inv: torch.Tensor

    @property
    def shape(self) -> tuple[int, int]:
        return tuple(self.weight.shape)  # type: ignore[return-value]

    def dequant(self) -> torch.Tensor:
        return dequant_weight_block(self.weight, self.scale_inv)

    def to(self, device) -> "Fp8Linear":
        return Fp8Linear(self.weight.to(device), self.scale_inv.to(device))

    @property
    def nbytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() + self.scale_inv.numel() * 4


@dataclass
class IndexerWeights:
    wq_b: Fp8Linear  # [idx_heads * idx_dim, q_lora]
    wk: Fp8Linear  # [idx_dim, H]
    k_norm_weight: torch.Tensor  # [idx_dim] fp32
    k_norm_bias: torch.Tensor  # [idx_dim] fp32
    weights_proj: torch.Tensor  # [idx_heads, H] bf16 (head gate, C0)


@dataclass
class AttnWeights:
    input_norm: torch.Tensor  # [H] bf16
    qkv_a: Fp8Linear  # [q_lora + kv_lora + rope, H]
    q_a_norm: torch.Tensor  # [q_lora] bf16
    kv_a_norm: torch.Tensor  # [kv_lora] bf16
    q_b: Fp8Linear  # [heads * (nope + rope), q_lora]
    w_kc: torch.Tensor  # [heads, nope, kv_lora] bf16 (W_UK)
    w_vc: torch.Tensor  # [heads, kv_lora, v] bf16 (W_UV, attention core)
    o_proj: Fp8Linear  # [H, heads * v]
    indexer: IndexerWeights | None  # None on GLM-5.2 shared layers
    # W_UK in the checkpoint's FP8 form (ref.fp8.w_kc_fp8_from_kv_b; dequant_w_kc of them is bitwise w_kc): the
    # D2 W8 kernel reads half the bytes of w_kc. None when kv_b_proj is not FP8 (a bf16 checkpoint).
    w_kc_fp8: torch.Tensor | None = None  # [heads, nope, kv_lora] e4m3
    w_kc_scale: torch.Tensor | None = None  # [heads, nope, kv_lora / 128] fp32, one scale per row and column block


class ExpertStore:
    """Experts of one MoE layer, fetched lazily by index (0..E-1 routed, E = fused shared expert).

    `get(e)` returns (w13, w2): w13 = gate ‖ up [2I, H], w2 = down [H, I], both Fp8Linear.
    Lazy so a full-size layer (257 x 37.8 MB) need not sit in memory: the reference touches only
    the routed experts.
    """

    def __init__(self, n: int, fetch: Callable[[int], tuple[Fp8Linear, Fp8Linear]], cache: bool = True):
        self.n = n
        self._fetch = fetch
        self._cache: dict[int, tuple[Fp8Linear, Fp8Linear]] | None = {} if cache else None

    def __len__(self) -> int:
        return self.n

    def get(self, e: int) -> tuple[Fp8Linear, Fp8Linear]:
        if not 0 <= e < self.n:
            raise IndexError(f"expert {e} out of range [0, {self.n})")
        if self._cache is None:
            return self._fetch(e)
        if e not in self._cache:
            self._cache[e] = self._fetch(e)
        return self._cache[e]

    def __iter__(self) -> Iterator[tuple[Fp8Linear, Fp8Linear]]:
        for e in range(self.n):
            yield self.get(e)


@dataclass
class MoEWeights:
    gate: torch.Tensor  # router [E, H] bf16
    e_score_correction_bias: torch.Tensor  # [E] fp32
    experts: ExpertStore  # E routed (+1 shared at index E)


@dataclass
class DenseMLPWeights:
    gate_up: Fp8Linear  # [2 * intermediate, H]
    down: Fp8Linear  # [H, intermediate]


@dataclass
class LayerWeights:
    layer: int
    attn: AttnWeights
    post_attn_norm: torch.Tensor  # [H] bf16
    mlp: MoEWeights | DenseMLPWeights


# ---- the tensor table ------------------------------------------------------------------------------

@dataclass(frozen=True)
class TensorSpec:
    name: str  # HF checkpoint name
    shape: tuple[int, ...]
    kind: str  # "fp8" (plus name_scale_inv), "bf16", "norm" (bf16 ~1), "bias" (fp32 ~0), "ln_bias" (bf16 ~0)
    std: float = 0.0


def _lin(name: str, n: int, k: int, kind: str = "fp8") -> TensorSpec:
    # K^-0.5 keeps activations O(1) through the layer: realistic magnitudes for fp8 quantization.
    return TensorSpec(name, (n, k), kind, k ** -0.5)


def layer_tensor_specs(cfg: Glm5Config, layer: int) -> list[TensorSpec]:
    """Every checkpoint tensor of decoder layer `layer`, HF names (DeepSeek-V3.2 / GLM-5 layout)."""
    c, p = cfg, f"model.layers.{layer}."
    fp8 = "fp8" if c.is_fp8 else "bf16"
    H, nh = c.hidden_size, c.num_attention_heads
    specs = [
        TensorSpec(p + "input_layernorm.weight", (H,), "norm", 0.05),
        TensorSpec(p + "post_attention_layernorm.weight", (H,), "norm", 0.05),
        _lin(p + "self_attn.q_a_proj.weight", c.q_lora_rank, H, fp8),
        TensorSpec(p + "self_attn.q_a_layernorm.weight", (c.q_lora_rank,), "norm", 0.05),
        _lin(p + "self_attn.q_b_proj.weight", nh * c.qk_head_dim, c.q_lora_rank, fp8),
        _lin(p + "self_attn.kv_a_proj_with_mqa.weight", c.kv_lora_rank + c.qk_rope_head_dim, H, fp8),
        TensorSpec(p + "self_attn.kv_a_layernorm.weight", (c.kv_lora_rank,), "norm", 0.05),
        _lin(p + "self_attn.kv_b_proj.weight", nh * (c.qk_nope_head_dim + c.v_head_dim), c.kv_lora_rank, fp8),
        _lin(p + "self_attn.o_proj.weight", H, nh * c.v_head_dim, fp8),
    ]
    if c.is_full_indexer_layer(layer):
        ip = p + "self_attn.indexer."
        specs += [
            _lin(ip + "wq_b.weight", c.index_n_heads * c.index_head_dim, c.q_lora_rank, fp8),
            _lin(ip + "wk.weight", c.index_head_dim, H, fp8),
            TensorSpec(ip + "k_norm.weight", (c.index_head_dim,), "norm", 0.05),
            TensorSpec(ip + "k_norm.bias", (c.index_head_dim,), "ln_bias", 0.02),
            _lin(ip + "weights_proj.weight", c.index_n_heads, H, "bf16"),
        ]
    if c.is_moe_layer(layer):
        I, E = c.moe_intermediate_size, c.n_routed_experts
        specs += [
            TensorSpec(p + "mlp.gate.weight", (E, H), "bf16", 0.02),  # N(0, 0.02): spread, realistic routing
            TensorSpec(p + "mlp.gate.e_score_correction_bias", (E,), "bias", 0.01),
        ]
        experts = [f"mlp.experts.{e}." for e in range(E)]
        if c.n_shared_experts:
            experts.append("mlp.shared_experts.")
        for ep in experts:
            specs += [_lin(p + ep + "gate_proj.weight", I, H, fp8), _lin(p + ep + "up_proj.weight", I, H, fp8),
                      _lin(p + ep + "down_proj.weight", H, I, fp8)]
    else:
        I = c.intermediate_size
        specs += [_lin(p + "mlp.gate_proj.weight", I, H, fp8), _lin(p + "mlp.up_proj.weight", I, H, fp8),
                  _lin(p + "mlp.down_proj.weight", H, I, fp8)]
    return specs


def model_tensor_specs(cfg: Glm5Config) -> list[TensorSpec]:
    """Non-layer tensors: embeddings, final norm, lm_head."""
    specs = [TensorSpec("model.embed_tokens.weight", (cfg.vocab_size, cfg.hidden_size), "bf16", 0.02),
             TensorSpec("model.norm.weight", (cfg.hidden_size,), "norm", 0.05)]
    if not cfg.tie_word_embeddings:
        specs.append(TensorSpec("lm_head.weight", (cfg.vocab_size, cfg.hidden_size), "bf16", cfg.hidden_size ** -0.5))
    return specs


def _generator(seed: int, name: str) -> torch.Generator:
    # A stable per-tensor stream: the same (seed, name) gives the same tensor in any order/process.
    g = torch.Generator()
    g.manual_seed((seed * 0x9E3779B1 + zlib.crc32(name.encode())) & 0x7FFF_FFFF_FFFF_FFFF)
    return g


# What each kind of tensor is stored as (fp8 weights add an fp32 <name>_scale_inv).
_KIND_DTYPE = {"bf16": BF16, "norm": BF16, "ln_bias": BF16, "bias": torch.float32, "fp8": torch.float8_e4m3fn}


def stored_layout(spec: TensorSpec) -> list[tuple[str, torch.dtype, tuple[int, ...]]]:
    """(name, dtype, shape) of what generate_tensor(spec) returns / a checkpoint stores, without generating."""
    if spec.kind not in _KIND_DTYPE:
        raise ValueError(f"unknown tensor kind {spec.kind!r} for {spec.name}")
    out = [(spec.name, _KIND_DTYPE[spec.kind], spec.shape)]
    if spec.kind == "fp8":
        n, k = spec.shape
        out.append((spec.name.removesuffix("weight") + "weight_scale_inv", torch.float32,
                    (-(-n // FP8_BLOCK), -(-k // FP8_BLOCK))))
    return out


def generate_tensor(spec: TensorSpec, seed: int) -> dict[str, torch.Tensor]:
    """Deterministic random tensor(s) for one spec, in checkpoint dtypes (fp8 adds <name>_scale_inv)."""
    layout = stored_layout(spec)
    g = _generator(seed, spec.name)
    if spec.kind == "norm":
        w = 1.0 + spec.std * torch.randn(spec.shape, generator=g)
    else:
        w = spec.std * torch.randn(spec.shape, generator=g)
    if spec.kind == "fp8":
        w8, s = quant_weight_block(w)
        return {layout[0][0]: w8, layout[1][0]: s}
    return {spec.name: w.to(layout[0][1])}


# ---- assembling runtime weights from named tensors ---------------------------------------------------

TensorSource = Callable[[str], torch.Tensor]  # HF name -> tensor (checkpoint dtype)


def _fp8(get: TensorSource, name: str) -> Fp8Linear:
    return Fp8Linear(get(name + ".weight"), get(name + ".weight_scale_inv").float())


def _dense(get: TensorSource, name: str) -> torch.Tensor:
    """A linear weight as float32 whether the checkpoint stores it FP8 (block-scaled) or bf16."""
    w = get(name + ".weight")
    if w.dtype == torch.float8_e4m3fn:
        return dequant_weight_block(w, get(name + ".weight_scale_inv"))
    return w.float()


def _as_fp8(get: TensorSource, name: str) -> Fp8Linear:
    w = get(name + ".weight")
    if w.dtype == torch.float8_e4m3fn:
        return Fp8Linear(w, get(name + ".weight_scale_inv").float())
    return Fp8Linear(*quant_weight_block(w.float()))  # bf16 checkpoint: quantize at load like an FP8 path would


def assemble_layer(cfg: Glm5Config, layer: int, get: TensorSource, device=None) -> LayerWeights:
    """Build the runtime form of one layer from a name -> tensor source (checkpoint or generator)."""
    c, p = cfg, f"model.layers.{layer}."
    dev = torch.device(device) if device is not None else torch.device("cpu")

    def T(name: str) -> torch.Tensor:
        return get(p + name).to(dev)

    def G(name: str) -> torch.Tensor:
        return get(name).to(dev)

    qa, kva = _as_fp8(G, p + "self_attn.q_a_proj"), _as_fp8(G, p + "self_attn.kv_a_proj_with_mqa")
    if c.q_lora_rank % 128:
        # Concatenating block-quantized weights is exact only on 128-row boundaries.
        w = torch.cat([qa.dequant(), kva.dequant()])
        qkv_a = Fp8Linear(*quant_weight_block(w))
    else:
        qkv_a = Fp8Linear(torch.cat([qa.weight, kva.weight]), torch.cat([qa.scale_inv, kva.scale_inv]))
    nh, nope, v, r = c.num_attention_heads, c.qk_nope_head_dim, c.v_head_dim, c.kv_lora_rank
    kv_b_w = G(p + "self_attn.kv_b_proj.weight")  # read once: the bf16 W_UK / W_UV and, if FP8, W_UK's FP8 form
    w_kc8 = w_kc_s = None
    if kv_b_w.dtype == torch.float8_e4m3fn:
        kv_b_s = G(p + "self_attn.kv_b_proj.weight_scale_inv")
        kv_b = dequant_weight_block(kv_b_w, kv_b_s)
        w_kc8, w_kc_s = w_kc_fp8_from_kv_b(kv_b_w, kv_b_s, nh, nope)
    else:
        kv_b = kv_b_w.float()
    kv_b = kv_b.view(nh, nope + v, r)
    indexer = None
    if c.is_full_indexer_layer(layer):
        ip = p + "self_attn.indexer."
        indexer = IndexerWeights(
            wq_b=_as_fp8(G, ip + "wq_b"), wk=_as_fp8(G, ip + "wk"),
            k_norm_weight=G(ip + "k_norm.weight").float(), k_norm_bias=G(ip + "k_norm.bias").float(),
            weights_proj=G(ip + "weights_proj.weight").to(BF16))
    attn = AttnWeights(
        input_norm=T("input_layernorm.weight").to(BF16), qkv_a=qkv_a,
        q_a_norm=T("self_attn.q_a_layernorm.weight").to(BF16), kv_a_norm=T("self_attn.kv_a_layernorm.weight").to(BF16),
        q_b=_as_fp8(G, p + "self_attn.q_b_proj"),
        w_kc=kv_b[:, :nope, :].contiguous().to(BF16), w_vc=kv_b[:, nope:, :].transpose(1, 2).contiguous().to(BF16),
        o_proj=_as_fp8(G, p + "self_attn.o_proj"), indexer=indexer, w_kc_fp8=w_kc8, w_kc_scale=w_kc_s)
    mlp: MoEWeights | DenseMLPWeights
    if c.is_moe_layer(layer):
        E = c.n_routed_experts

        def fetch(e: int) -> tuple[Fp8Linear, Fp8Linear]:
            ep = p + (f"mlp.experts.{e}." if e < E else "mlp.shared_experts.")
            g_, u_ = _as_fp8(G, ep + "gate_proj"), _as_fp8(G, ep + "up_proj")
            if c.moe_intermediate_size % 128:
                w13 = Fp8Linear(*quant_weight_block(torch.cat([g_.dequant(), u_.dequant()])))
            else:
                w13 = Fp8Linear(torch.cat([g_.weight, u_.weight]), torch.cat([g_.scale_inv, u_.scale_inv]))
            return w13, _as_fp8(G, ep + "down_proj")

        mlp = MoEWeights(gate=T("mlp.gate.weight").to(BF16),
                         e_score_correction_bias=T("mlp.gate.e_score_correction_bias").float(),
                         experts=ExpertStore(E + c.n_shared_experts, fetch))
    else:
        gp, up = _as_fp8(G, p + "mlp.gate_proj"), _as_fp8(G, p + "mlp.up_proj")
        if c.intermediate_size % 128:
            gate_up = Fp8Linear(*quant_weight_block(torch.cat([gp.dequant(), up.dequant()])))
        else:
            gate_up = Fp8Linear(torch.cat([gp.weight, up.weight]), torch.cat([gp.scale_inv, up.scale_inv]))
        mlp = DenseMLPWeights(gate_up=gate_up, down=_as_fp8(G, p + "mlp.down_proj"))
    return LayerWeights(layer=layer, attn=attn, post_attn_norm=T("post_attention_layernorm.weight").to(BF16), mlp=mlp)


def generated_source(cfg: Glm5Config, layer: int, seed: int) -> TensorSource:
    """A lazy name -> tensor source that generates exactly what make-checkpoint writes."""
    specs = {s.name: s for s in layer_tensor_specs(cfg, layer) + model_tensor_specs(cfg)}
    cache: dict[str, torch.Tensor] = {}

    def get(name: str) -> torch.Tensor:
        if name in cache:  # the other half of an fp8 (weight, scale_inv) pair generated earlier
            return cache.pop(name)
        base = name.removesuffix("_scale_inv") if name.endswith("weight_scale_inv") else name
        if base not in specs:
            raise KeyError(f"no tensor {name!r} in layer {layer} of this config")
        out = generate_tensor(specs[base], seed)
        if name not in out:
            raise KeyError(f"tensor {name!r} is not stored (a bf16 weight has no scale_inv)")
        t = out.pop(name)
        cache.update(out)
        return t

    return get


def random_layer(cfg: Glm5Config, layer: int, seed: int = 0, device=None) -> LayerWeights:
    """The weights of `layer` as make-checkpoint --seed `seed` would write them (experts generated lazily)."""
    return assemble_layer(cfg, layer, generated_source(cfg, layer, seed), device=device)
