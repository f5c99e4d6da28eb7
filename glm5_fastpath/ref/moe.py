"""Reference MoE of GLM-5 (layers 3-77) and dense FFN (layers 0-2): pure PyTorch, CPU and CUDA.

Mirrors SGLang's default H200 path (router GEMM -> fused top-k -> Triton block-FP8 fused_moe ->
moe_sum_reduce; spec/glm5_layer.md section 6) rounding point by rounding point. All math is fp32;
values are rounded to bf16 exactly where SGLang's kernels write bf16:

  route      l = fp32(h_bf16 . W_g^T)            (bf16 x bf16 products are exact in fp32)
             s = sigmoid(l); pick top-k of s + bias; w = s[ids] / (sum s[ids] + 1e-20)
             (unbiased scores; routed_scaling_factor NOT applied here -- it is applied in the
             combine, as SGLang's moe_sum_reduce does)
  FC1        gu = bf16(block_fp8(h8, W13))        h quantized 1x128 per token once, for all experts
  act        a  = bf16(silu(g) * u)               fp32 math, one rounding (silu_and_mul)
  FC2        y  = bf16(block_fp8(a8, W2) * w)      a re-quantized 1x128 per token; the routing weight
                                                  multiplies the fp32 accumulator before the single
                                                  bf16 rounding (fused_moe MUL_ROUTED_WEIGHT epilogue)
  shared     expert index E with weight fp32(1/2.5), i.e. exactly 1x after the combine's x2.5
             (up to the bf16 rounding of its weighted FC2 output)
  combine    out = bf16(2.5 * sum_j fp32(y_j))     slots summed in order j = 0..k (routed, then shared)

Tie-breaking in the top-k: equal choice scores keep ascending expert order (lower id wins), so
the selection is deterministic and device-independent for given scores (the kernels' own tie order
is unspecified; exact fp32 ties essentially never occur with real scores). Returned ids are ordered by
descending choice score.
"""
from __future__ import annotations

from typing import NamedTuple, Sequence

import torch

from ..config import Glm5Config
from ..weights import DenseMLPWeights, Fp8Linear, MoEWeights
from .fp8 import FP8, block_fp8_linear, quant_act_per_token

BF16 = torch.bfloat16
NORM_EPS = 1e-20  # norm_topk_prob denominator guard (HF)


class MoERouting(NamedTuple):
    """What the router chose for a batch (routed experts only; the fused shared expert is implicit)."""

    topk_ids: torch.Tensor  # [M, k] int32, by descending choice score
    topk_weights: torch.Tensor  # [M, k] fp32, normalized, without routed_scaling_factor
    logits: torch.Tensor | None  # [M, E] fp32 router logits; None when ids were passed in

    @property
    def n_distinct(self) -> int:
        return distinct_experts(self.topk_ids)


# ---- input validation ----------------------------------------------------------------------------

def _check(op: str, name: str, t: object, dtypes: Sequence[torch.dtype], shape: Sequence[int | None],
           device: torch.device | None = None) -> None:
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{op}: {name} must be a torch.Tensor, got {type(t).__name__}")
    if t.dtype not in dtypes:
        want = " or ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{op}: {name} must be {want}, got {str(t.dtype).replace('torch.', '')}")
    if t.dim() != len(shape) or any(s is not None and s != d for s, d in zip(shape, t.shape)):
        want = "[" + ", ".join("*" if s is None else str(s) for s in shape) + "]"
        raise ValueError(f"{op}: {name} must have shape {want}, got {list(t.shape)}")
    if device is not None and t.device != device:
        raise ValueError(f"{op}: {name} is on {t.device} but the input is on {device}")


