"""Benchmark-only: give a `--load-format dummy` GLM-5 model activations of realistic size.

Why. SGLang's dummy loader fills every floating-point tensor from uniform(-1e-3, 1e-3), FP8 ones through
fp16: e4m3's smallest subnormal is 2^-9, so ~98 % of every FP8 weight becomes 0 and the rest +-2^-9, and
the fp32 block scales (weight_scale_inv) are uniform(-1e-3, 1e-3) too. Each FP8 linear layer then scales
its input by ~1e-5, and the RMSNorm weights (also +-1e-3) shrink it again. The logits are set by the
embedding and the lm_head alone, so stock and plugin produce the same greedy tokens whatever the FP8
GEMMs, attention and MoE compute. On 2026-11-29 a MoE route that ran only the first token's experts
passed that check (benchmarks/results/2026-11-29_h200_session5).

What. `realistic_dummy(model)` keeps the dummy FP8 values (their sparse +-2^-9 pattern is as good a random
matrix as any) and, in place:
- sets every norm module's 1-D weight to 1 and its bias to 0 (trained norms are O(1));
- sets each FP8 weight's block scales so the layer has unit gain for unit-variance inputs:
  scale = gain / sqrt(K * E[w^2]), with K the input features and E[w^2] the dequantised-to-be value's
  second moment measured on a strided sample of the weight itself;
- multiplies the (bf16) lm_head by the factor that gives logits of standard deviation LOGIT_STD (4) for the
  unit-RMS final hidden state. This does not change any greedy choice (all logits scale together: the
  2026-11-30 engine runs with and without it produced the same tokens); it makes the logprobs readable. Left
  at +-1e-3 the logits have std ~0.05 over 154880 tokens, every logprob is ~-log(154880), and the report's
  logprob gap says nothing; at std 4 the chosen token's logprob is ~-1 and differences between the modes show.
Activations then stay O(1) through every layer, each layer's output is comparable to the residual, and
a wrong kernel changes the greedy tokens. The values depend only on the dummy weights (deterministic per
tensor in SGLang), so stock and plugin runs get identical models.

Where. The SGLANG_EXTERNAL_MODEL_PACKAGE subclass (integrations/sglang/models/glm5_moe_dsa.py) calls it in
post_load_weights, before SGLang derives W_UK / W_UV from kv_b_proj and before our install, when
GLM5_FASTPATH_BENCH_REALISTIC_DUMMY=1; `bench offline --realistic-dummy` sets that for both modes (stock
then loads the subclass too, without GLM5_FASTPATH=1: SGLang's path with these weights).
"""
from __future__ import annotations

import math
from typing import Any

ENV = "GLM5_FASTPATH_BENCH_REALISTIC_DUMMY"
SAMPLE = 1 << 20  # weight values sampled per tensor for its second moment
SCALE_SUFFIX = "_scale_inv"  # DeepSeek-style block scales: w = w_fp8 * weight_scale_inv
LOGIT_STD = 4.0  # lm_head: logits' standard deviation for a unit-RMS final hidden state


def enabled() -> bool:
    import os

    return os.environ.get(ENV, "").strip().lower() in ("1", "true", "on", "yes")


def _fp8_dtypes() -> tuple:
    import torch

    return tuple(getattr(torch, n) for n in ("float8_e4m3fn", "float8_e4m3fnuz", "float8_e5m2") if hasattr(torch, n))


def _sample(w: Any, n: int = SAMPLE) -> Any:
    """A strided sample of about n values of w as fp32, without copying a large tensor."""
    flat = w.view(-1) if w.is_contiguous() else w[:: max(1, w.shape[0] // 64)].reshape(-1)
    step = max(1, flat.numel() // n)
    return flat[::step][:n].float()


def scale_for(w: Any, gain: float = 1.0) -> float | None:
    """The block-scale value giving the layer `gain` for unit-variance inputs, or None for an all-zero
    weight (nothing to scale)."""
    s = _sample(w)
    m2 = float((s * s).mean())
    if not m2 > 0.0:
        return None
    return gain / math.sqrt(int(w.shape[-1]) * m2)


def realistic_dummy(model: Any, gain: float = 1.0) -> dict[str, Any]:
    """Norm weights -> 1 (biases -> 0), FP8 block scales -> unit gain, lm_head -> logits of std LOGIT_STD, in
    place (module doc). Returns what it changed: {"norms": count, "fp8_scales": {param name: scale},
    "skipped": {param name: reason}, "lm_head_factor": the lm_head multiplier or None}."""
    import torch

    fp8 = _fp8_dtypes()
    out: dict[str, Any] = {"norms": 0, "fp8_scales": {}, "skipped": {}, "lm_head_factor": None}
    with torch.no_grad():
        for mname, mod in model.named_modules():
            prefix = f"{mname}." if mname else ""
            if "norm" in type(mod).__name__.lower():
                w, b = getattr(mod, "weight", None), getattr(mod, "bias", None)
                if isinstance(w, torch.Tensor) and w.dim() == 1 and w.is_floating_point():
                    w.fill_(1.0)
                    out["norms"] += 1
                if isinstance(b, torch.Tensor) and b.dim() == 1 and b.is_floating_point():
                    b.zero_()
            for pname, p in list(mod.named_parameters(recurse=False)):
                if not pname.endswith(SCALE_SUFFIX):
                    continue
                full = prefix + pname
                w = getattr(mod, pname[: -len(SCALE_SUFFIX)], None)
                if not isinstance(w, torch.Tensor) or w.dtype not in fp8:
                    out["skipped"][full] = "no FP8 weight next to it"
                    continue
                s = scale_for(w, gain)
                if s is None:
                    out["skipped"][full] = "all-zero FP8 weight"
                    continue
                p.fill_(s)
                out["fp8_scales"][full] = s
        w = getattr(getattr(model, "lm_head", None), "weight", None)
        if isinstance(w, torch.Tensor) and w.dim() == 2 and w.is_floating_point() and w.dtype not in fp8:
            c = scale_for(w, LOGIT_STD)  # LOGIT_STD / sqrt(K E[w^2]): 1 on a second call (idempotent)
            if c is not None:
                w.mul_(c)
                out["lm_head_factor"] = c
    return out


def summary_line(res: dict[str, Any]) -> str:
    sc = list(res["fp8_scales"].values())
    rng = f"{min(sc):.3g}..{max(sc):.3g}" if sc else "-"
    lm = res.get("lm_head_factor")
    return (f"realistic dummy weights: {res['norms']} norm weights set to 1, {len(sc)} FP8 block-scale tensors "
            f"set to unit gain (scales {rng}), {len(res['skipped'])} skipped, lm_head "
            + (f"x{lm:.4g} (logit std {LOGIT_STD:g})" if lm is not None else "unchanged"))