def _check_fp8_linear(op: str, name: str, w: Fp8Linear, n: int | None, k: int | None,
                      device: torch.device) -> tuple[int, int]:
    _check(op, f"{name}.weight", w.weight, (FP8,), (n, k), device)
    N, K = w.weight.shape
    _check(op, f"{name}.scale_inv", w.scale_inv, (torch.float32,), (-(-N // 128), -(-K // 128)), device)
    return N, K


# ---- routing ---------------------------------------------------------------------------------------

def route(h: torch.Tensor, gate: torch.Tensor, bias: torch.Tensor, cfg: Glm5Config
          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Sigmoid + correction-bias top-k routing (noaux_tc, n_group = topk_group = 1).

    h [M, H] bf16, gate [E, H] bf16, bias [E] fp32 -> (topk_ids [M, k] int32,
    topk_weights [M, k] fp32 summing to 1 per token when norm_topk_prob, logits [M, E] fp32).
    """
    op = "route"
    E, H, k = cfg.n_routed_experts, cfg.hidden_size, cfg.num_experts_per_tok
    _check(op, "h", h, (BF16,), (None, H))
    _check(op, "gate", gate, (BF16,), (E, H), h.device)
    _check(op, "bias (e_score_correction_bias)", bias, (torch.float32,), (E,), h.device)
    logits = h.float() @ gate.float().t()  # SGLang's bf16 -> fp32 router GEMM
    scores = torch.sigmoid(logits)
    choice = scores + bias  # the bias only steers selection
    # Stable descending sort: ties keep ascending expert order, so the lower id wins (deterministic).
    ids = torch.sort(choice, dim=-1, descending=True, stable=True).indices[:, :k]
    w = scores.gather(1, ids)  # weights from the UNBIASED scores
    if cfg.norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + NORM_EPS)
    return ids.to(torch.int32), w, logits


# ---- one expert / the dense FFN ------------------------------------------------------------------

def swiglu_requant(gu: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FC1's bf16 gate || up [..., 2I] -> SwiGLU (fp32 math, one bf16 rounding, as silu_and_mul) -> 1x128 FP8
    requant: (a8 [..., I] e4m3, a_scale [..., I/128] fp32)."""
    inter = gu.shape[-1] // 2
    g, u = gu[..., :inter].float(), gu[..., inter:].float()
    a = (torch.nn.functional.silu(g) * u).to(BF16)
    lead = a.shape[:-1]
    a8, a_s = quant_act_per_token(a.reshape(-1, inter))
    return a8.reshape(*lead, inter), a_s.reshape(*lead, -1)


def _ffn_acc(op: str, h8: torch.Tensor, hs: torch.Tensor, w13: Fp8Linear, w2: Fp8Linear) -> torch.Tensor:
    """FC1 -> SwiGLU -> requant -> FC2, returning FC2's fp32 accumulator [T, H] (before the epilogue)."""
    dev = h8.device
    _check(op, "h_fp8", h8, (FP8,), (None, None))
    T, H = h8.shape
    if H % 128:
        raise ValueError(f"{op}: hidden size {H} is not a multiple of 128 (1x128 activation groups)")
    _check(op, "h_scale", hs, (torch.float32,), (T, H // 128), dev)
    n13, _ = _check_fp8_linear(op, "w13 (gate||up)", w13, None, H, dev)
    if n13 % 2:
        raise ValueError(f"{op}: w13 has {n13} rows; expected gate||up = 2*I")
    inter = n13 // 2
    if inter % 128:
        raise ValueError(f"{op}: intermediate size {inter} is not a multiple of 128 (FC2 K groups)")
    _check_fp8_linear(op, "w2 (down)", w2, H, inter, dev)
    gu = block_fp8_linear(h8, hs, w13.weight, w13.scale_inv).to(BF16)  # FC1 writes bf16
    a8, a_s = swiglu_requant(gu)
    return block_fp8_linear(a8, a_s, w2.weight, w2.scale_inv)


def expert_ffn(h_fp8: torch.Tensor, h_scale: torch.Tensor, w13: Fp8Linear, w2: Fp8Linear) -> torch.Tensor:
    """One SwiGLU expert on pre-quantized tokens: h_fp8 [T, H] e4m3 + h_scale [T, H/128] fp32
    -> y [T, H] bf16 (unweighted; FC2 output rounded once to bf16)."""
    return _ffn_acc("expert_ffn", h_fp8, h_scale, w13, w2).to(BF16)


def dense_mlp_forward(h: torch.Tensor, w: DenseMLPWeights) -> torch.Tensor:
    """Dense FFN of layers 0-2: down(silu(gate(h)) * up(h)), block-FP8 GEMMs, bf16 between them.

    Same quant points as an expert: h quantized 1x128 per token, SwiGLU output re-quantized.
    """
    op = "dense_mlp_forward"
    _check(op, "h", h, (BF16,), (None, w.gate_up.weight.shape[1]))
    h8, hs = quant_act_per_token(h)
    return _ffn_acc(op, h8, hs, w.gate_up, w.down).to(BF16)


# ---- the MoE ---------------------------------------------------------------------------------------

def _check_routing(op: str, ids: torch.Tensor, wts: torch.Tensor, M: int, E: int, dev: torch.device) -> None:
    _check(op, "topk_ids", ids, (torch.int32, torch.int64), (M, None), dev)
    k = ids.shape[1]
    if k < 1:
        raise ValueError(f"{op}: topk_ids must have at least one column, got {list(ids.shape)}")
    _check(op, "topk_weights", wts, (torch.float32,), (M, k), dev)
    if ids.numel():
        lo, hi = int(ids.min()), int(ids.max())
        if lo < 0 or hi >= E:
            raise ValueError(f"{op}: topk_ids out of range: values span [{lo}, {hi}], routed experts are [0, {E}) "
                             "(the shared expert is appended internally, do not pass it)")
        s = ids.sort(dim=1).values
        dup = (s[:, 1:] == s[:, :-1]).any(dim=1)
        if bool(dup.any()):
            r = int(dup.nonzero()[0, 0])
            raise ValueError(f"{op}: topk_ids row {r} repeats an expert: {ids[r].tolist()}")


def moe_slot_outputs(h: torch.Tensor, w: MoEWeights, cfg: Glm5Config, topk_ids: torch.Tensor,
                     topk_weights: torch.Tensor) -> torch.Tensor:
    """Weighted FC2 outputs per (token, slot): [M, k + n_shared, H] bf16 (SGLang's intermediate_cache3).

    Slot j < k holds bf16(w_j * E_{ids_j}(h)); the last slot (when cfg.n_shared_experts) holds
    bf16(fp32(1/rsf) * E_shared(h)). Only the experts actually selected are fetched and run, each once
    on all of its tokens.
    """
    op = "moe_slot_outputs"
    E, H = cfg.n_routed_experts, cfg.hidden_size
    _check(op, "h", h, (BF16,), (None, H))
    M, dev = h.shape[0], h.device
    _check_routing(op, topk_ids, topk_weights, M, E, dev)
    if len(w.experts) < E + cfg.n_shared_experts:
        raise ValueError(f"{op}: weights hold {len(w.experts)} experts, config needs {E} routed + "
                         f"{cfg.n_shared_experts} shared")
    ids, wts = topk_ids.long(), topk_weights
    if cfg.n_shared_experts:
        # Fused shared expert: id E, weight 1/rsf, so the combine's x rsf makes it exactly 1x.
        ids = torch.cat([ids, torch.full((M, 1), E, dtype=torch.long, device=dev)], dim=1)
        shared_w = torch.full((M, 1), 1.0 / cfg.routed_scaling_factor, dtype=torch.float32, device=dev)
        wts = torch.cat([wts, shared_w], dim=1)
    h8, hs = quant_act_per_token(h)  # once, shared by every expert (fused_moe quantizes its input once)
    slots = torch.zeros(M, ids.shape[1], H, dtype=BF16, device=dev)
    for e in torch.unique(ids).tolist():  # distinct experts only: practical with a lazy ExpertStore
        tok, slot = (ids == e).nonzero(as_tuple=True)
        w13, w2 = w.experts.get(e)
        acc = _ffn_acc(f"{op} (expert {e})", h8[tok], hs[tok], w13, w2)
        slots[tok, slot] = (acc * wts[tok, slot].unsqueeze(1)).to(BF16)  # weight on fp32 acc, one rounding
    return slots


def moe_combine(slots: torch.Tensor, routed_scaling_factor: float) -> torch.Tensor:
    """moe_sum_reduce: [M, S, H] bf16 -> bf16(rsf * sum_j fp32(slots[:, j])), summed in slot order."""
    _check("moe_combine", "slots", slots, (BF16,), (None, None, None))
    acc = torch.zeros(slots.shape[0], slots.shape[2], dtype=torch.float32, device=slots.device)
    for j in range(slots.shape[1]):
        acc = acc + slots[:, j].float()
    return (acc * routed_scaling_factor).to(BF16)


def moe_forward(h: torch.Tensor, w: MoEWeights, cfg: Glm5Config, topk_ids: torch.Tensor | None = None,
                topk_weights: torch.Tensor | None = None, *, return_routing: bool = False
                ) -> torch.Tensor | tuple[torch.Tensor, MoERouting]:
    """GLM-5 MoE block: h [M, H] bf16 (post-attention-norm output) -> out [M, H] bf16.

    out = bf16(rsf * (sum_k bf16(w_k E_k(h)) + bf16(E_shared(h) / rsf))). Routes with `route` unless
    topk_ids [M, k] (routed ids only) and topk_weights [M, k] fp32 (normalized, without rsf) are
    given. With return_routing=True returns (out, MoERouting).
    """
    op = "moe_forward"
    _check(op, "h", h, (BF16,), (None, cfg.hidden_size))
    if (topk_ids is None) != (topk_weights is None):
        raise ValueError(f"{op}: pass both topk_ids and topk_weights, or neither")
    logits = None
    if topk_ids is None:
        topk_ids, topk_weights, logits = route(h, w.gate, w.e_score_correction_bias, cfg)
    out = moe_combine(moe_slot_outputs(h, w, cfg, topk_ids, topk_weights), cfg.routed_scaling_factor)
    if return_routing:
        return out, MoERouting(topk_ids, topk_weights, logits)
    return out


# ---- expert-count helpers --------------------------------------------------------------------------

def distinct_experts(topk_ids: torch.Tensor) -> int:
    """Number of distinct experts in a routing (routed ids only; the shared expert is one more)."""
    return int(torch.unique(topk_ids).numel())


def expected_distinct_experts(M: int, E: int = 256, k: int = 8) -> float:
    """E * (1 - (1 - k/E)^M): distinct routed experts for M tokens under uniform independent routing."""
    if M < 0 or not 0 < k <= E:
        raise ValueError(f"expected_distinct_experts: need M >= 0 and 0 < k <= E, got M={M}, E={E}, k={k}")
    return E * (1.0 - (1.0 - k / E) ** M)
